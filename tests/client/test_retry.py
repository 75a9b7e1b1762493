"""Retry with backoff and the dead-letter queue, end to end: a PushConsumer against a real
NameServer and two real brokers on loopback, group configs set through the AsyncAdminClient.

- concurrent: RECONSUME_LATER is redelivered after the group's backoff with reconsume_times + 1;
  after retry_max_times it goes to %DLQ%<group> (read back with AsyncAdminClient.dlq_messages);
- orderly: the failing message is retried in place every orderly_retry_interval_s, up to
  max_reconsume_times, then dead-lettered, and the queue moves on in order.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orbitmq.client import (
    AsyncAdminClient,
    AsyncProducer,
    AsyncPushConsumer,
    ConsumedMessage,
    ConsumeResult,
    Message,
)
from orbitmq.client.consumer.config import PushConfig
from orbitmq.common.errors import ClientError, MessageIllegalError
from orbitmq.protocol.consumer import dlq_topic
from orbitmq.protocol.group_config import SubscriptionGroupConfig
from tests.client.test_e2e import RealCluster, start_cluster, stop_cluster
from tests.client.test_push_consumer import FAST, create_topic

pytestmark = pytest.mark.timeout(60)

SLACK_S = 0.06
"""Timer precision allowance (the timer promises < 100 ms when idle)."""


@pytest.fixture
async def real(tmp_path: Path) -> AsyncIterator[RealCluster]:
    c = await start_cluster(tmp_path)
    try:
        yield c
    finally:
        await stop_cluster(c)


@dataclass(frozen=True)
class Delivery:
    body: bytes
    reconsume_times: int
    at: float
    msg_id: str | None


class Log:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[Delivery] = []

    def add(self, msgs: list[ConsumedMessage]) -> None:
        now = time.monotonic()
        with self.lock:
            self.seen += [Delivery(m.body, m.reconsume_times, now, m.msg_id) for m in msgs]

    def of(self, body: bytes) -> list[Delivery]:
        with self.lock:
            return [d for d in self.seen if d.body == body]

    async def wait(self, pred: object, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not pred():  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; saw {self.seen}")
            await asyncio.sleep(0.02)


async def configure(addr: str, config: SubscriptionGroupConfig) -> None:
    async with AsyncAdminClient([addr]) as admin:
        assert await admin.update_group_config(config) == ["broker-a", "broker-b"]
        assert (await admin.get_group_config(config.group_name)) == config


async def test_reconsume_later_backs_off_then_dead_letters(real: RealCluster) -> None:
    group = "G-RB"
    await create_topic(real.addr, "RB", queues=1)
    await configure(
        real.addr,
        SubscriptionGroupConfig(group_name=group, retry_max_times=2, retry_delays_ms=[300, 600]),
    )
    log = Log()

    def listener(msgs: list[ConsumedMessage]) -> ConsumeResult:
        log.add(msgs)
        if msgs[0].body == b"doomed":
            if msgs[0].reconsume_times == 1:
                raise RuntimeError("still failing")  # an exception is RECONSUME_LATER too
            return ConsumeResult.RECONSUME_LATER
        return ConsumeResult.SUCCESS

    c = AsyncPushConsumer([real.addr], group, PushConfig(**FAST))
    c.subscribe("RB")
    c.register_listener(listener)
    await c.start()
    try:
        async with AsyncProducer([real.addr]) as p:
            await p.send(Message("RB", b"doomed", tags="x", keys=["k-doomed"]))
            await p.send(Message("RB", b"fine"))
        await log.wait(lambda: len(log.of(b"doomed")) >= 3 and c.dead_lettered == 1)
        tries = log.of(b"doomed")
        assert [d.reconsume_times for d in tries] == [0, 1, 2]
        assert tries[1].at - tries[0].at >= 0.3 - SLACK_S
        assert tries[2].at - tries[1].at >= 0.6 - SLACK_S
        assert len({d.msg_id for d in tries}) == 1  # one id across deliveries
        assert [d.reconsume_times for d in log.of(b"fine")] == [0]
        assert c.sent_back == 3
        await asyncio.sleep(1.0)
        assert len(log.of(b"doomed")) == 3  # no delivery after the DLQ
    finally:
        await c.close()

    async with AsyncAdminClient([real.addr]) as admin:
        [dead] = await admin.dlq_messages(group)
        assert dead.message.topic == dlq_topic(group) and dead.group == group
        assert dead.origin_topic == "RB" and dead.origin_msg_id == tries[0].msg_id
        assert dead.reconsume_times == 2 and dead.reason == "max_reconsume_times"
        again = dead.resend_message()
        assert again.topic == "RB" and again.body == b"doomed" and again.tags == "x"
        assert list(again.keys) == ["k-doomed"]
        assert "RETRY_TOPIC" not in again.properties
        assert "DLQ_ORIGIN_TOPIC" not in again.properties
        assert await admin.dlq_messages("G-NOTHING") == []


async def test_orderly_retries_in_place_then_dead_letters(real: RealCluster) -> None:
    group = "G-OB"
    [mq, *_] = await create_topic(real.addr, "OB", queues=1)
    log = Log()

    def listener(msgs: list[ConsumedMessage]) -> ConsumeResult:
        log.add(msgs)
        return ConsumeResult.RECONSUME_LATER if msgs[0].body == b"m1" else ConsumeResult.SUCCESS

    c = AsyncPushConsumer(
        [real.addr], group, PushConfig(orderly_retry_interval_s=0.25, max_reconsume_times=2, **FAST)
    )
    c.subscribe("OB")
    c.register_orderly_listener(listener)
    async with AsyncProducer([real.addr]) as p:
        for i in range(5):
            await p.send(Message("OB", f"m{i}".encode()), queue=mq)
    await c.start()
    try:
        await log.wait(lambda: len(log.of(b"m4")) == 1)
        with log.lock:
            order = [(d.body, d.reconsume_times) for d in log.seen]
        assert order == [
            (b"m0", 0), (b"m1", 0), (b"m1", 1), (b"m1", 2), (b"m2", 0), (b"m3", 0), (b"m4", 0)
        ]  # fmt: skip
        tries = log.of(b"m1")
        for before, after in itertools.pairwise(tries):
            assert after.at - before.at >= 0.25 - SLACK_S
        assert c.dead_lettered == 1
    finally:
        await c.close()
    async with AsyncAdminClient([real.addr]) as admin:
        [dead] = await admin.dlq_messages(group)
        assert dead.message.body == b"m1" and dead.origin_topic == "OB"
        assert dead.reason == "orderly" and dead.reconsume_times == 2


async def test_bad_settings_are_refused(real: RealCluster) -> None:
    async with AsyncAdminClient([real.addr]) as admin:
        bad = SubscriptionGroupConfig(group_name="G-BAD", retry_delays_ms=[-5])
        with pytest.raises(MessageIllegalError, match=r"retry_delays_ms\[0\]"):
            await admin.update_group_config(bad)
        with pytest.raises(ClientError):
            await admin.dlq_messages("G-BAD", max_messages=0)
    for options in ({"max_reconsume_times": -1}, {"orderly_retry_interval_s": -1.0}):
        with pytest.raises(ClientError):
            AsyncPushConsumer([real.addr], "G-BAD", PushConfig(**options))  # type: ignore[arg-type]

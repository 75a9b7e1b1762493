"""The first-consume rule end to end (issue #14): send 10 messages, then start a consumer with a
new group and the default CONSUME_FROM_LAST_OFFSET; push, lite-pull and simple (Pop) consumers
all receive the 10, as on RocketMQ 5. The client needs no change: the broker answers
QUERY_CONSUMER_OFFSET with 0, and a Pop group's first offset is 0."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from orbitmq.client import (
    AsyncLitePullConsumer,
    AsyncPushConsumer,
    AsyncSimpleConsumer,
    ConsumedMessage,
    ConsumeFromWhere,
    ConsumeResult,
    LitePullConfig,
    PushConfig,
    SimpleConfig,
)
from tests.client.test_e2e import RealCluster, start_cluster, stop_cluster
from tests.client.test_push_consumer import Collector, create_topic, send

pytestmark = pytest.mark.timeout(60)

LAST: dict[str, Any] = {
    "consume_from_where": ConsumeFromWhere.LAST_OFFSET,
    "heartbeat_interval_s": 1.0,
    "rebalance_interval_s": 1.0,
    "suspend_timeout_ms": 2000,
    "request_timeout_s": 2.0,
}
SENT = [f"m{i}".encode() for i in range(10)]


@pytest.fixture
async def real(tmp_path: Path) -> AsyncIterator[RealCluster]:
    c = await start_cluster(tmp_path)
    try:
        yield c
    finally:
        await stop_cluster(c)


async def test_new_push_group_gets_messages_sent_before(real: RealCluster) -> None:
    await create_topic(real.addr, "FC-Push")
    await send(real.addr, "FC-Push", SENT)
    got = Collector()

    def listener(msgs: list[ConsumedMessage]) -> ConsumeResult:
        got.add(msgs)
        return ConsumeResult.SUCCESS

    c = AsyncPushConsumer([real.addr], "G-FC-Push", PushConfig(**LAST))
    c.subscribe("FC-Push")
    c.register_listener(listener)
    await c.start()
    try:
        await got.wait_count(len(SENT))
        assert sorted(got.bodies()) == sorted(SENT)
    finally:
        await c.close()


async def test_new_lite_pull_group_gets_messages_sent_before(real: RealCluster) -> None:
    await create_topic(real.addr, "FC-Lite")
    await send(real.addr, "FC-Lite", SENT)
    c = AsyncLitePullConsumer([real.addr], "G-FC-Lite", LitePullConfig(**LAST))
    c.subscribe("FC-Lite")
    await c.start()
    try:
        out: list[ConsumedMessage] = []
        deadline = time.monotonic() + 15
        while len(out) < len(SENT) and time.monotonic() < deadline:
            out += await c.poll(0.2)
        assert sorted(m.body for m in out) == sorted(SENT)
    finally:
        await c.close()


async def test_new_simple_consumer_group_gets_messages_sent_before(real: RealCluster) -> None:
    await create_topic(real.addr, "FC-Pop")
    await send(real.addr, "FC-Pop", SENT)
    async with AsyncSimpleConsumer(
        [real.addr],
        "G-FC-Pop",
        SimpleConfig(await_duration_s=1.0),
        subscriptions={"FC-Pop": "*"},
    ) as c:
        got: list[bytes] = []
        deadline = time.monotonic() + 15
        while len(got) < len(SENT) and time.monotonic() < deadline:
            msgs = await c.receive(16, 30.0)
            got += [m.body for m in msgs]
            for m in msgs:
                await c.ack(m)
        assert sorted(got) == sorted(SENT)

"""RocketMQ 5 metric families for transactions, timers, Pop revive and the store's backlogs
(broker/service_metrics.py and the counters in broker/rocketmq_metrics.py): names, labels and
values after real commits, rollbacks, delayed messages and an unacked Pop."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np

from orbitmq.broker.controller import BrokerController
from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from orbitmq.store.timer_index import TIMER_DTYPE, TimerIndex
from tests.broker.conftest import broker_config
from tests.broker.test_pop import GROUP, ack, make_topic, pop, send
from tests.broker.test_timer import make_topic as timer_topic
from tests.broker.test_timer import send as timer_send
from tests.broker.test_transaction import end, prepare
from tests.broker.test_transaction import make_topic as tx_topic

BASE = {"cluster": "C1", "node_type": "broker", "node_id": "bk-1"}


def value(b: BrokerController, name: str, **labels: str) -> float | None:
    return b.metrics.registry.get_sample_value(name, {**BASE, **labels})


async def started(tmp_path: Path, **over: object) -> BrokerController:
    b = BrokerController(broker_config(tmp_path / "s", cluster="C1", broker_name="bk-1", **over))
    await b.start()
    return b


async def test_transaction_counters_half_gauge_and_finish_latency(
    tmp_path: Path, client: RemotingClient
) -> None:
    b = await started(tmp_path)
    try:
        tx_topic(b, "TX", queues=1)
        halves = [await prepare(client, b, "TX", f"h{i}".encode()) for i in range(3)]
        for resp, _ in halves:
            assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert value(b, "rocketmq_half_messages", topic="TX") == 3
        (r0, id0), (r1, id1), _ = halves
        assert (await end(client, b, r0, id0, "COMMIT")).code == ResponseCode.SUCCESS
        assert (await end(client, b, r1, id1, "ROLLBACK")).code == ResponseCode.SUCCESS
        assert value(b, "rocketmq_commit_messages_total", topic="TX") == 1
        assert value(b, "rocketmq_rollback_messages_total", topic="TX") == 1
        assert value(b, "rocketmq_half_messages", topic="TX") == 1
        assert value(b, "rocketmq_finish_message_latency_count", topic="TX") == 2
        assert value(b, "rocketmq_finish_message_latency_bucket", topic="TX", le="+Inf") == 2
        assert (value(b, "rocketmq_finish_message_latency_sum", topic="TX") or 0) >= 0
    finally:
        await b.stop()


async def test_timer_and_store_gauges(tmp_path: Path, client: RemotingClient) -> None:
    b = await started(tmp_path)
    try:
        timer_topic(b)
        resp = await timer_send(client, b, [{"TIMER_DELAY_MS": "60000"}] * 2)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        await asyncio.to_thread(b.store.wait_for_dispatch)
        deadline = time.monotonic() + 5
        while b.timer.stats()["timer_pending"] < 2:  # loaded into the index
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        assert value(b, "rocketmq_timer_enqueue_lag") == 0
        assert value(b, "rocketmq_timer_dequeue_lag") == 0  # not due for a minute
        assert value(b, "rocketmq_timer_dequeue_latency_milliseconds") == 0
        # A firing loop that fell behind: the earliest due time it saw is 5 s ago.
        b.timer.next_due_ms, b.timer.overdue = b.timer.clock.now_ms() - 5_000, 2
        assert (value(b, "rocketmq_timer_dequeue_latency_milliseconds") or 0) >= 5_000
        assert value(b, "rocketmq_timer_dequeue_lag") == 2
        labels = {"storage_type": "local"}
        assert value(b, "rocketmq_storage_flush_behind_bytes", **labels) is not None
        assert value(b, "rocketmq_storage_dispatch_behind_bytes", **labels) == 0
    finally:
        await b.stop()


def test_timer_index_counts_due_timers() -> None:
    index = TimerIndex()
    entries = np.zeros(5, dtype=TIMER_DTYPE)
    entries["due"] = [10, 20, 30, 40, 50]
    entries["qoff"] = [0, 1, 2, 3, 4]
    index.add(entries[:3])
    index.add(entries[3:])
    assert [index.count_due(t) for t in (5, 10, 35, 100)] == [0, 1, 3, 5]


async def test_pop_revive_counters_and_gauges(tmp_path: Path, client: RemotingClient) -> None:
    b = await started(tmp_path, pop_revive_interval_ms=3_600_000)  # revive held back
    try:
        make_topic(b, "P")
        await send(client, b, "P", [b"a", b"b"])
        _, msgs, handles = await pop(client, b, "P", invisible_time_ms=100)
        assert len(msgs) == 2
        ck = {"consumer_group": GROUP, "topic": "P", "revive_message_type": "CK"}
        assert value(b, "rocketmq_pop_revive_in_message_total", **ck, put_status="PUT_OK") == 1
        assert value(b, "rocketmq_pop_offset_buffer_size") == 2
        assert value(b, "rocketmq_pop_checkpoint_buffer_size") == 1
        assert (await ack(client, b, "P", handles[0])).code == 0  # an ACK record, by its CK
        acked = {**ck, "revive_message_type": "ACK", "put_status": "PUT_OK"}
        assert value(b, "rocketmq_pop_revive_in_message_total", **acked) == 1
        await asyncio.sleep(0.3)  # past its deadline, not revived yet
        assert value(b, "rocketmq_pop_revive_lag", queue_id="0") == 1
        assert (value(b, "rocketmq_pop_revive_latency_milliseconds", queue_id="0") or 0) >= 150
        await b.pop.reviver.revive_due()
        assert value(b, "rocketmq_pop_revive_out_message_total", **ck, queue_id="0") == 1
        assert value(b, "rocketmq_pop_revive_lag", queue_id="0") == 0
        assert value(b, "rocketmq_pop_checkpoint_buffer_size") == 0
    finally:
        await b.stop()

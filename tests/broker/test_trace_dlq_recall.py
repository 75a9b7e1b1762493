"""Trace records for dead-lettering and recall: a message moved to ``%DLQ%<group>`` (push
send-back, Pop revive) shows as a ``Pub`` into the DLQ topic with the group (labelled DLQ in
timelines), and a recalled delayed message as RocketMQ's ``Recall`` record, done or refused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from orbitmq.broker.controller import BrokerController
from orbitmq.common.codes import ResponseCode
from orbitmq.common.trace import (
    DLQ,
    PUB,
    RECALL,
    SUB_BEFORE,
    TraceRecord,
    decode_records,
    timeline,
    trace_details,
    trace_label,
)
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.consumer import dlq_topic
from orbitmq.protocol.frame import Frame
from tests.broker.conftest import broker_config
from tests.broker.test_broker import send_frame
from tests.broker.test_pop import make_topic, pop
from tests.broker.test_retry_dlq import send_back, set_config
from tests.broker.test_timer import send as timer_send
from tests.broker.test_trace import trace_of

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def traced(tmp_path: Path) -> AsyncIterator[BrokerController]:
    b = BrokerController(
        broker_config(
            tmp_path / "s",
            trace_enable=True,
            trace_flush_interval_ms=20,
            pop_revive_interval_ms=50,
        )
    )
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


def test_recall_and_dlq_records_round_trip() -> None:
    rec = TraceRecord(RECALL, ts=7, group="PG", topic="T", msg_id="ID9", success=False)
    assert rec.encode() == "Recall\x017\x01DefaultRegion\x01PG\x01T\x01ID9\x01false\x02"
    [back] = decode_records(rec.encode().encode())
    assert (back.type, back.ts, back.group, back.topic, back.msg_id, back.success) == (
        RECALL, 7, "PG", "T", "ID9", False,
    )  # fmt: skip
    assert trace_label(back) == RECALL and "recall failed" in trace_details(back)
    dead = TraceRecord(PUB, ts=8, group="G", topic="%DLQ%G", msg_id="ID9")
    assert trace_label(dead) == DLQ and "dead-lettered to %DLQ%G" in trace_details(dead)
    assert trace_label(TraceRecord(PUB, topic="T")) == PUB
    # On a tie, the DLQ move sorts after the deliveries that led to it.
    before = TraceRecord(SUB_BEFORE, ts=8, msg_id="ID9")
    assert [trace_label(r) for r in timeline([dead, before], "ID9")] == [SUB_BEFORE, DLQ]


async def test_send_back_to_the_dlq_is_traced(
    traced: BrokerController, client: RemotingClient
) -> None:
    b = traced
    resp = await client.invoke(b.address, send_frame("T", [b"bad"], KEYS="k-dlq", TAGS="tg"))
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    msg_id, phys = str(resp.fields["msg_ids"][0]), int(resp.fields["offset"])
    await asyncio.to_thread(b.store.wait_for_dispatch)
    back = await send_back(client, b, phys, group="GDead", max_reconsume_times=0)
    assert back.code == ResponseCode.SUCCESS and back.fields["dlq"] is True
    records = timeline(await trace_of(client, b, msg_id), msg_id)
    assert [trace_label(r) for r in records] == [PUB, DLQ]
    dead = records[1]
    assert dead.type == PUB and dead.topic == dlq_topic("GDead") and dead.group == "GDead"
    assert dead.keys == "k-dlq" and dead.tags == "tg" and dead.body_len == 3
    assert dead.store_host == b.address and len(dead.offset_msg_id) == 32


async def test_pop_revive_to_the_dlq_is_traced(
    traced: BrokerController, client: RemotingClient
) -> None:
    b = traced
    group = "GPopDead"
    assert (
        await set_config(client, b, group=group, retry_max_times=0)
    ).code == ResponseCode.SUCCESS
    make_topic(b, "PD")
    resp = await client.invoke(b.address, send_frame("PD", [b"pop-dead"], KEYS="k-pd"))
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    msg_id = str(resp.fields["msg_ids"][0])
    await asyncio.to_thread(b.store.wait_for_dispatch)
    _, [m], _ = await pop(client, b, "PD", invisible_time_ms=100, group=group)
    assert m.msg_id == msg_id  # not acked: revive dead-letters it (retry_max_times 0)
    records: list[TraceRecord] = []
    for _ in range(200):
        records = timeline(await trace_of(client, b, msg_id), msg_id)
        if DLQ in [trace_label(r) for r in records]:
            break
        await asyncio.sleep(0.05)
    assert [trace_label(r) for r in records] == [PUB, SUB_BEFORE, DLQ]
    assert records[2].group == group and records[2].topic == dlq_topic(group)
    assert records[2].keys == "k-pd"


async def test_recall_is_traced_done_and_refused(
    traced: BrokerController, client: RemotingClient
) -> None:
    b = traced
    make_topic(b, "TimerTopic")
    resp = await timer_send(
        client, b, [{"TIMER_DELAY_MS": "30000", "UNIQ_CLIENT_MESSAGE_ID_KEYIDX": "ID-RC"}],
        topic="TimerTopic",
    )  # fmt: skip
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    await asyncio.to_thread(b.store.wait_for_dispatch)

    async def recall() -> Frame:
        frame = Frame(
            RequestCode.RECALL_MESSAGE,
            fields={"topic": "TimerTopic", "msg_id": "ID-RC", "producer_group": "PGR"},
        )
        return await client.invoke(b.address, frame, 5.0)

    assert (await recall()).code == ResponseCode.SUCCESS
    assert (await recall()).code == ResponseCode.TIMER_MESSAGE_NOT_PENDING
    records = timeline(await trace_of(client, b, "ID-RC"), "ID-RC")
    recalls = [r for r in records if r.type == RECALL]
    assert [(r.group, r.topic, r.success) for r in recalls] == [
        ("PGR", "TimerTopic", True), ("PGR", "TimerTopic", False),
    ]  # fmt: skip
    assert records[0].type == PUB  # the delayed message's own Pub comes first

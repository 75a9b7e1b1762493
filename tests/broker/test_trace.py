"""Message trace (broker/trace.py, common/trace.py): a traced message sent and consumed shows
Pub -> SubBefore -> SubAfter with its group and times, found by a key query on
RMQ_SYS_TRACE_TOPIC; sampling by topic list and ratio; the record format round-trips."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from orbitmq.broker.controller import BrokerController
from orbitmq.broker.trace import MAX_KEYS_BYTES, _pack
from orbitmq.common.codes import ResponseCode
from orbitmq.common.trace import (
    END_TRANSACTION,
    PUB,
    SUB_AFTER,
    SUB_BEFORE,
    TRACE_TOPIC,
    TraceRecord,
    decode_records,
    timeline,
)
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.messages import decode_records as decode_messages
from tests.broker.conftest import broker_config
from tests.broker.test_broker import pull_frame, send_frame
from tests.broker.test_pop import GROUP, ack, change, make_topic, pop
from tests.broker.test_transaction import GROUP as TX_GROUP
from tests.broker.test_transaction import end, prepare
from tests.broker.test_transaction import make_topic as tx_make_topic


@pytest.fixture
async def traced(tmp_path: Path) -> AsyncIterator[BrokerController]:
    b = BrokerController(
        broker_config(tmp_path / "s", trace_enable=True, trace_flush_interval_ms=20)
    )
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


async def trace_of(client: RemotingClient, b: BrokerController, key: str) -> list[TraceRecord]:
    """Flush, then find the trace messages by ``key`` with an ordinary key query."""
    await b.trace.flush()
    await asyncio.to_thread(b.store.wait_for_dispatch)
    frame = Frame(
        RequestCode.QUERY_MESSAGE,
        fields={"topic": TRACE_TOPIC, "key": key, "max_num": 64, "begin_ts": 0,
                "end_ts": 2**62},
    )  # fmt: skip
    resp = await client.invoke(b.address, frame)
    if resp.code != ResponseCode.SUCCESS:
        return []
    return [r for m in decode_messages(resp.body) for r in decode_records(m.body)]


async def send_keyed(client: RemotingClient, b: BrokerController, topic: str, key: str) -> str:
    resp = await client.invoke(b.address, send_frame(topic, [b"hello"], KEYS=key, TAGS="tg"))
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    await asyncio.to_thread(b.store.wait_for_dispatch)
    return str(resp.fields["msg_ids"][0])


async def test_pull_consumer_trace_pub_subbefore_subafter(
    traced: BrokerController, client: RemotingClient
) -> None:
    b = traced
    msg_id = await send_keyed(client, b, "T", "order-1")
    resp = await client.invoke(b.address, pull_frame("T", 0, 0, group="G"))
    assert resp.code == ResponseCode.SUCCESS
    await asyncio.sleep(0.02)
    commit = Frame(
        RequestCode.UPDATE_CONSUMER_OFFSET,
        fields={"group": "G", "topic": "T", "queue_id": 0, "offset": 1},
    )
    assert (await client.invoke(b.address, commit)).code == ResponseCode.SUCCESS
    records = timeline(await trace_of(client, b, msg_id), msg_id)
    assert [r.type for r in records] == [PUB, SUB_BEFORE, SUB_AFTER]
    pub, before, after = records
    assert pub.topic == "T" and pub.keys == "order-1" and pub.tags == "tg" and pub.body_len == 5
    assert pub.store_host == b.address and len(pub.offset_msg_id) == 32 and pub.success
    assert before.group == after.group == "G"
    assert before.request_id == after.request_id and before.retry_times == 0
    assert pub.ts <= before.ts <= after.ts and after.cost_ms >= 15 and after.success
    # The trace is found by the message's own key too (KEYS = msg ids + their keys).
    assert {r.type for r in await trace_of(client, b, "order-1")} == {PUB, SUB_BEFORE, SUB_AFTER}


async def test_pop_consumer_trace_ack_and_nack(
    traced: BrokerController, client: RemotingClient
) -> None:
    b = traced
    make_topic(b, "P")
    msg_id = await send_keyed(client, b, "P", "k-pop")
    _, msgs, handles = await pop(client, b, "P")
    assert [m.msg_id for m in msgs] == [msg_id]
    r = await change(client, b, "P", handles[0], 60_000)  # a nack (or an extension)
    assert r.code == ResponseCode.SUCCESS, r.remark
    r = await ack(client, b, "P", r.fields["handle"])
    assert r.code == ResponseCode.SUCCESS, r.remark
    records = timeline(await trace_of(client, b, msg_id), msg_id)
    assert [r.type for r in records] == [PUB, SUB_BEFORE, SUB_AFTER, SUB_AFTER]
    assert {r.group for r in records[1:]} == {GROUP}
    assert [r.success for r in records[2:]] == [False, True]
    assert records[1].request_id == records[2].request_id == records[3].request_id


async def test_sampling_by_topic_list_and_ratio(tmp_path: Path, client: RemotingClient) -> None:
    b = BrokerController(broker_config(tmp_path / "s", trace_enable=True, trace_topics=("Only",)))
    await b.start()
    try:
        traced_id = await send_keyed(client, b, "Only", "a")
        other_id = await send_keyed(client, b, "Other", "b")
        assert [r.type for r in await trace_of(client, b, traced_id)] == [PUB]
        assert await trace_of(client, b, other_id) == []
        b.trace.threshold = 0  # ratio 0: (practically) nothing sampled
        none_id = await send_keyed(client, b, "Only", "c")
        assert await trace_of(client, b, none_id) == []
    finally:
        await b.stop()


async def test_trace_is_off_by_default(tmp_path: Path, client: RemotingClient) -> None:
    b = BrokerController(broker_config(tmp_path / "s"))
    await b.start()
    try:
        await send_keyed(client, b, "T", "k")
        await b.trace.flush()
        assert b.topics.get(TRACE_TOPIC) is None and b.trace.written == 0
    finally:
        await b.stop()


def test_records_round_trip_in_rocketmq_format() -> None:
    pub = TraceRecord(PUB, ts=5, group="PG", topic="T", msg_id="ID1", tags="a", keys="k1 k2",
                      store_host="1.2.3.4:10911", body_len=9, cost_ms=2, offset_msg_id="X")  # fmt: skip
    after = TraceRecord(SUB_AFTER, ts=9, group="G", msg_id="ID1", request_id="r", cost_ms=4,
                        success=False, keys="k1")  # fmt: skip
    text = pub.encode() + after.encode()
    assert text.count("\x02") == 2 and text.startswith(
        "Pub\x015\x01DefaultRegion\x01PG\x01T\x01ID1"
    )
    # SubAfter's field order: type, requestId, msgId, costTime, success, keys, contextCode, ts, group
    assert after.encode() == "SubAfter\x01r\x01ID1\x014\x01false\x01k1\x010\x019\x01G\x02"
    back = decode_records(text.encode())
    assert [(r.type, r.msg_id, r.ts, r.group) for r in back] == [
        (PUB, "ID1", 5, "PG"),
        (SUB_AFTER, "ID1", 9, "G"),
    ]
    assert back[0].keys == "k1 k2" and back[0].body_len == 9 and back[1].success is False
    # A separator inside a value never shifts the fields after it.
    odd = TraceRecord(PUB, msg_id="ID\x01x", keys="a\x02b")
    assert decode_records(odd.encode())[0].msg_id == "ID x"


def test_pack_bounds_body_and_keys() -> None:
    records = [TraceRecord(PUB, msg_id=f"{i:032d}", keys=f"key-{i}") for i in range(2000)]
    packed = _pack(records)
    assert len(packed) > 1
    assert sum(len(decode_records(body)) for body, _ in packed) == 2000
    for body, keys in packed:
        assert len(body) <= 128_000 and len(keys) <= MAX_KEYS_BYTES
        ids = {r.msg_id for r in decode_records(body)}
        assert ids <= set(keys.split(" "))


async def test_transaction_shows_end_transaction_then_consumption(
    traced: BrokerController, client: RemotingClient
) -> None:
    b = traced
    tx_make_topic(b, "TX", queues=1)
    resp, msg_id = await prepare(client, b, "TX", b"tx-body")
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    ok = await end(client, b, resp, msg_id, "COMMIT")
    assert ok.code == ResponseCode.SUCCESS, ok.remark
    await asyncio.to_thread(b.store.wait_for_dispatch)
    pulled = await client.invoke(b.address, pull_frame("TX", 0, 0, group="G"))
    assert pulled.code == ResponseCode.SUCCESS
    commit = Frame(
        RequestCode.UPDATE_CONSUMER_OFFSET,
        fields={"group": "G", "topic": "TX", "queue_id": 0, "offset": 1},
    )
    assert (await client.invoke(b.address, commit)).code == ResponseCode.SUCCESS
    records = timeline(await trace_of(client, b, msg_id), msg_id)
    assert [r.type for r in records] == [PUB, END_TRANSACTION, SUB_BEFORE, SUB_AFTER]
    pub, end_tx = records[0], records[1]
    assert pub.msg_type == 1 and pub.group == TX_GROUP  # Trans_Msg_Half, PGROUP
    assert end_tx.tx_state == "COMMIT_MESSAGE" and end_tx.group == TX_GROUP
    assert end_tx.topic == "TX" and not end_tx.from_check

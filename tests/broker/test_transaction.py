"""Transactional messages on one broker: half messages, decisions, check-back, restart, crash."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orbitmq.broker.controller import BrokerController
from orbitmq.broker.transaction.records import HALF_TOPIC, OP_TOPIC, Committed, Op
from orbitmq.broker.transaction.state import TxStatus
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import StoreClosedError
from orbitmq.common.message import (
    PROPERTY_UNIQ_KEY,
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_PREPARED,
    encode_properties,
)
from orbitmq.common.record import StoredMessage, decode
from orbitmq.net.client import RemotingClient
from orbitmq.net.connection import Connection, Reply
from orbitmq.protocol.bodies import TopicConfig, encode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.consumer import HeartbeatData
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.messages import decode_records, encode_send_body
from tests.broker.conftest import broker_config

GROUP = "PG_TX"
_ids = iter(range(1, 1 << 30))


def make_topic(
    b: BrokerController, topic: str, queues: int = 2, message_type: str = "NORMAL"
) -> None:
    b.topics.upsert(
        TopicConfig(
            topic_name=topic,
            read_queue_nums=queues,
            write_queue_nums=queues,
            message_type=message_type,
        )
    )


async def prepare(
    client: RemotingClient,
    b: BrokerController,
    topic: str,
    body: bytes = b"tx",
    *,
    queue_id: int = 0,
    group: str | None = GROUP,
    sys_flag: int = SYSFLAG_TRANSACTION_PREPARED,
    extra: dict[str, str] | None = None,
    count: int = 1,
) -> tuple[Frame, str]:
    """A prepared send; returns the answer and the message id."""
    msg_id = f"TXID{next(_ids):012d}"
    props = {PROPERTY_UNIQ_KEY: msg_id, "TRAN_MSG": "true", "k": "v"}
    if group is not None:
        props["PGROUP"] = group
    props.update(extra or {})
    code = RequestCode.SEND_MESSAGE if count == 1 else RequestCode.SEND_BATCH_MESSAGE
    frame = Frame(
        code,
        fields={"topic": topic, "queue_id": queue_id, "sys_flag": sys_flag, "flag": 7},
        body=encode_send_body([body] * count, [encode_properties(props)] * count),
    )
    return await client.invoke(b.address, frame), msg_id


def end_frame(
    offset: int, msg_id: str, state: str, *, group: str = GROUP, from_check: Any = False
) -> Frame:
    fields = {
        "producer_group": group,
        "tran_state": state,
        "commit_log_offset": offset,
        "msg_id": msg_id,
        "transaction_id": msg_id,
        "from_check": from_check,
    }
    return Frame(RequestCode.END_TRANSACTION, fields=fields)


async def end(
    client: RemotingClient, b: BrokerController, resp: Frame, msg_id: str, state: str, **kw: Any
) -> Frame:
    return await client.invoke(b.address, end_frame(resp.fields["offset"], msg_id, state, **kw))


async def visible(b: BrokerController, topic: str, queue_id: int = 0) -> list[StoredMessage]:
    await asyncio.to_thread(b.store.wait_for_dispatch)
    res = b.store.get_messages(topic, queue_id, 0, 1000)
    return [decode(v) for v in res.messages] if res.count else []


async def until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.02)


@pytest.fixture
async def tx_broker(tmp_path: Path) -> AsyncIterator[BrokerController]:
    b = BrokerController(
        broker_config(
            tmp_path / "s",
            transaction_timeout_ms=100,
            transaction_check_interval_ms=100,
            transaction_check_max=3,
        )
    )
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


# ------------------------------------------------------------------ decisions


async def test_commit_is_visible_once(broker: BrokerController, client: RemotingClient) -> None:
    make_topic(broker, "TX_C")
    resp, msg_id = await prepare(client, broker, "TX_C", b"hello", queue_id=1)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert resp.fields["queue_id"] == 1
    assert await visible(broker, "TX_C", 1) == []  # a half message is invisible
    halves = await visible(broker, HALF_TOPIC)
    assert len(halves) == 1 and halves[0].properties["REAL_TOPIC"] == "TX_C"
    assert halves[0].properties["REAL_QID"] == "1"
    assert halves[0].physical_offset == resp.fields["offset"]

    ok = await end(client, broker, resp, msg_id, "COMMIT")
    assert ok.code == ResponseCode.SUCCESS, ok.remark
    [msg] = await visible(broker, "TX_C", 1)
    assert msg.body == b"hello" and msg.msg_id == msg_id and msg.flag == 7
    assert msg.sys_flag & 0xC == SYSFLAG_TRANSACTION_COMMIT
    assert msg.prepared_transaction_offset == resp.fields["offset"]
    assert msg.properties["PGROUP"] == GROUP and msg.properties["k"] == "v"
    assert not {"TRAN_MSG", "REAL_TOPIC", "REAL_QID"} & set(msg.properties)

    # The same decision again (a retry, or a check answer crossing it): applied once.
    again = await end(client, broker, resp, msg_id, "COMMIT", from_check=True)
    assert again.code == ResponseCode.SUCCESS, again.remark
    conflict = await end(client, broker, resp, msg_id, "ROLLBACK")
    assert conflict.code == ResponseCode.TRANSACTION_STATE_CONFLICT
    assert len(await visible(broker, "TX_C", 1)) == 1


async def test_concurrent_duplicate_commits_apply_once(
    broker: BrokerController, client: RemotingClient
) -> None:
    make_topic(broker, "TX_D")
    sent = [await prepare(client, broker, "TX_D", f"m{i}".encode()) for i in range(5)]
    answers = await asyncio.gather(
        *(end(client, broker, r, m, "COMMIT") for r, m in sent for _ in range(4))
    )
    assert {a.code for a in answers} == {ResponseCode.SUCCESS}
    got = await visible(broker, "TX_D")
    assert sorted(m.body for m in got) == [f"m{i}".encode() for i in range(5)]


async def test_rollback_is_never_visible(broker: BrokerController, client: RemotingClient) -> None:
    make_topic(broker, "TX_R")
    resp, msg_id = await prepare(client, broker, "TX_R")
    assert (await end(client, broker, resp, msg_id, "ROLLBACK")).code == ResponseCode.SUCCESS
    assert (await end(client, broker, resp, msg_id, "ROLLBACK")).code == ResponseCode.SUCCESS
    late = await end(client, broker, resp, msg_id, "COMMIT")
    assert late.code == ResponseCode.TRANSACTION_STATE_CONFLICT, late.remark
    assert "rolled back" in late.remark
    assert await visible(broker, "TX_R") == []
    assert len(await visible(broker, OP_TOPIC)) == 1


async def test_unknown_and_bad_decisions(broker: BrokerController, client: RemotingClient) -> None:
    make_topic(broker, "TX_B")
    resp, msg_id = await prepare(client, broker, "TX_B")
    offset = resp.fields["offset"]
    unknown = await end(client, broker, resp, msg_id, "UNKNOWN")
    assert unknown.code == ResponseCode.SUCCESS and unknown.fields["state"] == "PENDING"
    cases: list[tuple[Frame, int]] = [
        (end_frame(offset + 1, msg_id, "COMMIT"), ResponseCode.TRANSACTION_NOT_FOUND),
        (end_frame(10**12, msg_id, "COMMIT"), ResponseCode.TRANSACTION_NOT_FOUND),
        (end_frame(offset, "OTHER", "COMMIT"), ResponseCode.TRANSACTION_NOT_FOUND),
        (end_frame(offset, msg_id, "COMMIT", group="PG_OTHER"), ResponseCode.TRANSACTION_NOT_FOUND),
        (end_frame(offset, msg_id, "MAYBE"), ResponseCode.MESSAGE_ILLEGAL),
        (end_frame(offset, msg_id, "COMMIT", from_check="yes"), ResponseCode.MESSAGE_ILLEGAL),
        (end_frame(-1, msg_id, "COMMIT"), ResponseCode.MESSAGE_ILLEGAL),
        (Frame(RequestCode.END_TRANSACTION, fields={"tran_state": "COMMIT"}), ResponseCode.MESSAGE_ILLEGAL),
    ]  # fmt: skip
    for frame, code in cases:
        answer = await client.invoke(broker.address, frame)
        assert answer.code == code, (frame.fields, answer.remark)
    # A normal message's offset is no transaction either.
    normal = Frame(
        RequestCode.SEND_MESSAGE,
        fields={"topic": "TX_B", "queue_id": 0},
        body=encode_send_body([b"n"], [encode_properties({PROPERTY_UNIQ_KEY: "N1"})]),
    )
    sent = await client.invoke(broker.address, normal)
    bad = await client.invoke(broker.address, end_frame(sent.fields["offset"], "N1", "COMMIT"))
    assert bad.code == ResponseCode.TRANSACTION_NOT_FOUND
    # After all that, the transaction is still pending and commits normally.
    assert (await end(client, broker, resp, msg_id, "COMMIT")).code == ResponseCode.SUCCESS
    assert [m.body for m in await visible(broker, "TX_B")] == [b"n", b"tx"]


async def test_prepared_send_rules(tmp_path: Path, client: RemotingClient) -> None:
    b = BrokerController(broker_config(tmp_path / "s", enforce_topic_message_type=True))
    await b.start()
    try:
        make_topic(b, "TX_N")
        make_topic(b, "TX_T", message_type="TRANSACTION")
        resp, _ = await prepare(client, b, "TX_N")
        assert resp.code == ResponseCode.TRANSACTION_TYPE_MISMATCH, resp.remark
        assert "TRANSACTION" in resp.remark
        resp, _ = await prepare(client, b, "TX_T", count=2)
        assert resp.code == ResponseCode.MESSAGE_ILLEGAL and "batch" in resp.remark
        resp, _ = await prepare(client, b, "TX_T", group=None)
        assert resp.code == ResponseCode.MESSAGE_ILLEGAL and "PGROUP" in resp.remark
        resp, _ = await prepare(client, b, HALF_TOPIC)
        assert resp.code == ResponseCode.NO_PERMISSION
        # TRAN_MSG=true without the sys_flag bit is a prepared send too (RocketMQ's test).
        resp, msg_id = await prepare(client, b, "TX_T", sys_flag=0)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert await visible(b, "TX_T") == []
        assert (await end(client, b, resp, msg_id, "COMMIT")).code == ResponseCode.SUCCESS
        assert len(await visible(b, "TX_T")) == 1
    finally:
        await b.stop()


# ------------------------------------------------------------------ check-back


class FakeProducer:
    """A producer connection that heartbeats GROUP and answers check-backs with ``answer``."""

    def __init__(self, answer: str | None) -> None:
        self.answer = answer
        self.checks: list[Frame] = []
        self.client = RemotingClient(handler=self.handle)

    async def handle(self, frame: Frame, conn: Connection) -> Reply:
        assert frame.code == RequestCode.CHECK_TRANSACTION_STATE
        self.checks.append(frame)
        if self.answer is not None:
            f = frame.fields
            reply = end_frame(f["commit_log_offset"], f["msg_id"], self.answer, from_check=True)
            asyncio.get_running_loop().create_task(conn.request(reply, 3.0))
        return None

    async def beat(self, b: BrokerController, group: str = GROUP) -> None:
        body = encode_body(HeartbeatData(client_id="fake-producer", producer_groups=[group]))
        resp = await self.client.invoke(b.address, Frame(RequestCode.HEART_BEAT, body=body))
        assert resp.code == ResponseCode.SUCCESS, resp.remark


async def test_unknown_then_check_back_commits(
    tx_broker: BrokerController, client: RemotingClient
) -> None:
    b = tx_broker
    make_topic(b, "TX_K")
    producer = FakeProducer("COMMIT")
    try:
        await producer.beat(b)
        resp, msg_id = await prepare(client, b, "TX_K", b"later", queue_id=1)
        assert (await end(client, b, resp, msg_id, "UNKNOWN")).code == ResponseCode.SUCCESS
        await until(lambda: len(producer.checks) >= 1)
        check = producer.checks[0]
        assert check.fields["msg_id"] == msg_id and check.fields["topic"] == "TX_K"
        assert check.fields["queue_id"] == 1 and check.fields["check_times"] == 1
        [record] = decode_records(bytes(check.body))
        assert record.body == b"later" and record.properties["REAL_TOPIC"] == "TX_K"
        await until(lambda: b.transactions.state.by_q.get(0) is None
                    or b.transactions.state.by_q[0].status is TxStatus.COMMITTED)  # fmt: skip
        assert [m.body for m in await visible(b, "TX_K", 1)] == [b"later"]
        # A slow answer (a loaded machine) can be overtaken by one more check of the same half.
        asked = len(producer.checks)
        assert {c.fields["msg_id"] for c in producer.checks} == {msg_id}
        await asyncio.sleep(0.3)  # more passes: no more checks, no second copy
        assert len(producer.checks) == asked
        assert len(await visible(b, "TX_K", 1)) == 1
    finally:
        await producer.client.close()


async def test_check_max_discards(tx_broker: BrokerController, client: RemotingClient) -> None:
    b = tx_broker
    make_topic(b, "TX_M")
    producer = FakeProducer("UNKNOWN")
    try:
        await producer.beat(b)
        resp, msg_id = await prepare(client, b, "TX_M")
        # A group nobody produces for: no check is sent, none is counted.
        orphan, orphan_id = await prepare(client, b, "TX_M", group="PG_NOBODY")
        await until(lambda: b.transactions.discarded == 1)
        assert len(producer.checks) == 3  # transaction_check_max
        assert [c.fields["check_times"] for c in producer.checks] == [1, 2, 3]
        late = await end(client, b, resp, msg_id, "COMMIT")
        assert late.code == ResponseCode.TRANSACTION_STATE_CONFLICT
        assert "discarded" in late.remark
        assert await visible(b, "TX_M") == []
        half = b.transactions.state.by_phys[orphan.fields["offset"]]
        assert half.status is TxStatus.PENDING and half.checks == 0
        ok = await end(client, b, orphan, orphan_id, "ROLLBACK", group="PG_NOBODY")
        assert ok.code == ResponseCode.SUCCESS
    finally:
        await producer.client.close()


async def test_immunity_property_delays_the_first_check(
    tx_broker: BrokerController, client: RemotingClient
) -> None:
    b = tx_broker
    make_topic(b, "TX_I")
    producer = FakeProducer(None)
    try:
        await producer.beat(b)
        await prepare(client, b, "TX_I", extra={"CHECK_IMMUNITY_TIME_IN_SECONDS": "60"})
        await asyncio.sleep(0.4)
        assert producer.checks == []
    finally:
        await producer.client.close()


# ------------------------------------------------------------------ restart and crash


async def test_restart_replays_pending_and_decided(tmp_path: Path, client: RemotingClient) -> None:
    config = broker_config(
        tmp_path / "s", transaction_timeout_ms=100, transaction_check_interval_ms=100
    )
    b = BrokerController(config)
    await b.start()
    try:
        make_topic(b, "TX_S")
        pending, pending_id = await prepare(client, b, "TX_S", b"p")
        committed, committed_id = await prepare(client, b, "TX_S", b"c")
        rolled, rolled_id = await prepare(client, b, "TX_S", b"r")
        assert (await end(client, b, committed, committed_id, "COMMIT")).code == 0
        assert (await end(client, b, rolled, rolled_id, "ROLLBACK")).code == 0
    finally:
        await b.stop()
    saved = json.loads((tmp_path / "s" / "config" / "transaction.json").read_text())
    assert saved["half_offset"] == 0  # the first half message is still pending

    b = BrokerController(config)
    await b.start()
    producer = FakeProducer("COMMIT")
    try:
        state = b.transactions.state
        assert state.by_phys[pending.fields["offset"]].status is TxStatus.PENDING
        assert state.by_phys[committed.fields["offset"]].status is TxStatus.COMMITTED
        # Decisions made before the restart still hold.
        again = await end(client, b, committed, committed_id, "COMMIT")
        assert again.code == ResponseCode.SUCCESS
        conflict = await end(client, b, rolled, rolled_id, "COMMIT")
        assert conflict.code == ResponseCode.TRANSACTION_STATE_CONFLICT
        await producer.beat(b)
        await until(lambda: not state.by_q or state.floor_q == 3)
        assert sorted(m.body for m in await visible(b, "TX_S")) == [b"c", b"p"]
        assert len(producer.checks) == 1 and producer.checks[0].fields["msg_id"] == pending_id
    finally:
        await producer.client.close()
        await b.stop()
    # All decided: the next start replays nothing, and a late duplicate is still answered.
    saved = json.loads((tmp_path / "s" / "config" / "transaction.json").read_text())
    assert saved["half_offset"] == 3
    b = BrokerController(config)
    await b.start()
    try:
        assert not b.transactions.state.by_q
        late = await end(client, b, committed, committed_id, "COMMIT")
        assert late.code == ResponseCode.SUCCESS, late.remark
        assert len(await visible(b, "TX_S")) == 2
    finally:
        await b.stop()


CrashPoint = Callable[[list[Op]], Awaitable[None]]


@pytest.mark.parametrize("where", ["after_begin", "after_copy"])
async def test_crash_inside_a_commit_applies_it_once(
    tmp_path: Path, client: RemotingClient, where: str
) -> None:
    """SIGKILL-like crash between the commit's appends: the restart finishes the commit, the
    message is in the real topic exactly once, and a repeated COMMIT changes nothing."""
    config = broker_config(tmp_path / "s")
    b = BrokerController(config)
    await b.start()
    try:
        make_topic(b, "TX_X")
        done, done_id = await prepare(client, b, "TX_X", b"before")
        assert (await end(client, b, done, done_id, "COMMIT")).code == 0
        resp, msg_id = await prepare(client, b, "TX_X", b"cut")
        service = b.transactions
        real_append = service.append_ops
        real_put = b.bridge.put

        async def crash() -> None:
            await asyncio.to_thread(b.store.wait_for_dispatch)
            b.store.crash_for_test()
            raise StoreClosedError("crashed (test)")

        async def append_ops(ops: list[Op], halves: list[Any]) -> int:
            if where == "after_copy" and isinstance(ops[0], Committed):
                await crash()
            return await real_append(ops, halves)

        async def put(batch: Any) -> Any:
            if where == "after_begin" and batch.topic == "TX_X":
                await crash()
            return await real_put(batch)

        service.append_ops = append_ops  # type: ignore[method-assign]
        b.bridge.put = put  # type: ignore[method-assign]
        cut = await end(client, b, resp, msg_id, "COMMIT")
        assert cut.code == ResponseCode.STORE_CLOSED
    finally:
        await b.stop()

    b = BrokerController(config)
    await b.start()
    try:
        assert b.transactions.state.by_q == {}  # the cut commit was finished at start
        bodies = [m.body for m in await visible(b, "TX_X")]
        assert bodies == [b"before", b"cut"]
        again = await end(client, b, resp, msg_id, "COMMIT")
        assert again.code == ResponseCode.SUCCESS, again.remark
        assert len(await visible(b, "TX_X")) == 2
    finally:
        await b.stop()


async def test_crash_with_pending_half_messages(tmp_path: Path, client: RemotingClient) -> None:
    config = broker_config(
        tmp_path / "s", transaction_timeout_ms=100, transaction_check_interval_ms=100
    )
    b = BrokerController(config)
    await b.start()
    try:
        make_topic(b, "TX_P")
        sent = [await prepare(client, b, "TX_P", f"p{i}".encode()) for i in range(4)]
        assert (await end(client, b, *sent[1], "ROLLBACK")).code == 0
        await asyncio.to_thread(b.store.wait_for_dispatch)
        b.store.crash_for_test()
    finally:
        await b.stop()
    saved = json.loads((tmp_path / "s" / "config" / "transaction.json").read_text())
    assert saved["half_offset"] == 0  # written while they were pending

    b = BrokerController(config)
    await b.start()
    producer = FakeProducer("COMMIT")
    try:
        await producer.beat(b)
        await until(lambda: b.transactions.state.pending() == 0)
        assert sorted(m.body for m in await visible(b, "TX_P")) == [b"p0", b"p2", b"p3"]
        assert sorted(c.fields["msg_id"] for c in producer.checks) == sorted(
            sent[i][1] for i in (0, 2, 3)
        )
    finally:
        await producer.client.close()
        await b.stop()


_field_values = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=20),
    st.binary(max_size=8), st.lists(st.integers(-1000, 1000), max_size=3),
)  # fmt: skip


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    fields=st.dictionaries(
        st.sampled_from(
            ["producer_group", "tran_state", "commit_log_offset", "msg_id", "from_check", "x"]
        ),
        _field_values,
    )
)
async def test_malformed_end_transaction_gets_a_clear_code(
    broker: BrokerController, client: RemotingClient, fields: dict[str, Any]
) -> None:
    answer = await client.invoke(broker.address, Frame(RequestCode.END_TRANSACTION, fields=fields))
    assert answer.code in (
        ResponseCode.MESSAGE_ILLEGAL,
        ResponseCode.TRANSACTION_NOT_FOUND,
    ), (fields, answer.code, answer.remark)

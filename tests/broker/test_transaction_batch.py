"""Transactional batches on one broker: one half record for n messages, committed or rolled
back as a unit, exactly once across duplicates, restarts and crashes inside the commit."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orbitmq.broker.controller import BrokerController
from orbitmq.broker.transaction.records import HALF_TOPIC, OP_TOPIC, Committed, Op, decode_ops
from orbitmq.broker.transaction.state import TxStatus
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import StoreClosedError
from orbitmq.common.message import (
    PROPERTY_UNIQ_KEY,
    SYSFLAG_COMPRESSED,
    SYSFLAG_COMPRESSION_ZSTD,
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_PREPARED,
    MessageBatch,
    encode_properties,
)
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.messages import decode_records, decode_send_body, encode_send_body
from tests.broker.conftest import broker_config
from tests.broker.test_transaction import (
    GROUP,
    FakeProducer,
    end,
    make_topic,
    prepare,
    until,
    visible,
)

_ids = iter(range(1, 1 << 30))


def packed(
    n: int, tag: str = "m", *, extra: dict[str, str] | None = None
) -> tuple[bytes, list[str]]:
    """A packed body of n messages with their own ids and properties; returns it and the ids."""
    ids = [f"INNER{next(_ids):012d}" for _ in range(n)]
    props = [
        encode_properties({PROPERTY_UNIQ_KEY: i, "TAGS": tag, "seq": str(k), **(extra or {})})
        for k, i in enumerate(ids)
    ]
    return encode_send_body([f"{tag}{k}".encode() for k in range(n)], props), ids


async def prepare_batch(
    client: RemotingClient,
    b: BrokerController,
    topic: str,
    n: int = 5,
    *,
    tag: str = "m",
    queue_id: int = 0,
    body: bytes | None = None,
    count: str | None = None,
    extra: dict[str, str] | None = None,
    sys_flag: int = SYSFLAG_TRANSACTION_PREPARED,
    code: int = RequestCode.SEND_MESSAGE,
    tx_id: str | None = None,
) -> tuple[Frame, str, list[str]]:
    """A prepared half batch as the client sends it: one message, TRAN_BATCH=n, packed body."""
    inner, ids = packed(n, tag)
    tx_id = tx_id or f"TXB{next(_ids):012d}"
    props = {
        PROPERTY_UNIQ_KEY: tx_id,
        "TRAN_MSG": "true",
        "PGROUP": GROUP,
        "TRAN_BATCH": count if count is not None else str(n),
        "SPARK_BATCH": "17",
        **(extra or {}),
    }
    frame = Frame(
        code,
        fields={"topic": topic, "queue_id": queue_id, "sys_flag": sys_flag, "flag": 3},
        body=encode_send_body([inner if body is None else body], [encode_properties(props)]),
    )
    return await client.invoke(b.address, frame), tx_id, ids


async def ops_of(b: BrokerController) -> list[Op]:
    return [op for m in await visible(b, OP_TOPIC) for op in decode_ops(m.body)]


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


async def test_batch_commit_is_visible_in_order_once(
    broker: BrokerController, client: RemotingClient
) -> None:
    make_topic(broker, "TXB_C")
    resp, tx_id, ids = await prepare_batch(client, broker, "TXB_C", 20, queue_id=1)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert await visible(broker, "TXB_C", 1) == []
    [half] = await visible(broker, HALF_TOPIC)  # ONE half record for the batch
    assert half.physical_offset == resp.fields["offset"] and half.msg_id == tx_id
    assert half.properties["TRAN_BATCH"] == "20" and half.properties["SPARK_BATCH"] == "17"
    assert len(decode_send_body(half.body).bodies) == 20
    assert broker.transactions.state.by_phys[half.physical_offset].batch_size == 20

    answers = await asyncio.gather(
        *(end(client, broker, resp, tx_id, "COMMIT") for _ in range(3))
    )  # duplicates at once: applied once
    assert {a.code for a in answers} == {ResponseCode.SUCCESS}
    got = await visible(broker, "TXB_C", 1)
    assert [m.body for m in got] == [f"m{k}".encode() for k in range(20)]
    assert [m.msg_id for m in got] == ids
    assert [m.queue_offset for m in got] == list(range(20))
    for k, m in enumerate(got):
        assert m.prepared_transaction_offset == resp.fields["offset"]
        assert m.sys_flag & 0xC == SYSFLAG_TRANSACTION_COMMIT and m.flag == 3
        assert m.properties["seq"] == str(k) and m.tags == "m"
        assert not {"TRAN_MSG", "TRAN_BATCH", "REAL_TOPIC", "SPARK_BATCH", "PGROUP"} & set(
            m.properties
        )
    assert [type(op).__name__ for op in await ops_of(broker)] == ["CommitBegin", "Committed"]
    again = await end(client, broker, resp, tx_id, "COMMIT", from_check=True)
    assert again.code == ResponseCode.SUCCESS and again.fields["state"] == "COMMITTED"
    conflict = await end(client, broker, resp, tx_id, "ROLLBACK")
    assert conflict.code == ResponseCode.TRANSACTION_STATE_CONFLICT
    assert len(await visible(broker, "TXB_C", 1)) == 20


async def test_batch_rollback_and_mixed_with_single_halves(
    broker: BrokerController, client: RemotingClient
) -> None:
    make_topic(broker, "TXB_M", queues=1)
    rb, rb_id, _ = await prepare_batch(client, broker, "TXB_M", 4, tag="r")
    single, single_id = await prepare(client, broker, "TXB_M", b"single")
    cb, cb_id, cb_ids = await prepare_batch(client, broker, "TXB_M", 3, tag="c")
    assert (await end(client, broker, rb, rb_id, "ROLLBACK")).code == ResponseCode.SUCCESS
    assert (await end(client, broker, rb, rb_id, "ROLLBACK")).code == ResponseCode.SUCCESS
    late = await end(client, broker, rb, rb_id, "COMMIT")
    assert late.code == ResponseCode.TRANSACTION_STATE_CONFLICT
    assert (await end(client, broker, cb, cb_id, "COMMIT")).code == ResponseCode.SUCCESS
    assert (await end(client, broker, single, single_id, "COMMIT")).code == ResponseCode.SUCCESS
    got = await visible(broker, "TXB_M")
    assert [m.body for m in got] == [b"c0", b"c1", b"c2", b"single"]
    assert [m.msg_id for m in got[:3]] == cb_ids
    assert broker.transactions.state.pending() == 0


async def test_a_repeated_prepared_send_gets_the_first_half(
    broker: BrokerController, client: RemotingClient
) -> None:
    """A producer's retry after a lost answer (same transaction id, same queue) is answered
    with the half already stored, at once or later: one half, so one commit."""
    make_topic(broker, "TXB_R", queues=2)
    tries = await asyncio.gather(
        *(prepare_batch(client, broker, "TXB_R", 4, tx_id="TXB_SAME") for _ in range(3))
    )
    later, _, _ = await prepare_batch(client, broker, "TXB_R", 4, tx_id="TXB_SAME")
    offsets = {t[0].fields["offset"] for t in tries} | {later.fields["offset"]}
    assert len(offsets) == 1 and len(await visible(broker, HALF_TOPIC)) == 1
    # Another real queue is another half (not a retry of this one).
    other, _, _ = await prepare_batch(client, broker, "TXB_R", 4, tx_id="TXB_SAME", queue_id=1)
    assert other.fields["offset"] not in offsets
    assert (await end(client, broker, later, "TXB_SAME", "COMMIT")).code == ResponseCode.SUCCESS
    assert len(await visible(broker, "TXB_R", 0)) == 4
    # Single half messages with one id (a reused Message object) are each stored.
    extra = {PROPERTY_UNIQ_KEY: "TX_REUSED"}
    one, _ = await prepare(client, broker, "TXB_R", b"a", extra=extra)
    two, _ = await prepare(client, broker, "TXB_R", b"b", extra=extra)
    assert one.fields["offset"] != two.fields["offset"]


async def test_batch_check_back_gets_the_half_with_its_count(
    tx_broker: BrokerController, client: RemotingClient
) -> None:
    b = tx_broker
    make_topic(b, "TXB_K")
    producer = FakeProducer("COMMIT")
    try:
        await producer.beat(b)
        _, tx_id, ids = await prepare_batch(client, b, "TXB_K", 6, queue_id=1)
        await until(lambda: len(producer.checks) >= 1)
        check = producer.checks[0]
        assert check.fields["msg_id"] == tx_id and check.fields["batch_count"] == 6
        assert check.fields["topic"] == "TXB_K" and check.fields["queue_id"] == 1
        [record] = decode_records(bytes(check.body))
        assert record.properties["TRAN_BATCH"] == "6" and record.properties["SPARK_BATCH"] == "17"
        await until(lambda: b.transactions.state.pending() == 0)
        got = await visible(b, "TXB_K", 1)
        assert [m.msg_id for m in got] == ids
        asked = len(producer.checks)  # more than 1 if a slow answer was overtaken by a check
        assert {c.fields["msg_id"] for c in producer.checks} == {tx_id}
        await asyncio.sleep(0.3)  # further passes: no second copy, no further checks
        assert len(producer.checks) == asked and len(await visible(b, "TXB_K", 1)) == 6
    finally:
        await producer.client.close()


async def test_a_check_pass_reads_a_bounded_number_of_bytes(
    broker: BrokerController, client: RemotingClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A check-back carries its half record; a pass stops at MAX_CHECK_BYTES_PER_PASS (always
    one at least) and leaves the rest for the next pass."""
    from orbitmq.broker.transaction import service

    make_topic(broker, "TXB_P")
    producer = FakeProducer(None)
    try:
        await producer.beat(broker)
        for _ in range(3):
            resp, _, _ = await prepare_batch(client, broker, "TXB_P", 50)
            assert resp.code == ResponseCode.SUCCESS
        size = broker.transactions.state.by_phys[resp.fields["offset"]].size
        assert size > 50 * 2
        monkeypatch.setattr(service, "MAX_CHECK_BYTES_PER_PASS", 2 * size)
        later = 10**15  # every half is old enough
        assert await broker.transactions.check_once(later) == 2
        assert await broker.transactions.check_once(later) == 2  # the third, then the first again
        monkeypatch.setattr(service, "MAX_CHECK_BYTES_PER_PASS", 1)
        assert await broker.transactions.check_once(later) == 1
    finally:
        await producer.client.close()


async def test_bad_batches_are_refused_and_the_broker_stays_up(
    tmp_path: Path, client: RemotingClient
) -> None:
    b = BrokerController(broker_config(tmp_path / "s", enforce_topic_message_type=True))
    await b.start()
    try:
        make_topic(b, "TXB_N")
        make_topic(b, "TXB_T", message_type="TRANSACTION")
        resp, _, _ = await prepare_batch(client, b, "TXB_N")
        assert resp.code == ResponseCode.TRANSACTION_TYPE_MISMATCH, resp.remark
        inner, _ = packed(3)
        one_empty = encode_send_body([b"a", b"", b"c"], [b"", b"", b""])
        reserved, _ = packed(2, extra={"TRAN_MSG": "true"})
        reserved2, _ = packed(2, extra={"REAL_TOPIC": "X"})
        fine_name, _ = packed(2, extra={"XTRAN_MSG": "ok"})  # only looks like a reserved name
        huge = encode_send_body([b"x" * (600 * 1024)] * 2, [b"", b""])  # > max_message_size 1 MiB
        zstd = SYSFLAG_TRANSACTION_PREPARED | SYSFLAG_COMPRESSED | SYSFLAG_COMPRESSION_ZSTD
        cases: list[tuple[dict[str, Any], str]] = [
            ({"count": "0"}, "TRAN_BATCH"),
            ({"count": "-2"}, "TRAN_BATCH"),
            ({"count": "many"}, "TRAN_BATCH"),
            ({"n": 3, "count": "4"}, "packs 3"),
            ({"body": b"\x00\x00\x00\x09garbage"}, "body"),
            ({"body": b""}, "body"),
            ({"body": one_empty, "count": "3"}, "empty"),
            ({"body": reserved, "count": "2"}, "TRAN_MSG"),
            ({"body": reserved2, "count": "2"}, "REAL_TOPIC"),
            ({"body": huge, "count": "2"}, "bytes"),
            ({"sys_flag": zstd}, "uncompressed"),
        ]
        for kwargs, needle in cases:
            resp, _, _ = await prepare_batch(client, b, "TXB_T", **kwargs)
            assert resp.code == ResponseCode.MESSAGE_ILLEGAL, (kwargs.keys(), resp.remark)
            assert needle in resp.remark, (needle, resp.remark)
        # Many bodies in one prepared send: still refused, pointing at the batch form.
        frame = Frame(
            RequestCode.SEND_BATCH_MESSAGE,
            fields={"topic": "TXB_T", "queue_id": 0, "sys_flag": SYSFLAG_TRANSACTION_PREPARED},
            body=inner,
        )
        resp = await client.invoke(b.address, frame)
        assert resp.code == ResponseCode.MESSAGE_ILLEGAL and "TRAN_BATCH" in resp.remark
        assert await visible(b, HALF_TOPIC) == []
        # Still serving: a good batch (with a name that only contains a reserved one) commits.
        resp, tx_id, _ = await prepare_batch(client, b, "TXB_T", body=fine_name, count="2")
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert (await end(client, b, resp, tx_id, "COMMIT")).code == ResponseCode.SUCCESS
        assert [m.properties["XTRAN_MSG"] for m in await visible(b, "TXB_T")] == ["ok", "ok"]
    finally:
        await b.stop()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    body=st.one_of(
        st.binary(max_size=64),
        st.lists(st.binary(max_size=8), min_size=1, max_size=4).map(
            lambda bodies: encode_send_body(bodies, [b"k\x01v\x02"] * len(bodies))
        ),
    ),
    count=st.one_of(st.integers(-3, 6).map(str), st.text(max_size=5)),
)
async def test_malformed_half_batches_get_a_clear_code(
    broker: BrokerController, client: RemotingClient, body: bytes, count: str
) -> None:
    make_topic(broker, "TXB_H")
    resp, tx_id, _ = await prepare_batch(client, broker, "TXB_H", body=body, count=count)
    assert resp.code in (ResponseCode.SUCCESS, ResponseCode.MESSAGE_ILLEGAL), resp.remark
    if resp.code == ResponseCode.SUCCESS:  # it was valid after all: it must commit
        assert (await end(client, broker, resp, tx_id, "COMMIT")).code == ResponseCode.SUCCESS


# ------------------------------------------------------------------ restart and crash


async def test_restart_with_a_pending_batch(tmp_path: Path, client: RemotingClient) -> None:
    config = broker_config(tmp_path / "s")
    b = BrokerController(config)
    await b.start()
    try:
        make_topic(b, "TXB_S", queues=1)
        pending, pending_id, ids = await prepare_batch(client, b, "TXB_S", 8, tag="p")
        done, done_id, _ = await prepare_batch(client, b, "TXB_S", 2, tag="d")
        assert (await end(client, b, done, done_id, "COMMIT")).code == ResponseCode.SUCCESS
    finally:
        await b.stop()
    b = BrokerController(config)
    await b.start()
    try:
        half = b.transactions.state.by_phys[pending.fields["offset"]]
        assert half.status is TxStatus.PENDING and half.batch_size == 8
        assert (await end(client, b, pending, pending_id, "COMMIT")).code == ResponseCode.SUCCESS
        again = await end(client, b, done, done_id, "COMMIT")
        assert again.code == ResponseCode.SUCCESS
        got = await visible(b, "TXB_S")
        assert [m.body for m in got] == [b"d0", b"d1", *(f"p{k}".encode() for k in range(8))]
        assert [m.msg_id for m in got[2:]] == ids
    finally:
        await b.stop()


@pytest.mark.parametrize("kept", [0, 3, 7])
async def test_crash_inside_a_batch_commit_applies_each_message_once(
    tmp_path: Path, client: RemotingClient, kept: int
) -> None:
    """The broker dies after CommitBegin with ``kept`` of the 7 copies stored (0: none; 3: a
    torn copy append whose tail was lost; 7: all, Committed missing). The restart appends only
    what is missing: each message is visible exactly once, in order."""
    config = broker_config(tmp_path / "s")
    b = BrokerController(config)
    await b.start()
    try:
        make_topic(b, "TXB_X", queues=1)
        before, before_id = await prepare(client, b, "TXB_X", b"before")
        assert (await end(client, b, before, before_id, "COMMIT")).code == ResponseCode.SUCCESS
        resp, tx_id, ids = await prepare_batch(client, b, "TXB_X", 7)
        service = b.transactions
        real_append = service.append_ops
        real_put = b.bridge.put

        async def crash() -> None:
            await asyncio.to_thread(b.store.wait_for_dispatch)
            b.store.crash_for_test()
            raise StoreClosedError("crashed (test)")

        async def append_ops(ops: list[Op], halves: list[Any]) -> int:
            if kept == 7 and isinstance(ops[0], Committed):
                await crash()
            return await real_append(ops, halves)

        async def put(batch: MessageBatch) -> Any:
            if batch.topic == "TXB_X" and kept < 7:
                assert len(batch.bodies) == 7  # the whole batch is one append
                if kept:
                    torn = MessageBatch(
                        batch.topic, batch.queue_id, batch.bodies[:kept],
                        batch.properties[:kept], flag=batch.flag, sys_flag=batch.sys_flag,
                        prepared_transaction_offset=batch.prepared_transaction_offset,
                    )  # fmt: skip
                    await real_put(torn)
                await crash()
            return await real_put(batch)

        service.append_ops = append_ops  # type: ignore[method-assign]
        b.bridge.put = put  # type: ignore[method-assign]
        cut = await end(client, b, resp, tx_id, "COMMIT")
        assert cut.code == ResponseCode.STORE_CLOSED
    finally:
        await b.stop()

    b = BrokerController(config)
    await b.start()
    try:
        assert b.transactions.state.by_q == {}  # finished at start
        got = await visible(b, "TXB_X")
        assert [m.body for m in got] == [b"before", *(f"m{k}".encode() for k in range(7))]
        assert [m.msg_id for m in got[1:]] == ids
        again = await end(client, b, resp, tx_id, "COMMIT")
        assert again.code == ResponseCode.SUCCESS, again.remark
        assert len(await visible(b, "TXB_X")) == 8
    finally:
        await b.stop()

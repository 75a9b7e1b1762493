"""Pop and transactions on an in-memory SystemLog: their system topics never reach the store,
and a broker started again with the same log rebuilds their state from it alone."""

from __future__ import annotations

from pathlib import Path

from orbitmq.broker.context import SystemLog
from orbitmq.broker.controller import BrokerController
from orbitmq.broker.pop.records import REVIVE_TOPIC
from orbitmq.broker.transaction.records import HALF_TOPIC, OP_TOPIC
from orbitmq.broker.transaction.state import TxStatus
from orbitmq.common.codes import ResponseCode
from orbitmq.common.record import decode
from orbitmq.net.client import RemotingClient
from tests.broker.conftest import broker_config
from tests.broker.memlog import BASE_OFFSET, MemorySystemLog
from tests.broker.test_pop import GROUP, NEEDS_POP_RETRY_TOPIC, ack, no_pop_backoff, pop, send
from tests.broker.test_pop import make_topic as make_pop_topic
from tests.broker.test_transaction import (
    FakeProducer,
    end,
    make_topic,
    prepare,
    until,
    visible,
)


def test_memory_log_has_every_system_log_method() -> None:
    wanted = {name for name in vars(SystemLog) if not name.startswith("_")}
    assert wanted == {"append", "read", "read_records", "max_offset", "min_offset", "settle"}
    assert wanted <= set(dir(MemorySystemLog))


async def test_pop_state_lives_in_the_system_log(tmp_path: Path, client: RemotingClient) -> None:
    memory = MemorySystemLog()
    config = broker_config(tmp_path / "s")
    b = BrokerController(config, system_log=memory)
    await b.start()
    try:
        make_pop_topic(b, "T", 1)
        await send(client, b, "T", [b"m0", b"m1", b"m2"], queue_id=0)
        resp, got, handles = await pop(client, b, "T", queue_id=0, invisible_time_ms=30_000)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert [m.body for m in got] == [b"m0", b"m1", b"m2"]
        assert (await ack(client, b, "T", handles[0])).code == ResponseCode.SUCCESS
        # The CK and the ACK are in the in-memory log, not in the store.
        assert len(memory.topic_records(REVIVE_TOPIC)) == 2
        assert b.store.max_offset(REVIVE_TOPIC, 0) == 0
    finally:
        await b.stop()

    b = BrokerController(config, system_log=memory)
    await b.start()
    try:
        assert b.pop.inflight(GROUP, "T", 0) == 2  # replayed from memory
        assert (await ack(client, b, "T", handles[0])).code == ResponseCode.RECEIPT_HANDLE_EXPIRED
        for h in handles[1:]:
            assert (await ack(client, b, "T", h)).code == ResponseCode.SUCCESS
        assert not b.pop.state.cks
        resp, _, _ = await pop(client, b, "T", poll_time_ms=100)
        assert resp.code == ResponseCode.PULL_NOT_FOUND  # the offset moved past the run
        assert b.store.max_offset(REVIVE_TOPIC, 0) == 0
    finally:
        await b.stop()


@NEEDS_POP_RETRY_TOPIC
async def test_pop_revives_from_the_system_log(tmp_path: Path, client: RemotingClient) -> None:
    """The Reviver finds the expired CK in memory, reads its message from the store and copies
    it to the pop retry topic (the store's): the group gets it again."""
    memory = MemorySystemLog()
    b = BrokerController(
        broker_config(tmp_path / "s", pop_revive_interval_ms=50), system_log=memory
    )
    await b.start()
    try:
        no_pop_backoff(b)
        make_pop_topic(b, "T", 1)
        await send(client, b, "T", [b"once"], queue_id=0)
        _, first, _ = await pop(client, b, "T", invisible_time_ms=200)
        assert [m.body for m in first] == [b"once"]
        resp, again, handles = await pop(client, b, "T", poll_time_ms=4000)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert [(m.body, m.reconsume_times) for m in again] == [(b"once", 1)]
        assert (await ack(client, b, "T", handles[0])).code == ResponseCode.SUCCESS
        assert b.store.max_offset(REVIVE_TOPIC, 0) == 0
        assert len(memory.topic_records(REVIVE_TOPIC)) >= 4  # CK, DONE, CK, ACK
    finally:
        await b.stop()


async def test_transactions_live_in_the_system_log(tmp_path: Path, client: RemotingClient) -> None:
    memory = MemorySystemLog()
    config = broker_config(
        tmp_path / "s", transaction_timeout_ms=100, transaction_check_interval_ms=100
    )
    b = BrokerController(config, system_log=memory)
    await b.start()
    try:
        make_topic(b, "TX_M")
        pending, pending_id = await prepare(client, b, "TX_M", b"p")
        committed, committed_id = await prepare(client, b, "TX_M", b"c")
        rolled, rolled_id = await prepare(client, b, "TX_M", b"r")
        assert pending.fields["offset"] >= BASE_OFFSET  # named by the in-memory log's offset
        assert (await end(client, b, committed, committed_id, "COMMIT")).code == 0
        assert (await end(client, b, rolled, rolled_id, "ROLLBACK")).code == 0
        [copy] = await visible(b, "TX_M")  # the committed copy is in the store (a user topic)
        assert copy.body == b"c" and copy.prepared_transaction_offset == committed.fields["offset"]
        halves = [decode(r) for r in memory.topic_records(HALF_TOPIC)]
        assert [h.physical_offset for h in halves] == [
            pending.fields["offset"], committed.fields["offset"], rolled.fields["offset"]
        ]  # fmt: skip
        assert memory.topic_records(OP_TOPIC)
        assert b.store.max_offset(HALF_TOPIC, 0) == b.store.max_offset(OP_TOPIC, 0) == 0
    finally:
        await b.stop()

    b = BrokerController(config, system_log=memory)
    await b.start()
    producer = FakeProducer("COMMIT")
    try:
        state = b.transactions.state
        assert state.by_phys[pending.fields["offset"]].status is TxStatus.PENDING
        assert state.by_phys[committed.fields["offset"]].status is TxStatus.COMMITTED
        conflict = await end(client, b, rolled, rolled_id, "COMMIT")
        assert conflict.code == ResponseCode.TRANSACTION_STATE_CONFLICT
        # The check-back reads the half from the in-memory log and the answer commits it.
        await producer.beat(b)
        await until(lambda: not state.by_q or state.floor_q == 3)
        assert sorted(m.body for m in await visible(b, "TX_M")) == [b"c", b"p"]
        assert [c.fields["msg_id"] for c in producer.checks] == [pending_id]
    finally:
        await producer.client.close()
        await b.stop()

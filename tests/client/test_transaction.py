"""The transactional producer against a real (in-process) NameServer and broker."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orbitmq.broker.controller import BrokerController
from orbitmq.client import (
    AsyncAdminClient,
    AsyncTransactionProducer,
    LocalTransactionState,
    Message,
    TransactionProducer,
)
from orbitmq.client.admin.config import AdminConfig
from orbitmq.client.producer.types import SendStatus
from orbitmq.client.route import MessageQueue
from orbitmq.client.transaction.types import (
    EndResult,
    HalfBatchResult,
    TransactionConfig,
    half_batch_count,
    unpack_half_batch,
)
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import (
    ClientError,
    EmptyBodyError,
    MessageTooLargeError,
    MQError,
    RemoteError,
)
from orbitmq.common.record import StoredMessage, decode
from orbitmq.namesrv.config import NamesrvConfig
from orbitmq.namesrv.controller import NamesrvController
from tests.client.test_e2e import broker_config, wait_route

GROUP = "PG_CLIENT_TX"
COMMIT, ROLLBACK, UNKNOWN = (
    LocalTransactionState.COMMIT,
    LocalTransactionState.ROLLBACK,
    LocalTransactionState.UNKNOWN,
)


@dataclass
class Listener:
    """Local transactions decided by body; check-backs answered from ``outcomes``."""

    outcomes: dict[str, LocalTransactionState] = field(default_factory=dict)
    checked: list[StoredMessage] = field(default_factory=list)
    threads: list[int] = field(default_factory=list)

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        self.threads.append(threading.get_ident())
        if msg.body == b"boom":
            raise RuntimeError("local transaction failed")
        return LocalTransactionState(arg) if arg else COMMIT

    def check_local_transaction(self, msg: StoredMessage) -> LocalTransactionState:
        self.checked.append(msg)
        return self.outcomes.get(msg.msg_id or "", UNKNOWN)


@dataclass
class Env:
    namesrv: NamesrvController
    broker: BrokerController
    admin: AsyncAdminClient
    made: list[AsyncTransactionProducer] = field(default_factory=list)

    async def producer(self, listener: Any, **opts: Any) -> AsyncTransactionProducer:
        opts.setdefault("send_timeout_s", 2.0)
        opts.setdefault("heartbeat_interval_s", 0.2)
        topics = opts.pop("topics", ())
        p = AsyncTransactionProducer(
            [self.namesrv.address], GROUP, listener, TransactionConfig(**opts), topics=topics
        )
        self.made.append(p)
        return await p.start()

    async def visible(self, topic: str) -> list[StoredMessage]:
        await asyncio.to_thread(self.broker.store.wait_for_dispatch)
        out: list[StoredMessage] = []
        for q in self.broker.store.queue_ids(topic):
            res = self.broker.store.get_messages(topic, q, 0, 1000)
            out += [decode(v) for v in res.messages] if res.count else []
        return out


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    ns = NamesrvController(NamesrvConfig(port=0))
    await ns.start()
    config = dataclasses.replace(
        broker_config(tmp_path / "b", "broker-a", ns.address),
        transaction_timeout_ms=150,
        transaction_check_interval_ms=100,
    )
    broker = BrokerController(config)
    await broker.start()
    admin = AsyncAdminClient([ns.address], AdminConfig(timeout_s=2.0))
    e = Env(ns, broker, admin)
    await admin.create_topic(
        "TXC", read_queue_nums=2, write_queue_nums=2, broker_addr=broker.address
    )
    await wait_route(admin, "TXC", 2)
    try:
        yield e
    finally:
        for p in e.made:
            await p.close()
        await admin.close()
        await broker.stop()
        await ns.stop()


async def until(cond: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.02)


async def test_commit_and_rollback(env: Env) -> None:
    listener = Listener()
    p = await env.producer(listener)
    ok = await p.send_in_transaction(Message("TXC", b"yes", tags="t"), arg="COMMIT")
    assert ok.local_transaction_state is COMMIT and ok.end_error is None
    assert ok.transaction_id == ok.msg_id
    no = await p.send_in_transaction(Message("TXC", b"no"), arg="ROLLBACK")
    assert no.local_transaction_state is ROLLBACK and no.end_error is None
    got = await env.visible("TXC")
    assert [(m.body, m.msg_id, m.tags) for m in got] == [(b"yes", ok.msg_id, "t")]
    assert "TRAN_MSG" not in got[0].properties
    assert listener.checked == []


async def test_async_local_transaction(env: Env) -> None:
    p = await env.producer(Listener())
    seen: list[str] = []

    async def local(msg: Message, arg: Any) -> LocalTransactionState:
        seen.append(msg.properties["PGROUP"])
        await asyncio.sleep(0)
        return COMMIT

    result = await p.send_in_transaction(Message("TXC", b"async"), local)
    assert result.local_transaction_state is COMMIT and seen == [GROUP]
    assert [m.body for m in await env.visible("TXC")] == [b"async"]


async def test_unknown_is_resolved_by_check_back(env: Env) -> None:
    listener = Listener()
    p = await env.producer(listener)
    failed = await p.send_in_transaction(Message("TXC", b"boom"))  # raises: UNKNOWN
    odd = await p.send_in_transaction(Message("TXC", b"odd"), lambda m, a: "yes")  # not a state
    assert failed.local_transaction_state is UNKNOWN and odd.local_transaction_state is UNKNOWN
    assert await env.visible("TXC") == []
    listener.outcomes[failed.msg_id] = COMMIT
    listener.outcomes[odd.msg_id] = ROLLBACK
    await until(lambda: env.broker.transactions.state.pending() == 0)
    assert [m.body for m in await env.visible("TXC")] == [b"boom"]
    checked = {m.msg_id: m for m in listener.checked}
    assert checked[failed.msg_id].topic == "TXC" and checked[failed.msg_id].body == b"boom"
    assert "REAL_TOPIC" not in checked[failed.msg_id].properties
    assert p.checks_answered >= 2


async def test_another_producer_of_the_group_answers(env: Env) -> None:
    """The producer that sent is gone; a new one of the same group (knowing the topic from
    ``topics=``) gets the check-back."""
    first = await env.producer(Listener())
    result = await first.send_in_transaction(Message("TXC", b"orphan"), arg="UNKNOWN")
    await first.close()
    env.made.remove(first)
    listener = Listener(outcomes={result.msg_id: COMMIT})
    await env.producer(listener, topics=["TXC"])
    await until(lambda: env.broker.transactions.state.pending() == 0)
    assert [m.body for m in await env.visible("TXC")] == [b"orphan"]


async def test_blocking_producer_runs_local_tx_in_caller_thread(env: Env) -> None:
    listener = Listener()
    addr = env.namesrv.address

    def run() -> list[LocalTransactionState]:
        with TransactionProducer([addr], GROUP, listener, topics=["TXC"]) as p:
            assert p.client_id
            states = [
                p.send_in_transaction(Message("TXC", b"b1")).local_transaction_state,
                p.send_in_transaction(
                    Message("TXC", b"b2"), arg="ROLLBACK"
                ).local_transaction_state,
            ]
            with pytest.raises(ClientError):
                p.send_in_transaction(Message("TXC", b"x", properties={"REAL_TOPIC": "Y"}))
            return states

    caller = await asyncio.to_thread(lambda: (run(), threading.get_ident()))
    assert caller[0] == [COMMIT, ROLLBACK]
    assert set(listener.threads) == {caller[1]}
    assert [m.body for m in await env.visible("TXC")] == [b"b1"]


async def test_send_failure_raises_and_runs_nothing(env: Env) -> None:
    listener = Listener()
    p = await env.producer(listener, send_timeout_s=0.5, auto_create_fallback=False)
    with pytest.raises(MQError):
        await p.send_in_transaction(Message("NO_SUCH_TOPIC_TX", b"x"))
    assert listener.threads == []


def test_bad_arguments() -> None:
    with pytest.raises(MQError):
        AsyncTransactionProducer(["127.0.0.1:1"], "bad group!", Listener())
    with pytest.raises(ClientError):
        AsyncTransactionProducer(
            ["127.0.0.1:1"], GROUP, Listener(), TransactionConfig(check_concurrency=0)
        )


# ------------------------------------------------------------------ transactional batches


def rows(n: int, tag: str = "r") -> list[Message]:
    return [
        Message("TXC", f"{tag}{k}".encode(), tags=tag, properties={"k": str(k)}) for k in range(n)
    ]


async def test_half_batch_commit_makes_all_visible_in_order_once(env: Env) -> None:
    p = await env.producer(Listener())
    msgs = rows(50)
    msgs[3].properties["UNIQ_CLIENT_MESSAGE_ID_KEYIDX"] = "MY-OWN-ID"  # a caller's id is kept
    msgs[4].keys = ["k1", "k2"]
    hb = await p.send_half_batch(msgs, properties={"Q": "query-1", "B": "7"})
    assert isinstance(hb, HalfBatchResult) and hb.count == 50 and len(set(hb.msg_ids)) == 50
    assert hb.msg_ids[3] == "MY-OWN-ID"
    assert hb.status is SendStatus.SEND_OK and hb.broker_addr == env.broker.address
    assert hb.msg_id == hb.transaction_id and hb.topic == "TXC"
    assert await env.visible("TXC") == []
    [res] = await p.end_many([hb], COMMIT)
    assert res.ok and res.broker_state == "COMMITTED" and res.transaction_id == hb.transaction_id
    got = await env.visible("TXC")
    assert [m.body for m in got] == [f"r{k}".encode() for k in range(50)]
    assert [m.msg_id for m in got] == list(hb.msg_ids)
    assert {m.queue_id for m in got} == {hb.queue_id}
    assert got[0].properties["k"] == "0" and got[0].tags == "r" and got[4].keys == ["k1", "k2"]
    assert half_batch_count(got[0]) == 0
    assert not {"Q", "B", "TRAN_BATCH", "TRAN_MSG"} & set(got[0].properties)
    # The whole commit again (a retried job): applied once. A contradiction: refused.
    [again] = await p.end_many([hb], COMMIT)
    assert again.ok, again.error
    [conflict] = await p.end_many([hb], ROLLBACK)
    assert isinstance(conflict.error, RemoteError)
    assert conflict.error.code == ResponseCode.TRANSACTION_STATE_CONFLICT
    assert len(await env.visible("TXC")) == 50


async def test_end_many_from_another_producer_mixed_with_single_halves(env: Env) -> None:
    """Halves sent by one producer (a Spark executor), pickled, decided by another process of
    the group (the driver): many at once, singles and batches, commit and rollback."""
    sender = await env.producer(Listener())
    q0 = MessageQueue("TXC", "broker-a", 0)
    batches = [await sender.send_half_batch(rows(10, f"b{i}_"), queue=q0) for i in range(6)]
    single = await sender.send_half(Message("TXC", b"single"))
    doomed = await sender.send_half_batch(rows(3, "x"))
    moved = pickle.loads(pickle.dumps([*batches, single]))
    driver = await env.producer(Listener(), topics=["TXC"])
    results = await driver.end_many(moved, COMMIT, concurrency=2)
    assert [r.ok for r in results] == [True] * 7
    assert [r.transaction_id for r in results] == [
        *(b.transaction_id for b in batches),
        single.msg_id,
    ]
    [dropped] = await driver.end_many([doomed], ROLLBACK)
    assert dropped.ok and dropped.broker_state == "ROLLED_BACK"
    got = await env.visible("TXC")
    assert sorted(m.body for m in got if m.queue_id == 0 and m.body != b"single") == sorted(
        f"b{i}_{k}".encode() for i in range(6) for k in range(10)
    )
    per_batch = [[m.body for m in got if m.msg_id in set(b.msg_ids)] for b in batches]
    assert per_batch == [[f"b{i}_{k}".encode() for k in range(10)] for i in range(6)]
    assert sum(m.body == b"single" for m in got) == 1 and len(got) == 61
    assert env.broker.transactions.state.pending() == 0


async def test_half_batch_check_back(env: Env) -> None:
    listener = Listener()
    p = await env.producer(listener)
    listener.outcomes["TX-BATCH-1"] = COMMIT  # recorded before the send, as a sink does
    hb = await p.send_half_batch(
        rows(4), properties={"SPARK_BATCH": "3"}, transaction_id="TX-BATCH-1"
    )
    assert hb.transaction_id == "TX-BATCH-1"
    await until(lambda: env.broker.transactions.state.pending() == 0)
    msg = listener.checked[0]  # a slow answer can be overtaken by another check: same half
    assert {m.msg_id for m in listener.checked} == {"TX-BATCH-1"}
    assert msg.msg_id == hb.transaction_id and half_batch_count(msg) == 4
    assert msg.physical_offset == hb.offset  # tells a half from a retry's orphan of the same id
    assert msg.topic == "TXC" and msg.queue_id == hb.queue_id
    assert msg.properties["SPARK_BATCH"] == "3" and "REAL_TOPIC" not in msg.properties
    assert [body for body, _ in unpack_half_batch(msg)] == [b"r0", b"r1", b"r2", b"r3"]
    assert [props["k"] for _, props in unpack_half_batch(msg)] == ["0", "1", "2", "3"]
    assert [m.msg_id for m in await env.visible("TXC")] == list(hb.msg_ids)


async def test_half_batch_bad_input(env: Env) -> None:
    p = await env.producer(Listener(), max_message_size=64 * 1024)
    with pytest.raises(EmptyBodyError):
        await p.send_half_batch([])
    with pytest.raises(ClientError, match="same topic"):
        await p.send_half_batch([Message("TXC", b"a"), Message("OTHER", b"b")])
    with pytest.raises(ClientError, match="TRAN_MSG"):
        await p.send_half_batch([Message("TXC", b"a", properties={"TRAN_MSG": "true"})])
    with pytest.raises(ClientError, match="transaction_id"):
        await p.send_half_batch(rows(2), properties={"UNIQ_CLIENT_MESSAGE_ID_KEYIDX": "x"})
    with pytest.raises(MessageTooLargeError):
        await p.send_half_batch([Message("TXC", b"x" * 1000)] * 100)  # 100 kB packed > 64 kB
    with pytest.raises(EmptyBodyError):
        await p.send_half_batch([Message("TXC", b"a"), Message("TXC", b"")])
    assert await env.visible("RMQ_SYS_TRANS_HALF_TOPIC") == []
    ok = await p.send_half_batch(rows(2))  # still fine afterwards
    assert (await p.end_many([ok], COMMIT))[0].ok


async def test_blocking_half_batch(env: Env) -> None:
    addr = env.namesrv.address

    def run() -> list[EndResult]:
        with TransactionProducer([addr], GROUP, Listener(), topics=["TXC"]) as p:
            halves = [p.send_half_batch(rows(5, f"t{i}_")) for i in range(3)]
            assert [h.count for h in halves] == [5, 5, 5]
            return p.end_many(halves, COMMIT)

    results = await asyncio.to_thread(run)
    assert all(r.ok for r in results)
    assert len(await env.visible("TXC")) == 15


@settings(max_examples=100, deadline=None)
@given(body=st.binary(max_size=64), count=st.sampled_from(["1", "2", "x", ""]))
def test_unpack_half_batch_of_anything_raises_clearly(body: bytes, count: str) -> None:
    host = ("0.0.0.0", 0)
    msg = StoredMessage(
        total_size=0, queue_id=0, flag=0, queue_offset=0, physical_offset=0, sys_flag=0,
        born_timestamp_ms=0, born_host=host, store_timestamp_ms=0, store_host=host,
        reconsume_times=0, prepared_transaction_offset=0, body=body, topic="T",
        properties={"TRAN_BATCH": count} if count else {},
    )  # fmt: skip
    try:
        out = unpack_half_batch(msg)
    except MQError:
        return
    assert half_batch_count(msg) >= 1 and all(isinstance(b, bytes) for b, _ in out)

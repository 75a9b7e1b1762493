"""The transactional producer against a real (in-process) NameServer and broker."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from orbitmq.broker.controller import BrokerController
from orbitmq.client import (
    AdminClient,
    AsyncTransactionProducer,
    LocalTransactionState,
    Message,
    TransactionProducer,
)
from orbitmq.common.errors import ClientError, MQError
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
    admin: AdminClient
    made: list[AsyncTransactionProducer] = field(default_factory=list)

    async def producer(self, listener: Any, **opts: Any) -> AsyncTransactionProducer:
        opts.setdefault("send_timeout_s", 2.0)
        opts.setdefault("heartbeat_interval_s", 0.2)
        p = AsyncTransactionProducer([self.namesrv.address], GROUP, listener, **opts)
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
    admin = AdminClient([ns.address], timeout_s=2.0)
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
        AsyncTransactionProducer(["127.0.0.1:1"], GROUP, Listener(), check_concurrency=0)

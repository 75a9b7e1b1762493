"""The sink's commit protocol without Spark: markers, replays, aborts and the broker's
check-backs answered from the markers.

An in-process NameServer and Broker with short transaction timers (first check-back after
0.4 s, a pass every 0.3 s) stand in for a driver that died at the worst moments: after writing
the marker but before any COMMIT, and with task attempts whose halves never reached it.
"""

from __future__ import annotations

import asyncio
import collections
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orbitmq.broker.controller import BrokerController
from orbitmq.client import AsyncAdminClient, Message
from orbitmq.client.transaction.producer import AsyncTransactionProducer
from orbitmq.client.transaction.types import EndResult, LocalTransactionState, TransactionConfig
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import RemoteError, error_for
from orbitmq.common.record import StoredMessage
from orbitmq.namesrv.config import NamesrvConfig
from orbitmq.namesrv.controller import NamesrvController
from orbitmq.spark import commit as protocol
from orbitmq.spark.commit import HalfRef, Marker, MarkerChecker, MarkerStoreFactory
from tests.broker.conftest import broker_config

GROUP = "sink-test-group"
MARKERS = "SinkTestMarkers"


@dataclass
class Env:
    ns: NamesrvController
    broker: BrokerController
    admin: AsyncAdminClient
    tx: AsyncTransactionProducer
    checker: MarkerChecker
    stores: MarkerStoreFactory
    topic: str

    async def halves(
        self, query: str, batch: int, values: list[str], per: int = 3, queue: Any = None
    ) -> list[HalfRef]:
        props = {
            protocol.PROPERTY_QUERY: query,
            protocol.PROPERTY_BATCH: str(batch),
            protocol.PROPERTY_ATTEMPT: "0.0.0",
            protocol.PROPERTY_MARKER_TOPIC: MARKERS,
        }
        out = []
        for at in range(0, len(values), per):
            msgs = [Message(self.topic, v.encode()) for v in values[at : at + per]]
            hb = await self.tx.send_half_batch(msgs, properties=props, queue=queue)
            out.append(HalfRef.of(hb, "w0"))
        return out

    async def settle(self, expected: collections.Counter[str]) -> collections.Counter[str]:
        """The topic's bodies once they equal ``expected`` or after 10 s (the ConsumeQueue is
        fed asynchronously after a commit's append)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while (got := await self.bodies()) != expected and loop.time() < deadline:
            await asyncio.sleep(0.05)
        return got

    async def bodies(self) -> collections.Counter[str]:
        got: collections.Counter[str] = collections.Counter()
        for mq in await self.admin.queues(self.topic):
            offset, end = await self.admin.min_offset(mq), await self.admin.max_offset(mq)
            while offset < end:
                res = await self.admin.pull(mq, offset, max_nums=256)
                got.update(m.body.decode() for m in res.messages)
                offset = res.next_begin_offset
        return got


@pytest.fixture
async def env(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Env]:
    check_max = getattr(request, "param", 15)
    ns = NamesrvController(NamesrvConfig(port=0))
    await ns.start()
    broker = BrokerController(
        broker_config(
            tmp_path / "store",
            broker_name="broker-a",
            namesrv_addrs=(ns.address,),
            transaction_timeout_ms=400,
            transaction_check_interval_ms=300,
            transaction_check_max=check_max,
        )
    )
    await broker.start()
    admin = AsyncAdminClient([ns.address])
    checker = MarkerChecker()
    tx = AsyncTransactionProducer(
        [ns.address], GROUP, checker, TransactionConfig(heartbeat_interval_s=0.3), topics=[MARKERS]
    )
    stores = MarkerStoreFactory(admin, tx.producer, MARKERS)
    checker.stores = stores
    topic = f"sink-commit-{uuid.uuid4().hex[:6]}"
    try:
        await admin.create_topic(topic, read_queue_nums=2, write_queue_nums=2)
        for _ in range(200):
            try:
                if len(await admin.queues(topic)) == 2:
                    break
            except Exception:  # noqa: BLE001 - not registered yet
                pass
            await asyncio.sleep(0.05)
        await stores.default.ensure_topic()
        await tx.start()
        yield Env(ns, broker, admin, tx, checker, stores, topic)
    finally:
        await tx.close()
        await admin.close()
        await broker.stop()
        await ns.stop()


async def until(cond: object, timeout_s: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if await cond():  # type: ignore[operator]
            return
        await asyncio.sleep(0.1)
    raise AssertionError("condition not met in time")


async def test_commit_then_replays_never_duplicate(env: Env) -> None:
    query = str(uuid.uuid4())
    first = await env.halves(query, 0, [f"a{i}" for i in range(7)])
    out = await protocol.commit_batch(env.tx, env.stores.default, query, 0, first, timeout_s=10)
    assert not out.replay
    # Spark re-runs the batch (the driver died before recording commits/0): new halves with
    # the same rows, and commit() again.
    again = await env.halves(query, 0, [f"a{i}" for i in range(7)])
    out = await protocol.commit_batch(env.tx, env.stores.default, query, 0, again, timeout_s=10)
    assert out.replay and out.rolled_back == len(again)
    out = await protocol.commit_batch(env.tx, env.stores.default, query, 0, [], timeout_s=10)
    assert out.replay
    want = collections.Counter(f"a{i}" for i in range(7))
    assert await env.settle(want) == want


async def test_driver_dead_between_marker_and_commit_is_finished_by_check_backs(env: Env) -> None:
    query = str(uuid.uuid4())
    chosen = await env.halves(query, 3, [f"c{i}" for i in range(5)])
    orphan = await env.halves(query, 3, [f"o{i}" for i in range(4)])  # an attempt never reported
    pending = await env.halves(query, 4, ["p0", "p1"])  # a batch still running: no marker
    loop = asyncio.get_running_loop()
    # The driver wrote the marker, then died before any COMMIT.
    await env.stores.default.write(Marker(query, 3, tuple(chosen)), loop.time() + 5)

    async def committed() -> bool:
        return sum((await env.bodies()).values()) >= 5

    await until(committed)
    await asyncio.sleep(1.0)  # more check passes: nothing else may appear
    assert await env.bodies() == collections.Counter(f"c{i}" for i in range(5))
    assert env.checker.answers["COMMIT"] >= len(chosen)
    assert env.checker.answers["ROLLBACK"] >= len(orphan)
    assert env.checker.answers["UNKNOWN"] >= 1  # batch 4 is still undecided

    # The restarted driver replays batch 3 (already done) and commits batch 4.
    out = await protocol.commit_batch(env.tx, env.stores.default, query, 3, [], timeout_s=10)
    assert out.replay
    await protocol.commit_batch(env.tx, env.stores.default, query, 4, pending, timeout_s=10)
    expected = collections.Counter([f"c{i}" for i in range(5)] + ["p0", "p1"])
    assert await env.settle(expected) == expected


async def test_abort_never_undoes_a_chosen_half(env: Env) -> None:
    query = str(uuid.uuid4())
    chosen = await env.halves(query, 0, ["x0", "x1"])
    await protocol.commit_batch(env.tx, env.stores.default, query, 0, chosen, timeout_s=10)
    stray = await env.halves(query, 0, ["y0"])
    dropped = await protocol.abort_batch(
        env.tx, env.stores.default, query, 0, [*chosen, *stray], timeout_s=10
    )
    assert dropped == len(stray)
    want = collections.Counter(["x0", "x1"])
    assert await env.settle(want) == want


async def test_checker_answers_from_markers(env: Env) -> None:
    query = str(uuid.uuid4())
    [half] = await env.halves(query, 9, ["z"])
    stored = await env.admin.get_message_by_offset(env.broker.address, half.offset)
    assert isinstance(stored, StoredMessage) and stored.msg_id == half.transaction_id
    assert await env.checker.check_local_transaction(stored) is LocalTransactionState.UNKNOWN
    loop = asyncio.get_running_loop()
    await env.stores.default.write(Marker(query, 9, (half,)), loop.time() + 5)

    async def found() -> bool:
        return await env.stores.default.find(query, 9, strict=True) is not None

    await until(found)
    assert await env.checker.check_local_transaction(stored) is LocalTransactionState.COMMIT
    await env.stores.default.write(Marker(query, 10, ()), loop.time() + 5)
    stored.properties[protocol.PROPERTY_BATCH] = "10"

    async def found10() -> bool:
        return await env.stores.default.find(query, 10, strict=True) is not None

    await until(found10)
    assert await env.checker.check_local_transaction(stored) is LocalTransactionState.ROLLBACK
    stored.properties.pop(protocol.PROPERTY_QUERY)
    assert await env.checker.check_local_transaction(stored) is LocalTransactionState.UNKNOWN


def test_marker_round_trip_and_malformed_bodies() -> None:
    m = Marker("q", 5, (HalfRef("broker-a", 10, "T1", "t", 0, 3),), ("0.0.1",), 3)
    assert Marker.decode(m.encode()) == m and m.chosen == {"T1"}
    for bad in (b"", b"{}", b"[1]", b'{"v":1,"query":"q","batch":"x","halves":[]}',
                b'{"v":1,"query":"q","batch":1,"halves":[[1,2]]}', b"\xff\xfe"):  # fmt: skip
        with pytest.raises(ValueError):
            Marker.decode(bad)


@pytest.mark.parametrize("env", [2], indirect=True)  # discarded after 2 unanswered check-backs
async def test_a_batch_that_outlived_its_halves_fails_before_its_marker(env: Env) -> None:
    query = str(uuid.uuid4())
    slow = await env.halves(query, 0, ["s0", "s1"])
    await asyncio.sleep(2.5)  # no marker: UNKNOWN, UNKNOWN, then the broker discards them
    with pytest.raises(protocol.SinkCommitError, match="must run again"):
        await protocol.commit_batch(env.tx, env.stores.default, query, 0, slow, timeout_s=10)
    assert await env.stores.default.find(query, 0, strict=True) is None
    # Spark re-runs the batch: fresh halves, committed at once.
    fresh = await env.halves(query, 0, ["s0", "s1"])
    await protocol.commit_batch(
        env.tx, env.stores.default, query, 0, fresh, timeout_s=10, oldest_ms=time.time() * 1000
    )
    want = collections.Counter(["s0", "s1"])
    assert await env.settle(want) == want


async def test_one_writers_halves_for_a_queue_become_visible_in_send_order(env: Env) -> None:
    query = str(uuid.uuid4())
    [q0, _] = await env.admin.queues(env.topic)
    values = [f"v{i:03d}" for i in range(60)]
    halves = await env.halves(query, 0, values, per=2, queue=q0)
    await protocol.commit_batch(env.tx, env.stores.default, query, 0, halves, timeout_s=10)
    await env.settle(collections.Counter(values))
    res = await env.admin.pull(q0, 0, max_nums=100)
    assert [m.body.decode() for m in res.messages] == values


class _Refusing:
    """A producer whose every END_TRANSACTION the broker answers with ``error``."""

    def __init__(self, error: RemoteError) -> None:
        self.error = error
        self.calls = 0

    async def end_many(self, halves: list[Any], state: Any, concurrency: int) -> list[EndResult]:
        self.calls += 1
        return [EndResult(h.transaction_id, state, "", self.error) for h in halves]


@pytest.mark.parametrize("make", [error_for, RemoteError], ids=["error_for", "bare"])
@pytest.mark.parametrize(
    "code", [ResponseCode.TRANSACTION_STATE_CONFLICT, ResponseCode.TRANSACTION_NOT_FOUND]
)
async def test_a_commit_refused_for_good_is_reported_at_once(code: ResponseCode, make: Any) -> None:
    # A final answer is data loss to report, not a transport failure to retry until the deadline.
    half = HalfRef("b0", 0, "tx-1", "T", 0, 1)
    producer = _Refusing(make(code, "refused"))
    deadline = asyncio.get_running_loop().time() + 30
    with pytest.raises(protocol.SinkCommitError, match="can no longer be committed"):
        await protocol._decide(
            producer, [half], LocalTransactionState.COMMIT, deadline, what="test"
        )
    assert producer.calls == 1

"""A crash in the middle of a truncation, with real broker processes in a group (#13): three
NameServers with controllers, three brokers in controller mode (``sync``, factor 3,
``min_in_sync_replicas = 2``).

Each round SIGKILLs the master under load; a slave is elected. The old master's log then gets
a tail nobody else has, in its last epoch (written into its stopped store: what a master leaves
when it dies right after appending sends its slaves never received; under sync load the slaves
usually have everything, so the tail is made certain this way). The old master is restarted
as a broker that SIGKILLs itself at one step of the truncation of that tail
(tests/chaos/crashing_broker.py; the step cycles through ``orbitmq.store.truncate.STEPS``),
then restarted normally: recovery finishes the cut, the broker rejoins as a slave.

Checked with orbitmq.testing.checker: 0 acknowledged messages lost or misplaced on *every*
replica's store, the three CommitLogs byte-identical, the crash happened at the step asked.

Rounds: ORBITMQ_CHAOS_ITERATIONS (``make test-chaos``), else 1. The seed is printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from pathlib import Path

import pytest

from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MQError
from orbitmq.common.message import MessageBatch, encode_properties
from orbitmq.controller.client import ControllerClient
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.controller import ReplicaInfo
from orbitmq.store.config import StoreConfig
from orbitmq.store.message_store import MessageStore
from orbitmq.store.truncate import STEPS
from orbitmq.testing.checker import History, check, now_ms
from orbitmq.testing.replicas import compare_replicas, opened, read_store
from tests.broker.ha.test_controlled import port_pair
from tests.broker.test_broker import send_frame
from tests.chaos.ha_cluster import chaos_seed, iterations
from tests.harness import PROCESS_STORE, ProcessCluster, ServerProcess
from tests.integration.test_ha_auth import namesrvs_with_controllers

ROUNDS = iterations(1)
pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.timeout(120 + 60 * ROUNDS)]
GROUP = "ha-cut"
TOPIC = "HaCut"
QUEUES = 4


class Senders:
    """Raw sends to the master the controller names, each recorded in a checker History."""

    def __init__(self, ctl: ControllerClient, history: History) -> None:
        self.ctl, self.history = ctl, history
        self.client = RemotingClient()
        self.master = ""
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    async def refresh(self) -> ReplicaInfo | None:
        try:
            info = await self.ctl.replica_info(GROUP)
        except MQError:
            return None
        self.master = info.master_address if info.has_master else ""
        return info

    async def _refresher(self) -> None:
        while not self.stop.is_set():
            await self.refresh()
            await asyncio.sleep(0.2)

    async def _sender(self, n: int) -> None:
        seq = 0
        while not self.stop.is_set():
            address = self.master
            if not address:
                await asyncio.sleep(0.05)
                continue
            body = b"w%d:%d:" % (n, seq) + bytes(random.randrange(100))
            sent = now_ms()
            try:
                resp = await self.client.invoke(
                    address, send_frame(TOPIC, [body], seq % QUEUES), timeout=3.0
                )
            except MQError as exc:
                self.history.unknown(f"w{n}", seq, TOPIC, sent, exc)
                seq += 1
                await asyncio.sleep(0.05)
                continue
            if resp.code == ResponseCode.SUCCESS:
                self.history.acked(f"w{n}", seq, TOPIC, GROUP, resp.fields["queue_id"],
                                   resp.fields["queue_offset"], sent)  # fmt: skip
            else:
                self.history.unknown(f"w{n}", seq, TOPIC, sent, resp.remark)
                await asyncio.sleep(0.05)
            seq += 1

    def start(self, n: int = 4) -> None:
        self.tasks = [asyncio.create_task(self._refresher())]
        self.tasks += [asyncio.create_task(self._sender(i)) for i in range(n)]

    async def close(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks)
        await self.client.close()

    async def wait_acked(self, more: int, timeout_s: float = 30.0) -> None:
        target = len(self.history.ok()) + more
        deadline = time.monotonic() + timeout_s
        while len(self.history.ok()) < target:
            assert time.monotonic() < deadline, f"fewer than {target} acknowledged"
            await asyncio.sleep(0.05)


GHOSTS = 300


def old_name(proc: ServerProcess) -> str:
    return Path(proc.args[proc.args.index("--config") + 1]).stem


def ghost_tail(store_path: Path) -> None:
    """Append to the killed master's log, in its last epoch, records nobody else has: what a
    master leaves when it dies right after appending sends its slaves never received (the
    group's new master started its epoch at the old end, so they diverge and are cut)."""
    store = MessageStore(StoreConfig(store_path=store_path, **PROCESS_STORE))
    store.open()
    try:
        for i in range(GHOSTS):  # foreign to the checker (no client:seq: prefix)
            store.put(MessageBatch(TOPIC, i % QUEUES, [b"ghost-%d" % i + bytes(1000)],
                                   [encode_properties({})]))  # fmt: skip
    finally:
        store.close()


async def until_info(senders: Senders, cond: object, timeout_s: float, what: str) -> ReplicaInfo:
    deadline = time.monotonic() + timeout_s
    while True:
        info = await senders.refresh()
        assert callable(cond)
        if info is not None and cond(info):
            return info
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s ({info})"
        await asyncio.sleep(0.1)


async def test_crash_in_the_middle_of_a_truncation(
    cluster: ProcessCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(chaos_seed())
    namesrvs, addrs = namesrvs_with_controllers(cluster, tmp_path, {})
    settings = {"broker_name": GROUP, "controller_addrs": addrs, "replication_mode": "sync",
                "min_in_sync_replicas": 2}  # fmt: skip
    brokers = [
        cluster.broker(f"c{n}", [p.address for p in namesrvs], port=port_pair(),
                       settings={"broker": settings}, start=False)
        for n in range(3)
    ]  # fmt: skip
    cluster.start_all(brokers)
    by_address = {b.address: b for b in brokers}
    ctl = ControllerClient(addrs, timeout=10.0)
    history = History()
    senders = Senders(ctl, history)
    first = rng.randrange(len(STEPS))
    try:
        await until_info(senders, lambda i: i.has_master and len(i.sync_state_set) == 3, 30,
                         "a group of 3")  # fmt: skip
        senders.start()
        await senders.wait_acked(100)
        for k in range(ROUNDS):
            step = STEPS[(first + k) % len(STEPS)]
            info = await until_info(senders, lambda i: i.has_master and len(i.sync_state_set) == 3,
                                    60, "all three in sync")  # fmt: skip
            await senders.wait_acked(rng.randrange(20, 200))
            old: ServerProcess = by_address[info.master_address]
            history.fault(f"round {k}: master {info.master_broker_id} killed")
            old.kill()
            await until_info(senders, lambda i, e=info.master_epoch: i.has_master
                             and i.master_epoch > e, 30, "a new master")  # fmt: skip
            ghost_tail(Path(old.args[old.args.index("--config") + 1]).parent / old_name(old))
            mark = tmp_path / f"crash-{k}.txt"
            monkeypatch.setenv("ORBITMQ_TEST_CRASH_TRUNCATE_AT", step)
            monkeypatch.setenv("ORBITMQ_TEST_CRASH_MARK", str(mark))
            old.module = "tests.chaos.crashing_broker"
            with contextlib.suppress(RuntimeError):  # it may die before its ready line
                old.restart()
            deadline = time.monotonic() + 30
            while old.running:
                assert time.monotonic() < deadline, "the broker did not crash in its truncation"
                await asyncio.sleep(0.1)
            assert mark.exists(), f"no crash at {step}: {old.log()[-3000:]}"
            print(f"round {k}: crashed at {step}: {mark.read_text().strip()}")
            monkeypatch.delenv("ORBITMQ_TEST_CRASH_TRUNCATE_AT")
            monkeypatch.delenv("ORBITMQ_TEST_CRASH_MARK")
            old.module = "orbitmq"
            old.restart()  # recovery finishes the cut; it rejoins as a slave
        await senders.wait_acked(50)
        await until_info(senders, lambda i: i.has_master and len(i.sync_state_set) == 3, 60,
                         "the crashed broker back in sync")  # fmt: skip
        await asyncio.sleep(0.5)
    finally:
        await senders.close()
        await ctl.close()
    for b in brokers:
        assert b.stop() == 0, b.log()[-3000:]
    stores = {f"c{n}": tmp_path / f"c{n}" for n in range(3)}
    with (
        opened(stores["c0"], **PROCESS_STORE) as s0,
        opened(stores["c1"], **PROCESS_STORE) as s1,
        opened(stores["c2"], **PROCESS_STORE) as s2,
    ):
        replicas = {"c0": s0, "c1": s1, "c2": s2}
        for name, store in replicas.items():
            mine = check(history.snapshot(), read_store(store, [TOPIC], GROUP))
            print(f"{name}: {mine.summary()}")
            assert not mine.lost and not mine.misplaced, f"{name}: {mine.summary()}"
        ends = {n: s.commit_log.max_offset for n, s in replicas.items()}
        assert len(set(ends.values())) == 1, ends
        assert compare_replicas(replicas) == []

"""A replicated cluster for fault tests: ``orbitmq cluster up`` as a child process, and the
load and faults the scenarios share.

- :class:`HaCluster` starts ``python -m orbitmq cluster up --replicas N`` (NameServers with
  embedded controllers, one broker group in controller mode, processes on 127.0.0.1..N), reads
  its ``cluster.json`` for every PID, finds the master through the controller, and kills,
  pauses or resumes processes by PID. At teardown the supervisor is stopped (it stops its
  children) and any child still alive is SIGKILLed by its PID, after checking that PID still
  runs a command naming this test's data folder.
- :class:`Load` sends from asyncio tasks through the real SDK (:class:`AsyncProducer`), each
  send stamped and recorded in a :class:`orbitmq.testing.checker.History`; ``ordered`` senders
  use a queue selector (one key each), so the checker checks their order; one more task sends
  ``send_async`` bursts (automatic batches).

The seed of a scenario is printed (``ORBITMQ_SEED`` replays it).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orbitmq.client import AsyncAdminClient, AsyncProducer, Message, MessageQueue, SendResult
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.common.errors import ClientError, MQError
from orbitmq.controller.client import ControllerClient
from orbitmq.protocol.controller import ReplicaInfo
from orbitmq.testing.checker import History, now_ms, stamp
from tests.harness import ProcessCluster, ServerProcess

GROUP = "broker-a"

FAST_FAILOVER: dict[str, int] = {
    "controller.master_lease_ms": 600,
    "broker.master_lease_ms": 600,
    "controller.election_margin_ms": 150,
    "controller.leader_fallback_ms": 500,
    "controller.broker_heartbeat_timeout_ms": 900,
    "controller.scan_interval_ms": 100,
    "broker.controller_heartbeat_interval_ms": 100,
    "broker.replica_info_poll_ms": 500,
    "broker.ha_heartbeat_interval_ms": 200,
    "broker.ha_link_timeout_ms": 2000,
}
"""Timings for a test that fails over many times (``--set``): a dead master replaced about
0.75 s after its last heartbeat instead of 2.5 s (lease 0.6 s + margin 0.15 s, a 0.1 s
scan), a new Raft leader's tenure delay 1.25 s instead of 4 s, a silent HA link (a paused
or cut-off slave) dropped after 2 s instead of 10 s. The same rules, shorter: a master
still stops acknowledging (lease) before anyone else may be elected (lease + margin). The
failover figures with the default timings come from the long runs (docs/ha.md)."""


def fast_failover_args() -> list[str]:
    return [arg for k, v in FAST_FAILOVER.items() for arg in ("--set", f"{k}={v}")]


def chaos_seed() -> int:
    env = os.environ.get("ORBITMQ_SEED")
    seed = int(env) if env else random.SystemRandom().randrange(2**32)
    print(f"chaos seed: ORBITMQ_SEED={seed}")
    return seed


def iterations(default: int) -> int:
    """ORBITMQ_CHAOS_ITERATIONS when set (``make test-chaos``), else ``default``."""
    env = os.environ.get("ORBITMQ_CHAOS_ITERATIONS")
    n = int(env) if env else default
    if n < 1:
        raise ValueError("ORBITMQ_CHAOS_ITERATIONS must be at least 1")
    return n


class HaCluster:
    def __init__(self, cluster: ProcessCluster, base: Path, *, replicas: int = 3,
                 mode: str = "sync", flush: str = "ASYNC_FLUSH",
                 restart_after_s: float | None = None, extra: Sequence[str] = ()) -> None:  # fmt: skip
        self.data = base / "ha-cluster"
        self.replicas = replicas
        args = [
            "cluster", "up", "--replicas", str(replicas), "--data-dir", str(self.data),
            "--replication-mode", mode, "--flush", flush, *extra,
        ]  # fmt: skip
        if restart_after_s is not None:
            args += ["--restart-after", str(restart_after_s)]
        self.proc: ServerProcess = cluster.child("cluster", "orbitmq", args, start=False)
        self.ctl: ControllerClient | None = None
        self.state: dict[str, Any] = {}

    def start(self, access_key: str | None = None, secret_key: str | None = None) -> HaCluster:
        """Start it; the controller client signs as ``access_key`` (``--auth``)."""
        self.proc.start(timeout=90)
        self.reload()
        self.ctl = ControllerClient(self.controllers, access_key=access_key, secret_key=secret_key)
        return self

    def reload(self) -> dict[str, Any]:
        self.state = json.loads((self.data / "cluster.json").read_text())
        return self.state

    @property
    def namesrv(self) -> list[str]:
        return str(self.state["namesrv"]).split(";")

    @property
    def controllers(self) -> list[str]:
        return str(self.state["controller"]).split(";")

    def processes(self, role: str | None = None) -> list[dict[str, Any]]:
        return [p for p in self.state["processes"] if role is None or p["role"] == role]

    def by_address(self, addr: str) -> dict[str, Any]:
        for p in self.processes():
            if addr in p["endpoints"].values():
                return p
        raise KeyError(f"no process of the cluster serves {addr}")

    # ------------------------------------------------------------------ the group

    async def replica_info(self) -> ReplicaInfo | None:
        assert self.ctl is not None
        try:
            return await self.ctl.replica_info(GROUP)
        except MQError:
            return None

    async def wait_master(self, *, other_than: str = "", after_epoch: int = -1,
                          in_sync: int = 1, timeout_s: float = 30.0) -> ReplicaInfo:  # fmt: skip
        """The group's master once it has one (not ``other_than``, of an epoch above
        ``after_epoch``) with ``in_sync`` members in its SyncStateSet."""
        deadline = time.monotonic() + timeout_s
        while True:
            info = await self.replica_info()
            if (
                info is not None
                and info.has_master
                and info.master_address != other_than
                and info.master_epoch > after_epoch
                and len(info.sync_state_set) >= in_sync
            ):
                return info
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no master (other than {other_than!r}): {info}\n{self.logs()}"
                )
            await asyncio.sleep(0.1)

    async def create_topic(self, topic: str, queues: int = 4) -> None:
        """The topic, created on the group's master: the master answers once the change is
        logged and on its in-sync slaves (metadata replication, docs/ha.md), so a new master
        knows it; a slave refuses a direct creation, as it refuses a send. The controller names
        a master before the master's next registration tells the NameServers, so "no master
        broker" is retried until they know it."""
        deadline = time.monotonic() + 20
        async with AsyncAdminClient(self.namesrv) as admin:
            while True:
                try:
                    await admin.create_topic(topic, read_queue_nums=queues, write_queue_nums=queues)
                    break
                except ClientError as e:
                    if "no master broker" not in str(e) or time.monotonic() > deadline:
                        raise
                await asyncio.sleep(0.2)
        async with AsyncAdminClient(self.namesrv) as admin:
            while True:
                with contextlib.suppress(MQError):
                    if len(await admin.queues(topic, writable=True)) == queues:
                        return
                assert time.monotonic() < deadline, f"no route for {topic}"
                await asyncio.sleep(0.2)

    async def controller_leader(self, *, other_than: str = "", timeout_s: float = 30.0) -> str:
        """The Remoting address of the controller node that says it leads (not
        ``other_than``)."""
        assert self.ctl is not None
        deadline = time.monotonic() + timeout_s
        while True:
            for addr in self.controllers:
                if addr == other_than:
                    continue
                with contextlib.suppress(MQError):
                    if (await self.ctl.metadata(addr)).is_leader:
                        return addr
            if time.monotonic() > deadline:
                raise AssertionError(f"no controller leader\n{self.logs()}")
            await asyncio.sleep(0.05)

    # ------------------------------------------------------------------ faults, by PID

    def signal(self, addr: str, sig: int) -> int:
        """Send ``sig`` to the process serving ``addr`` (its PID as ``cluster.json`` says now:
        the supervisor rewrites it on restarts); that PID."""
        self.reload()
        pid = int(self.by_address(addr)["pid"])
        if not self._ours(pid):
            raise AssertionError(f"{addr}: process {pid} is not running")
        os.kill(pid, sig)
        return pid

    def kill(self, addr: str) -> int:
        return self.signal(addr, signal.SIGKILL)

    def _ours(self, pid: int) -> bool:
        """Whether ``pid`` still runs a command of this cluster (PIDs are reused)."""
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False
        return str(self.data).encode() in cmdline

    async def wait_restarted(self, name: str, old_pid: int, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.reload()
            if any(p["name"] == name and p["pid"] != old_pid for p in self.processes()):
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"{name} was not restarted\n{self.logs()}")

    async def wait_all_running(self, timeout_s: float = 30.0) -> None:
        """Until every process of ``cluster.json`` runs (a restarted one under its new PID)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.reload()
            down = [p["name"] for p in self.processes() if not self._ours(int(p["pid"]))]
            if not down:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"not running: {down}\n{self.logs()}")
            await asyncio.sleep(0.05)

    def logs(self, limit: int = 1500) -> str:
        out = []
        for log in sorted((self.data / "logs").glob("*.log")):
            out.append(f"--- {log.name}\n{log.read_text(errors='replace')[-limit:]}")
        return "\n".join(out)

    async def close(self) -> None:
        if self.ctl is not None:
            await self.ctl.close()
        await asyncio.to_thread(self.proc.stop, 40.0)
        with contextlib.suppress(OSError, ValueError, KeyError):
            self.reload()
        for p in self.state.get("processes", []):  # what a failed supervisor left behind
            pid = int(p["pid"])
            if self._ours(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def key_selector(queues: Sequence[MessageQueue], msg: Message, arg: Any) -> MessageQueue:
    """Ordered senders: ``arg`` (an int) picks the queue, the same while the route keeps its
    queues (a group between masters keeps them: orbitmq.client.route)."""
    return queues[int(arg) % len(queues)]


class Load:
    """Senders through the SDK until stopped; every send recorded in ``history``."""

    def __init__(self, namesrv: list[str], topic: str, history: History, *, senders: int = 4,
                 ordered: int = 2, send_timeout_s: float = 10.0) -> None:  # fmt: skip
        self.topic = topic
        self.history = history
        self.producer = AsyncProducer(
            namesrv,
            ProducerConfig(send_timeout_s=send_timeout_s, try_timeout_s=4.0, linger_ms=1,
                           route_refresh_interval_s=5.0),
        )  # fmt: skip
        self.senders = senders
        self.ordered = ordered
        self.stop_event = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []
        self.errors: dict[str, int] = {}
        self.last_error = ""

    async def start(self) -> Load:
        await self.producer.start()
        for n in range(self.senders):
            self.tasks.append(asyncio.create_task(self._send_loop(n, n < self.ordered)))
        self.tasks.append(asyncio.create_task(self._burst_loop()))
        return self

    async def _burst_loop(self) -> None:
        """``send_async`` bursts: the automatic batches take the failover too."""
        client, seq = "b", 0
        rng = random.Random(99)
        while not self.stop_event.is_set():
            msgs = [stamp(Message(self.topic, rng.randbytes(rng.randrange(16, 256))), client,
                          seq + i) for i in range(rng.randrange(1, 40))]  # fmt: skip
            sent = now_ms()
            results = await asyncio.gather(
                *(self.producer.send_async(m) for m in msgs), return_exceptions=True
            )
            failed = False
            for i, res in enumerate(results):
                if isinstance(res, SendResult):
                    self.history.result(client, seq + i, res, sent)
                elif isinstance(res, MQError):
                    self.history.unknown(client, seq + i, self.topic, sent, res)
                    failed = True
                else:
                    raise res
            seq += len(msgs)
            if failed:
                await asyncio.sleep(0.05)

    async def _send_loop(self, n: int, ordered: bool) -> None:
        client = f"{'o' if ordered else 'u'}{n}"
        key = f"k{n}" if ordered else None
        seq = 0
        rng = random.Random(n)
        while not self.stop_event.is_set():
            msg = stamp(Message(self.topic, rng.randbytes(rng.randrange(16, 512))), client, seq)
            sent = now_ms()
            try:
                if ordered:
                    result = await self.producer.send(msg, selector=key_selector, arg=n)
                else:
                    result = await self.producer.send(msg)
                self.history.result(client, seq, result, sent, key=key)
            except MQError as exc:
                self.history.unknown(client, seq, self.topic, sent, exc, key=key)
                name = type(exc).__name__
                self.errors[name] = self.errors.get(name, 0) + 1
                self.last_error = f"{name}: {exc} {getattr(exc, '__notes__', '')}"
                await asyncio.sleep(0.05)
            seq += 1

    def max_ack_gap_ms(self, since_ms: float, until_ms: float) -> float:
        """The longest time between two acknowledgements in [since, until] (its ends count as
        acknowledgements): how long the data path stalled."""
        times = sorted(r.done_ms for r in self.history.ok() if since_ms <= r.done_ms <= until_ms)
        points = [since_ms, *times, until_ms]
        return max(b - a for a, b in itertools.pairwise(points))

    def acked(self) -> int:
        return len(self.history.ok())

    async def wait_acked(self, count: int, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.acked() < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"only {self.acked()} of {count} sends acknowledged; "
                                     f"errors {self.errors}, last {self.last_error}")  # fmt: skip
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        self.stop_event.set()
        tasks, self.tasks = self.tasks, []
        await asyncio.gather(*tasks)
        await self.producer.close()

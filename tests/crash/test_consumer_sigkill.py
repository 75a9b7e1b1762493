"""SIGKILL consumer processes at random moments while a producer sends; nothing is lost.

Three groups read one topic: a push group (three members), a lite-pull group (two members,
committing after each poll is on file) and an orderly push group (two members), each member a
``tests.integration.consumer_child`` process writing every message to its own file before
acknowledging it. The producer (asyncio tasks here) sends all the time: keyed messages
``k<key>-<seq>``, hashed to a queue by key, each key's sequence numbers in send order. Each cycle
waits a random moment, SIGKILLs (by PID) a random member of a random group and starts a
replacement, sometimes at once and sometimes after a pause (the group then rebalances twice).

At the end the producer stops, and each group must have consumed every acknowledged message at
least once (the union of its members' files, the killed ones' included); messages never sent
must not appear. Duplicates are expected (what a killed member consumed since its last commit)
and printed per group. The orderly group also keeps each key's order: taking every member's
consumptions by time, a key's messages are consumed for the first time in sequence order, and
when one is, every acknowledged message of the key before it was consumed already (a
redelivery after a kill repeats, it never skips or reorders).

The seed (kill moments, victims) is printed; ORBITMQ_SEED replays the choices (not the exact
wall-clock moments). Kill cycles: ORBITMQ_CRASH_ITERATIONS, default 4 (about 3 s each).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from orbitmq.client import (
    AsyncAdminClient,
    AsyncProducer,
    Message,
    SendResult,
    SendStatus,
    hash_selector,
)
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.client.route import TopicRouteNotFoundError
from orbitmq.common.errors import MQError
from tests import harness
from tests.harness import ProcessCluster, ServerProcess
from tests.integration.consumer_child import MODULE, Consumed, child_args, read_all

cluster = harness.cluster

DEFAULT_CYCLES = 4
TOPIC = "CrashConsume"
QUEUES = 4
GROUPS = {  # group -> (mode, members)
    "GCrashPush": ("push", 3),
    "GCrashLite": ("lite-pull", 2),
    "GCrashOrder": ("orderly", 2),
}
KEYS = 16
WAIT_S = 40.0


def cycles() -> int:
    env = os.environ.get("ORBITMQ_CRASH_ITERATIONS")
    n = int(env) if env else DEFAULT_CYCLES
    if n < 1:
        raise ValueError("ORBITMQ_CRASH_ITERATIONS must be at least 1")
    return n


pytestmark = [pytest.mark.crash, pytest.mark.timeout(120 + 10 * cycles())]


class Members:
    """Every consumer process ever started, by group; the live ones and their files."""

    def __init__(self, cluster: ProcessCluster, base: Path, namesrv: str) -> None:
        self.cluster = cluster
        self.base = base
        self.namesrv = namesrv
        self.paths: dict[str, dict[str, Path]] = {g: {} for g in GROUPS}
        self.live: dict[str, dict[str, ServerProcess]] = {g: {} for g in GROUPS}
        self.count = 0

    def start(self, groups: list[str]) -> None:
        """One new member of each group listed (launched together, then waited for)."""
        procs = []
        for group in groups:
            mode, _ = GROUPS[group]
            name = f"{group}-m{self.count}"
            self.count += 1
            out = self.base / f"{name}.out"
            args = child_args(
                self.namesrv, group, TOPIC, mode, out,
                commit_interval_s=0.5, pull_batch=16, threads=4, ack_delay_ms=1,
            )  # fmt: skip
            proc = self.cluster.child("consumer", MODULE, args, name=name, start=False)
            self.paths[group][name] = out
            self.live[group][name] = proc
            procs.append(proc)
        self.cluster.start_all(procs, timeout=60)

    def kill(self, group: str, name: str) -> None:
        self.live[group].pop(name).kill()

    def records(self, group: str) -> list[Consumed]:
        return [r for log in read_all(self.paths[group]).values() for r in log.consumed]

    def bodies(self, group: str) -> Counter[str]:
        return Counter(r.body for r in self.records(group))

    def diagnose(self) -> str:
        out = []
        for group in GROUPS:
            for name, proc in self.live[group].items():
                if not proc.running:
                    out.append(f"{name} exited:\n{proc.log()[-2000:]}")
        return "\n".join(out)


class Sender:
    """Sends bursts of keyed messages until stopped; records what was acknowledged."""

    def __init__(self, producer: AsyncProducer, rng: random.Random) -> None:
        self.producer = producer
        self.rng = rng
        self.sent: set[str] = set()
        self.acked: set[str] = set()
        self.failures = 0
        self.seq = 0
        self._stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self._stop.set()
        if self.task is not None:
            task, self.task = self.task, None
            await task

    async def _run(self) -> None:
        seqs = [0] * KEYS
        while not self._stop.is_set():
            bodies = []
            for _ in range(self.rng.randrange(1, 40)):
                key = self.rng.randrange(KEYS)
                bodies.append(f"k{key:02d}-{seqs[key]:06d}")
                seqs[key] += 1
            self.sent.update(bodies)
            results = await asyncio.gather(
                *(  # one key, one queue; a queue's sends keep their order
                    self.producer.send_async(
                        Message(TOPIC, b.encode(), keys=[b.partition("-")[0]]),
                        selector=hash_selector,
                    )
                    for b in bodies
                ),
                return_exceptions=True,
            )
            for body, res in zip(bodies, results, strict=True):
                if isinstance(res, SendResult) and res.status is SendStatus.SEND_OK:
                    self.acked.add(body)
                elif isinstance(res, MQError):
                    self.failures += 1
                elif isinstance(res, BaseException):
                    raise res
            await asyncio.sleep(self.rng.uniform(0.005, 0.05))


def check_order(records: list[Consumed], acked: set[str]) -> int:
    """The orderly property (see the module docstring); returns the redeliveries."""
    acked_seqs: dict[str, list[int]] = defaultdict(list)
    for body in acked:
        key, _, seq_text = body.partition("-")
        acked_seqs[key].append(int(seq_text))
    for seqs in acked_seqs.values():
        seqs.sort()
    consumed: dict[str, set[int]] = defaultdict(set)
    last: dict[str, int] = defaultdict(lambda: -1)  # highest seq consumed so far
    done: dict[str, int] = defaultdict(int)  # how many of the key's acked seqs came, in order
    redelivered = 0
    for r in sorted(records, key=lambda r: r.time_ns):
        key, _, seq_text = r.body.partition("-")
        seq = int(seq_text)
        if seq in consumed[key]:
            redelivered += 1
            continue
        assert seq > last[key], f"{key}: {r.consumer} consumed #{seq} after #{last[key]}"
        expect, i = acked_seqs[key], done[key]
        assert i >= len(expect) or expect[i] >= seq, (
            f"{key}: {r.consumer} consumed #{seq} while acknowledged #{expect[i]} was not "
            "consumed yet (skipped)"
        )
        if i < len(expect) and expect[i] == seq:
            done[key] += 1
        consumed[key].add(seq)
        last[key] = seq
    return redelivered


async def test_consumer_sigkill_loses_no_acknowledged_message(
    cluster: ProcessCluster, tmp_path: Path, crash_seed: int
) -> None:
    rng = random.Random(crash_seed)
    n_cycles = cycles()
    started = time.monotonic()
    ns = cluster.namesrv()
    broker = cluster.broker("crash-broker", [ns.address])
    admin = AsyncAdminClient([ns.address])
    producer = AsyncProducer([ns.address], ProducerConfig(linger_ms=2))
    sender = Sender(producer, random.Random(crash_seed + 1))
    members = Members(cluster, tmp_path, ns.address)
    kills: list[str] = []
    try:
        await admin.create_topic(
            TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES, broker_addr=broker.address
        )
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                if len(await admin.queues(TOPIC)) == QUEUES:
                    break
            except (TopicRouteNotFoundError, MQError):
                pass
            assert time.monotonic() < deadline, "no route"
            await asyncio.sleep(0.1)
        for _ in range(max(n for _, n in GROUPS.values())):
            want = [g for g, (_, n) in GROUPS.items() if len(members.live[g]) < n]
            await asyncio.to_thread(members.start, want)
        await producer.start()
        sender.start()
        for cycle in range(n_cycles):
            delay = rng.uniform(0.3, 1.5)
            await asyncio.sleep(delay)
            group = rng.choice(sorted(GROUPS))
            victim = rng.choice(sorted(members.live[group]))
            consumed = sum(members.bodies(group).values())
            await asyncio.to_thread(members.kill, group, victim)
            pause = rng.choice([0.0, rng.uniform(0.2, 1.5)])
            kills.append(
                f"cycle {cycle}: {delay:.2f}s in, killed {victim} ({consumed} consumed by its "
                f"group, {len(sender.acked)} acked); replaced after {pause:.2f}s"
            )
            await asyncio.sleep(pause)
            await asyncio.to_thread(members.start, [group])
        await asyncio.sleep(rng.uniform(0.2, 1.0))
        await sender.stop()

        report = []
        for group in sorted(GROUPS):
            deadline = time.monotonic() + WAIT_S
            while not sender.acked <= set(members.bodies(group)):
                if time.monotonic() > deadline:
                    missing = sorted(sender.acked - set(members.bodies(group)))
                    raise AssertionError(
                        f"{group}: {len(missing)} acknowledged messages never consumed, e.g. "
                        f"{missing[:10]}\n" + "\n".join(kills) + "\n" + members.diagnose()
                    )
                await asyncio.sleep(0.1)
            counts = members.bodies(group)
            assert set(counts) <= sender.sent, f"{group} consumed messages never sent"
            dups = sum(c - 1 for c in counts.values())
            report.append(f"{group}: {sum(counts.values())} consumed, {dups} duplicates")
            if GROUPS[group][0] == "orderly":
                redelivered = check_order(members.records(group), sender.acked)
                report[-1] += f" (redelivered {redelivered}, in order)"
        print(
            f"seed {crash_seed}: {n_cycles} consumer kills in "
            f"{time.monotonic() - started:.1f}s; sent {len(sender.sent)}, acknowledged "
            f"{len(sender.acked)}, failed sends {sender.failures}; " + "; ".join(report)
        )
        for line in kills:
            print("  " + line)
    finally:
        await sender.stop()
        await producer.close()
        await admin.close()

"""SIGKILL a SYNC_FLUSH broker while Pop consumers receive and ack; no message is lost.

Simple consumers (``tests.integration.consumer_child --mode pop``, four processes) receive from a
two-queue topic with a short invisible time and ack every message right after writing it to
their files; a producer (asyncio tasks here) sends all the time. Each cycle SIGKILLs the broker
(by PID) at a random moment and restarts it on the same store and port. Pops, acks and sends in
flight fail meanwhile; the consumers go on receiving.

At the end the producer stops and every acknowledged (SEND_OK) message must have been received
and *settled*: acked successfully by some consumer, or acked with the answer lost (the broker
died with the ack in flight: it may or may not have stored it). Messages popped and not acked
when the broker died come back after their invisible time, so do those whose ack was refused
or never sent, and are acked then. A message acked successfully is never delivered again
afterwards: the ack was answered after it was durable. Duplicates (deliveries beyond the first)
and ambiguous acks are printed.

The seed is printed; ORBITMQ_SEED replays the choices (not the exact wall-clock moments). Kill
cycles: ORBITMQ_CRASH_ITERATIONS, default 3 (about 4 s each).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from orbitmq.client import AsyncAdminClient, AsyncProducer, Message, SendResult, SendStatus
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.client.route import TopicRouteNotFoundError
from orbitmq.common.errors import MQError
from tests import harness
from tests.harness import ProcessCluster, ServerProcess
from tests.integration.consumer_child import MODULE, ChildLog, child_args, read_all

cluster = harness.cluster

DEFAULT_CYCLES = 3
TOPIC = "CrashPop"
GROUP = "GCrashPop"
QUEUES = 2
CONSUMERS = 4
INVISIBLE_S = 2.0
WAIT_S = 40.0


def cycles() -> int:
    env = os.environ.get("ORBITMQ_CRASH_ITERATIONS")
    n = int(env) if env else DEFAULT_CYCLES
    if n < 1:
        raise ValueError("ORBITMQ_CRASH_ITERATIONS must be at least 1")
    return n


pytestmark = [pytest.mark.crash, pytest.mark.timeout(120 + 15 * cycles())]


class Sender:
    """Sends bursts until stopped, through the broker's deaths; records acknowledgements."""

    def __init__(self, producer: AsyncProducer, rng: random.Random) -> None:
        self.producer = producer
        self.rng = rng
        self.sent: set[str] = set()
        self.acked: set[str] = set()
        self.failures: Counter[str] = Counter()
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
        while not self._stop.is_set():
            bodies = [f"p-{self.seq + i:06d}" for i in range(self.rng.randrange(1, 20))]
            self.seq += len(bodies)
            self.sent.update(bodies)
            results = await asyncio.gather(
                *(self.producer.send_async(Message(TOPIC, b.encode(), keys=[b])) for b in bodies),
                return_exceptions=True,
            )
            failed = False
            for body, res in zip(bodies, results, strict=True):
                if isinstance(res, SendResult) and res.status is SendStatus.SEND_OK:
                    self.acked.add(body)
                elif isinstance(res, MQError | SendResult):
                    self.failures[type(res).__name__] += 1
                    failed = True
                elif isinstance(res, BaseException):
                    raise res
            await asyncio.sleep(0.1 if failed else self.rng.uniform(0.01, 0.05))


NOT_APPLIED = frozenset({"NotSent", "ExpiredReceiptHandleError", "InvalidReceiptHandleError"})
"""Ack outcomes that certainly did not ack: the message must come back."""


def acked_ok(logs: dict[str, ChildLog]) -> dict[str, int]:
    """Body -> time of its first successful ack."""
    out: dict[str, int] = {}
    for log in logs.values():
        for t, body, outcome in log.acks:
            if outcome == "ok" and (body not in out or t < out[body]):
                out[body] = t
    return out


def history(logs: dict[str, ChildLog], body: str) -> str:
    """A body's deliveries (record, attempt) and acks in time order, for a failure message."""
    lines = [
        (r.time_ns, f"  {r.time_ns} {name} got {r.read_topic}/{r.queue_id}@{r.queue_offset} "
                    f"attempt {r.delivery_attempt}")
        for name, log in logs.items() for r in log.consumed if r.body == body
    ] + [
        (t, f"  {t} {name} ack {outcome}")
        for name, log in logs.items() for t, b, outcome in log.acks if b == body
    ]  # fmt: skip
    return body + ":\n" + "\n".join(line for _, line in sorted(lines))


def ambiguous(logs: dict[str, ChildLog]) -> set[str]:
    """Bodies with an ack whose answer was lost (connection closed with it in flight)."""
    return {
        body
        for log in logs.values()
        for _, body, outcome in log.acks
        if outcome not in NOT_APPLIED and outcome not in ("ok", "skip")
    }


async def test_pop_survives_broker_sigkill(
    cluster: ProcessCluster, tmp_path: Path, crash_seed: int
) -> None:
    rng = random.Random(crash_seed)
    n_cycles = cycles()
    started = time.monotonic()
    ns = cluster.namesrv()
    # Retry copies go through the timer, which re-fires what it fired within its checkpoint
    # interval before a crash (docs/timers.md: at-least-once); a short interval keeps that
    # legal duplicate rare, so a copy delivered again after its ack here is a broker bug.
    broker = cluster.broker(
        "crash-broker", [ns.address], flush="SYNC_FLUSH",
        settings={"broker": {"timer_checkpoint_interval_ms": 20}},
    )  # fmt: skip
    admin = AsyncAdminClient([ns.address])
    producer = AsyncProducer(
        [ns.address], ProducerConfig(linger_ms=2, send_timeout_s=2.0, route_refresh_interval_s=1.0)
    )
    sender = Sender(producer, random.Random(crash_seed + 1))
    paths: dict[str, Path] = {}
    procs: list[ServerProcess] = []
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
        for i in range(CONSUMERS):
            name = f"pop{i}"
            paths[name] = tmp_path / f"{name}.out"
            args = child_args(
                ns.address, GROUP, TOPIC, "pop", paths[name],
                max_messages=8, invisible_s=INVISIBLE_S, await_s=0.5, ack_delay_ms=2,
                heartbeat_interval_s=1.0,
            )  # fmt: skip
            procs.append(cluster.child("consumer", MODULE, args, name=name, start=False))
        await asyncio.to_thread(cluster.start_all, procs, 60)
        await producer.start()
        sender.start()
        for cycle in range(n_cycles):
            delay = rng.uniform(0.5, 2.0)
            await asyncio.sleep(delay)
            acked_ok_before = len(acked_ok(read_all(paths)))
            killed_ns = time.time_ns()
            await asyncio.to_thread(broker.kill)
            down = rng.uniform(0.0, 0.5)
            await asyncio.sleep(down)
            await asyncio.to_thread(broker.restart)
            kills.append(
                f"cycle {cycle}: killed {delay:.2f}s in ({len(sender.acked)} sent, "
                f"{acked_ok_before} acked by consumers), down {down:.2f}s, at {killed_ns}"
            )
        await asyncio.sleep(rng.uniform(0.5, 1.5))
        await sender.stop()

        deadline = time.monotonic() + WAIT_S
        while True:
            logs = read_all(paths)
            missing = sender.acked - set(acked_ok(logs)) - ambiguous(logs)
            if not missing:
                break
            if time.monotonic() > deadline:
                received = {r.body for log in logs.values() for r in log.consumed}
                never = sorted(missing - received)
                raise AssertionError(
                    f"{len(missing)} acknowledged messages not consumed and acked, "
                    f"{len(never)} of them never received, e.g. {sorted(missing)[:10]}\n"
                    + "\n".join(kills)
                    + "\n"
                    + "\n".join(p.log()[-1500:] for p in procs if not p.running)
                )
            await asyncio.sleep(0.2)
        await asyncio.sleep(INVISIBLE_S + 1.0)  # anything still to come back comes back now
        for proc in procs:
            proc.stop()

        logs = read_all(paths)
        done = acked_ok(logs)
        deliveries: dict[str, list[int]] = defaultdict(list)
        for log in logs.values():
            for r in log.consumed:
                deliveries[r.body].append(r.time_ns)
                assert r.topic == TOPIC, r
        assert set(deliveries) <= sender.sent, "received messages never sent"
        after_ack = sorted(b for b, ts in deliveries.items() if b in done and max(ts) > done[b])
        duplicates = sum(len(ts) - 1 for ts in deliveries.values())
        failed_acks = Counter(o for log in logs.values() for _, _, o in log.acks if o != "ok")
        share = {name: len(log.consumed) for name, log in logs.items()}
        unsure = ambiguous(logs) - set(done)
        print(
            f"seed {crash_seed}: {n_cycles} broker kills in {time.monotonic() - started:.1f}s; "
            f"sent {len(sender.sent)}, acknowledged {len(sender.acked)}, failed sends "
            f"{dict(sender.failures)}; deliveries {sum(len(t) for t in deliveries.values())}, "
            f"duplicates {duplicates}, failed acks {dict(failed_acks)} ({len(unsure)} messages "
            f"left with only an ack whose answer was lost), share {share}"
        )
        assert sender.acked <= set(deliveries), "acknowledged messages never received"
        for line in kills:
            print("  " + line)
        assert not after_ack, (
            f"{len(after_ack)} messages delivered again after a successful ack, e.g. "
            f"{after_ack[:10]}; the first ones' deliveries and acks (a copy fired again long "
            "after the kill before it is a bug, see docs/pop.md):\n"
            + "\n".join(history(logs, body) for body in after_ack[:3])
        )
    finally:
        await sender.stop()
        await producer.close()
        await admin.close()

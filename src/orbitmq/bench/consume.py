"""Consumer catch-up benchmark: ``orbitmq bench consume``.

Preload ``count`` messages of ``size`` bytes into a topic (explicit ``send_batch`` calls,
several in flight, queues in turn), or reuse what a topic holds (``skip_load``); then, ``runs``
times, a new consumer group starting at the first offset reads everything back. The figure is
the catch-up rate, messages over the time from the first message received to the last, and the
report gives the median of the runs. Modes:

    push       one PushConsumer; its listener (``consume_batch_size`` = ``batch``) counts
    lite-pull  one AsyncLitePullConsumer; ``poll()`` in a loop (``poll_max`` = ``batch``)
    pop        one AsyncSimpleConsumer (Pop): ``receive(batch)`` + ``ack_many`` in
               ``pop_workers`` concurrent loops (each a round trip or two per batch)

It runs against ``namesrv`` or its own NameServer + Broker (:mod:`orbitmq.bench.cluster`).
The publish-to-receive latency benchmark (``orbitmq bench e2e``) is :mod:`orbitmq.bench.e2e`.

A CLI calls :func:`run_consume_bench` and prints :func:`format_consume_report`.
"""

from __future__ import annotations

import asyncio
import datetime
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass


from orbitmq.bench.cluster import (
    DEFAULT_QUEUES,
    LISTENERS,
    LoadResult,
    Meter,
    Say,
    ensure_topic,
    flush_types,
    kept_messages,
    load_topic,
    machine,
    new_group,
    new_push_consumer,
    nothing,
    target_cluster,
    target_text,
    wait_dispatched,
)
from orbitmq.client import AsyncAdminClient
from orbitmq.client.consumer.config import LitePullConfig, SimpleConfig
from orbitmq.client.consumer_types import ConsumedMessage, ConsumeFromWhere
from orbitmq.common.errors import ClientError
from orbitmq.net.loop import run as run_loop

MODES = ("push", "lite-pull", "pop")


DEFAULT_TOPIC = "BenchConsume"


DEFAULT_COUNT = 1_000_000


# ---------------------------------------------------------------------------- consume bench


@dataclass(slots=True)
class ConsumeBenchOptions:
    namesrv: str | None = None
    """A running cluster; None: start a NameServer + Broker for the benchmark."""
    data_dir: Path | None = None
    """Own broker: keep its data here (so ``skip_load`` can reuse it); None: a temporary dir."""
    topic: str = DEFAULT_TOPIC
    count: int = DEFAULT_COUNT
    size: int = 1024
    queues: int = DEFAULT_QUEUES
    """Queues per broker when the topic is created."""
    runs: int = 3
    mode: str = "push"
    batch: int = 32
    """push: consume_batch_size; lite-pull: poll_max; pop: messages per receive."""
    pull_batch: int = 64
    """push / lite-pull: messages per pull request."""
    threads: int = 20
    """push with a thread listener: consume threads."""
    listener: str = "async"
    """push: an ``async def`` listener on the consumer's loop, or a sync one in its threads."""
    pop_workers: int = 4
    """pop: concurrent receive loops."""
    skip_load: bool = False
    load_batch: int = 256
    stall_s: float = 30.0
    """A run fails when no message arrives for this long."""
    command: str = ""

    def validate(self) -> None:
        problems = []
        if self.mode not in MODES:
            problems.append(f"mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.listener not in LISTENERS:
            problems.append(f"listener {self.listener!r} is not one of {', '.join(LISTENERS)}")
        if self.count < 1 or self.size < 1 or self.queues < 1 or self.runs < 1:
            problems.append("count, size, queues and runs must be at least 1")
        if not 1 <= self.batch <= 1024 or not 1 <= self.pull_batch <= 1024:
            problems.append("batch and pull batch must be 1..1024")
        if self.threads < 1 or self.pop_workers < 1 or self.load_batch < 1:
            problems.append("threads, pop workers and load batch must be at least 1")
        if self.stall_s <= 0:
            problems.append("stall must be positive")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(slots=True)
class ConsumeRun:
    group: str
    messages: int
    bytes: int
    seconds: float
    """From the first message received to the last."""
    startup_s: float
    """From starting the consumer to its first message (join, rebalance, first pulls)."""
    cpu_s: float = 0.0
    """CPU time of this process (every thread) from starting the consumer to the last message:
    with the broker in another process, what one message costs the consuming side."""

    @property
    def cpu_us_per_msg(self) -> float:
        return self.cpu_s / self.messages * 1e6 if self.messages else 0.0

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    @property
    def mib_per_s(self) -> float:
        return self.bytes / 1024 / 1024 / self.seconds if self.seconds > 0 else 0.0


@dataclass(slots=True)
class ConsumeBenchResult:
    options: ConsumeBenchOptions
    load: LoadResult
    expected: int
    """Messages a new group reads from the start: what the topic's queues keep."""
    runs: list[ConsumeRun]
    started_at: str
    target: str
    flush_types: dict[str, str] = field(default_factory=dict)
    machine: dict[str, str] = field(default_factory=dict)

    @property
    def median_msgs_per_s(self) -> float:
        return statistics.median(r.msgs_per_s for r in self.runs) if self.runs else 0.0

    @property
    def median_mib_per_s(self) -> float:
        return statistics.median(r.mib_per_s for r in self.runs) if self.runs else 0.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["options"]["data_dir"] = str(self.options.data_dir or "")
        for run, raw in zip(self.runs, data["runs"], strict=True):
            raw.update(
                msgs_per_s=run.msgs_per_s,
                mib_per_s=run.mib_per_s,
                cpu_us_per_msg=run.cpu_us_per_msg,
            )
        data.update(
            median_msgs_per_s=self.median_msgs_per_s, median_mib_per_s=self.median_mib_per_s
        )
        return data


class _Count:
    """What a consumer received: messages, body bytes, first and last arrival (perf_counter)."""

    def __init__(self) -> None:
        self.messages = 0
        self.bytes = 0
        self.first = 0.0
        self.last = 0.0
        self.lock = threading.Lock()
        self.changed = threading.Event()

    def add(self, msgs: Sequence[ConsumedMessage]) -> None:
        now = time.perf_counter()
        n = len(msgs)
        size = sum(len(m.message.body) for m in msgs)
        with self.lock:
            if not self.messages:
                self.first = now
            self.messages += n
            self.bytes += size
            self.last = now
        self.changed.set()


def run_consume_bench(
    options: ConsumeBenchOptions, say: Say | None = None, meter: Meter | None = None
) -> ConsumeBenchResult:
    """Preload (unless skip_load), then ``runs`` catch-up reads. Raises MQError / ValueError."""
    options.validate()
    say = say or nothing
    meter = meter or nothing
    started_at = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    with target_cluster(options.namesrv, options.data_dir, say) as target:
        expected, load, flush = run_loop(_prepare_consume(target.namesrv, options, say, meter))
        runs: list[ConsumeRun] = []
        for i in range(options.runs):
            group = new_group("BenchConsume", i)
            say(f"run {i + 1}/{options.runs}: {options.mode}, group {group}")
            run = _consume_once(target.namesrv, options, group, expected, meter)
            say(
                f"run {i + 1}: {run.messages:,} msgs in {run.seconds:.2f} s: "
                f"{run.msgs_per_s:,.0f} msgs/s, {run.mib_per_s:,.1f} MiB/s "
                f"(first message after {run.startup_s:.2f} s)"
            )
            runs.append(run)
    return ConsumeBenchResult(
        options=options,
        load=load,
        expected=expected,
        runs=runs,
        started_at=started_at,
        target=target_text(target, options.data_dir),
        flush_types=flush,
        machine=machine(),
    )


async def _prepare_consume(
    namesrv: str, options: ConsumeBenchOptions, say: Say, meter: Meter
) -> tuple[int, LoadResult, dict[str, str]]:
    async with AsyncAdminClient(namesrv) as admin:
        await ensure_topic(admin, options.topic, options.queues, say)
        kept, _ = await kept_messages(admin, options.topic)
        if options.skip_load:
            if kept < options.count:
                raise ClientError(
                    f"--skip-load: topic {options.topic!r} keeps {kept:,} messages, "
                    f"fewer than --count {options.count:,}"
                )
            say(f"reusing topic {options.topic}: {kept:,} messages kept")
            load = LoadResult(0, 0.0, skipped=True)
        else:
            seconds = await load_topic(
                namesrv, options.topic, options.count, options.size, options.load_batch, say, meter
            )
            load = LoadResult(options.count, seconds, skipped=False)
            kept = await wait_dispatched(admin, options.topic, kept + options.count)
        flush = await flush_types(admin, options.topic)
    return kept, load, flush


def _consume_once(
    namesrv: str, options: ConsumeBenchOptions, group: str, expected: int, meter: Meter
) -> ConsumeRun:
    count = _Count()
    stop = threading.Event()
    started = time.perf_counter()
    cpu_before = time.process_time()
    cpu = 0.0
    runner: Callable[[], None]
    closer: Callable[[], None]
    if options.mode == "push":
        runner, closer = _push_consumer(namesrv, options, group, count)
    elif options.mode == "lite-pull":
        runner, closer = _lite_pull_consumer(namesrv, options, group, count, stop)
    else:
        runner, closer = _pop_consumer(namesrv, options, group, count, stop)
    problem: list[BaseException] = []

    def guarded() -> None:
        try:
            runner()
        except BaseException as exc:  # noqa: BLE001 - reported by the waiting thread
            problem.append(exc)
            count.changed.set()

    worker = threading.Thread(target=guarded, name="orbitmq-bench-consume", daemon=True)
    worker.start()
    try:
        last_seen, last_change = 0, time.perf_counter()
        while True:
            count.changed.wait(0.2)
            count.changed.clear()
            if problem:
                raise problem[0]
            with count.lock:
                got = count.messages
            now = time.perf_counter()
            meter("consume", got, expected)
            if got >= expected:
                cpu = time.process_time() - cpu_before
                break
            if got != last_seen:
                last_seen, last_change = got, now
            elif now - last_change > options.stall_s:
                raise ClientError(
                    f"group {group}: no message for {options.stall_s:g} s "
                    f"after {got:,} of {expected:,}"
                )
    finally:
        stop.set()
        closer()
        worker.join(30)
    with count.lock:
        return ConsumeRun(
            group=group,
            messages=count.messages,
            bytes=count.bytes,
            seconds=count.last - count.first,
            startup_s=count.first - started,
            cpu_s=cpu,
        )


def _push_consumer(
    namesrv: str, options: ConsumeBenchOptions, group: str, count: _Count
) -> tuple[Callable[[], None], Callable[[], None]]:

    consumer = new_push_consumer(namesrv, group, options, ConsumeFromWhere.FIRST_OFFSET, count.add)

    def start() -> None:
        consumer.start()

    return start, consumer.shutdown


def _lite_pull_consumer(
    namesrv: str, options: ConsumeBenchOptions, group: str, count: _Count, stop: threading.Event
) -> tuple[Callable[[], None], Callable[[], None]]:
    """``poll()`` in a loop on an AsyncLitePullConsumer, on an event loop of the bench thread
    (no blocking facade in between: one poll is not a thread hop)."""
    from orbitmq.client.consumer.lite_pull import AsyncLitePullConsumer

    async def main() -> None:
        consumer = AsyncLitePullConsumer(
            namesrv,
            group,
            LitePullConfig(
                consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
                pull_batch_size=options.pull_batch,
                poll_max=options.batch,
            ),
        )
        consumer.subscribe(options.topic, "*")
        async with consumer:
            while not stop.is_set():
                msgs = await consumer.poll(timeout_s=0.2)
                if msgs:
                    count.add(msgs)

    return lambda: run_loop(main()), stop.set


def _pop_consumer(
    namesrv: str, options: ConsumeBenchOptions, group: str, count: _Count, stop: threading.Event
) -> tuple[Callable[[], None], Callable[[], None]]:
    """``pop_workers`` receive + ack_many loops as tasks of one AsyncSimpleConsumer, on an
    event loop of the bench thread (no blocking facade in between)."""
    from orbitmq.client.consumer.simple import AsyncSimpleConsumer

    async def main() -> None:
        async with AsyncSimpleConsumer(
            namesrv,
            group,
            SimpleConfig(await_duration_s=1.0, consume_from_where=ConsumeFromWhere.FIRST_OFFSET),
            subscriptions={options.topic: "*"},
        ) as consumer:

            async def receive_loop() -> None:
                while not stop.is_set():
                    msgs = await consumer.receive(
                        max_messages=options.batch, invisible_duration_s=60.0
                    )
                    if msgs:
                        await consumer.ack_many(msgs)
                        count.add(msgs)

            tasks = [asyncio.create_task(receive_loop()) for _ in range(options.pop_workers)]
            try:
                while not stop.is_set() and not any(t.done() for t in tasks):
                    await asyncio.sleep(0.1)
                for t in tasks:
                    exc = t.exception() if t.done() and not t.cancelled() else None
                    if exc is not None:
                        raise exc
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    return lambda: run_loop(main()), stop.set


def format_consume_report(result: ConsumeBenchResult) -> str:
    o = result.options
    load = (
        "reused (--skip-load)"
        if result.load.skipped
        else f"{result.load.messages:,} msgs in {result.load.seconds:.1f} s "
        f"({result.load.msgs_per_s:,.0f} msgs/s, send_batch of {o.load_batch})"
    )
    mode = o.mode
    if o.mode == "push":
        mode += f" ({o.listener} listener, consume batch {o.batch}, pull batch {o.pull_batch}"
        mode += f", {o.threads} threads)" if o.listener == "thread" else ")"
    elif o.mode == "lite-pull":
        mode += f" (poll max {o.batch}, pull batch {o.pull_batch})"
    else:
        mode += f" (receive {o.batch}, {o.pop_workers} loops, ack_many)"
    m = result.machine
    lines = [
        "OrbitMQ consumer benchmark (catch-up)",
        *([f"command: {o.command}"] if o.command else []),
        f"started: {result.started_at}; {m.get('cpus')} x {m.get('cpu')}; {m.get('python')}; "
        f"load {m.get('load average at start')}",
        f"cluster: {result.target}; flush "
        + (", ".join(f"{b} {t}" for b, t in sorted(result.flush_types.items())) or "?"),
        f"topic {o.topic}, {o.size} B bodies; load: {load}",
        f"mode {mode}; {result.expected:,} messages per run, a new group each run",
        "",
    ]
    for i, r in enumerate(result.runs, 1):
        lines.append(
            f"run {i}  {r.messages:,} msgs in {r.seconds:.2f} s: {r.msgs_per_s:>10,.0f} msgs/s "
            f"{r.mib_per_s:8,.1f} MiB/s  (first message after {r.startup_s:.2f} s; "
            f"consumer CPU {r.cpu_us_per_msg:.1f} µs/msg)"
        )
    lines.append(
        f"median {result.median_msgs_per_s:,.0f} msgs/s, {result.median_mib_per_s:,.1f} MiB/s "
        f"over {len(result.runs)} run{'s' if len(result.runs) != 1 else ''}"
    )
    return "\n".join(lines)

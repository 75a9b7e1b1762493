"""Consumer benchmarks: ``orbitmq bench consume`` (catch-up throughput) and ``orbitmq bench
e2e`` (publish-to-receive latency at a fixed rate).

**consume**: preload ``count`` messages of ``size`` bytes into a topic (explicit
``send_batch`` calls, several in flight, queues in turn), or reuse what a topic holds
(``skip_load``); then, ``runs`` times, a new consumer group starting at the first offset reads
everything back. The figure is the catch-up rate, messages over the time from the first
message received to the last, and the report gives the median of the runs. Modes:

    push       one PushConsumer; its listener (``consume_batch_size`` = ``batch``) counts
    lite-pull  one AsyncLitePullConsumer; ``poll()`` in a loop (``poll_max`` = ``batch``)
    pop        one AsyncSimpleConsumer (Pop): ``receive(batch)`` + ``ack_many`` in
               ``pop_workers`` concurrent loops (each a round trip or two per batch)

**e2e**: a producer in its own process sends at ``rate`` msgs/s (``send_batch`` of what is due
every ``tick_ms``, up to 64 batches in flight) for ``warmup_s`` + ``duration_s``; each body
starts with the wall-clock send time (ns), a run id and a "measured" flag. One PushConsumer in
this process (new group, joined and assigned every queue before the producer starts) takes
``time.time_ns()`` when its listener gets a message: latency = receive - send, into an
HdrHistogram (µs). Messages sent during the warm-up are not measured; after the producer stops
the consumer gets ``drain_s`` to receive the rest (what never comes is reported missing).

Both run against ``namesrv`` or, when it is None, start their own NameServer + Broker
(``python -m orbitmq up`` on 127.0.0.1 free ports, data in a temporary folder removed
afterwards, or in ``data_dir`` which is kept) and stop it at the end.

A CLI calls :func:`run_consume_bench` / :func:`run_e2e_bench` and prints
:func:`format_consume_report` / :func:`format_e2e_report`.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import datetime
import multiprocessing
import os
import platform
import queue
import shutil
import statistics
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.queues import Queue as MPQueue
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orbitmq.client.consumer.push import PushConsumer

import numpy as np
from hdrh.histogram import HdrHistogram

from orbitmq.bench._child import ServerChild
from orbitmq.bench.store import _cpu_model, _loadavg
from orbitmq.client import AsyncAdminClient, AsyncProducer, Message, MessageQueue
from orbitmq.client.consumer.config import LitePullConfig, PushConfig, SimpleConfig
from orbitmq.client.consumer_types import ConsumedMessage, ConsumeFromWhere, ConsumeResult
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.common.errors import ClientError, MQError
from orbitmq.net.loop import run as run_loop

MODES = ("push", "lite-pull", "pop")
LISTENERS = ("async", "thread")
DEFAULT_TOPIC = "BenchConsume"
DEFAULT_E2E_TOPIC = "BenchE2E"
DEFAULT_COUNT = 1_000_000
DEFAULT_QUEUES = 8
HIST_MAX_US = 60_000_000
PERCENTILES = (50.0, 90.0, 99.0, 99.9)
READY_TIMEOUT_S = 60.0
DISPATCH_WAIT_S = 60.0
ASSIGN_TIMEOUT_S = 30.0
LOAD_IN_FLIGHT = 16
"""Preload: send_batch calls in flight at once."""
E2E_IN_FLIGHT = 64
E2E_MAGIC = 0x0E2E
_E2E_HEADER = struct.Struct(">qIHB")
"""e2e body prefix: send time (ns since the epoch), run id, magic, measured flag."""

Say = Callable[[str], None]
Meter = Callable[[str, int, int], None]
"""(what, done, total): progress of a long step, for a progress bar."""


def _nothing(*_args: Any) -> None:
    return None


# ---------------------------------------------------------------------------- own cluster


@dataclass(slots=True)
class Target:
    namesrv: str
    own: bool
    """True: a NameServer + Broker this benchmark started (and stops)."""
    data_dir: str = ""
    flush: str = ""


@contextlib.contextmanager
def target_cluster(namesrv: str | None, data_dir: Path | None, say: Say) -> Iterator[Target]:
    """The cluster to measure: ``namesrv`` as given, or a NameServer + Broker started here
    (``python -m orbitmq up`` on 127.0.0.1 free ports) and stopped (SIGTERM by pid) after."""
    if namesrv:
        yield Target(namesrv, own=False)
        return
    made = data_dir is None
    folder = Path(tempfile.mkdtemp(prefix="orbitmq-bench-")) if made else Path(data_dir or ".")
    folder.mkdir(parents=True, exist_ok=True)
    child = ServerChild(
        [
            "orbitmq", "up", "--namesrv-port", "0", "--broker-port", "0",
            "--data-dir", str(folder), "--host", "127.0.0.1", "--log-level", "WARNING",
        ],
        folder / "up.log",
        "orbitmq up ready ",
    )  # fmt: skip
    try:
        pairs = (p.partition("=") for p in child.start(READY_TIMEOUT_S).split())
        endpoints = {k: v for k, _, v in pairs}
        say(
            f"started NameServer {endpoints.get('namesrv')} + Broker {endpoints.get('broker')} "
            f"({endpoints.get('flush', '?')}) in {folder}"
        )
        yield Target(
            endpoints["namesrv"], own=True, data_dir=str(folder), flush=endpoints.get("flush", "")
        )
    finally:
        child.stop(30.0)
        if made:
            shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------------------- topic + load


async def _ensure_topic(admin: AsyncAdminClient, topic: str, queues: int, say: Say) -> int:
    """Create the topic with ``queues`` queues per broker unless it exists; its read queues."""
    if topic not in await admin.list_topics():
        addrs = await admin.create_topic(topic, read_queue_nums=queues, write_queue_nums=queues)
        say(f"topic {topic}: {queues} queues on {len(addrs)} broker(s)")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10.0
    while True:
        try:
            found = await admin.queues(topic)
        except MQError:
            found = []
        if found:
            return len(found)
        if loop.time() >= deadline:
            raise ClientError(f"the NameServers do not route {topic!r}")
        await asyncio.sleep(0.1)


async def _kept(admin: AsyncAdminClient, topic: str) -> tuple[int, int]:
    """(messages kept in the topic's queues, sum of max offsets)."""
    desc = await admin.describe_topic(topic)
    kept = sum(max(0, q.max_offset - q.min_offset) for s in desc.stats for q in s.queues)
    return kept, sum(q.max_offset for s in desc.stats for q in s.queues)


async def _flush_types(admin: AsyncAdminClient, topic: str) -> dict[str, str]:
    info = await admin.routes.refresh(topic)
    names = sorted(info.broker_addrs)
    runtime = await asyncio.gather(
        *(admin.broker_runtime_info(info.broker_addrs[n]) for n in names), return_exceptions=True
    )
    return {
        n: str(rt.get("flush_disk_type", "?")) if isinstance(rt, dict) else "?"
        for n, rt in zip(names, runtime, strict=True)
    }


@dataclass(slots=True)
class LoadResult:
    messages: int
    seconds: float
    skipped: bool

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


async def _load(
    namesrv: str,
    topic: str,
    count: int,
    size: int,
    batch: int,
    say: Say,
    meter: Meter,
) -> float:
    """Send ``count`` bodies of ``size`` bytes with explicit send_batch calls, queues in turn,
    LOAD_IN_FLIGHT at once. Returns the seconds it took."""
    body = (b"bench-consume " + b"x" * size)[:size]
    async with AsyncProducer(namesrv, ProducerConfig(compress_over_bytes=-1)) as producer:
        info = await producer.routes.get(topic)
        queues = list(info.write_queues)
        if not queues:
            raise ClientError(f"topic {topic!r} has no writable queue")
        slots = asyncio.Semaphore(LOAD_IN_FLIGHT)
        failure: list[BaseException] = []
        done = 0
        tasks: set[asyncio.Task[None]] = set()

        async def one(msgs: list[Message], mq: MessageQueue) -> None:
            nonlocal done
            try:
                await producer.send_batch(msgs, queue=mq)
                done += len(msgs)
            except MQError as exc:
                failure.append(exc)
            finally:
                slots.release()

        started = time.perf_counter()
        last_meter = 0.0
        sent = 0
        i = 0
        while sent < count and not failure:
            await slots.acquire()
            n = min(batch, count - sent)
            msgs = [Message(topic, body)] * n
            task = asyncio.create_task(one(msgs, queues[i % len(queues)]))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            sent += n
            i += 1
            now = time.perf_counter()
            if now - last_meter > 0.2:
                meter("load", done, count)
                last_meter = now
        await asyncio.gather(*tasks)
        if failure:
            raise ClientError(f"preload failed after {done:,} messages: {failure[0]}")
        meter("load", done, count)
        seconds = time.perf_counter() - started
    say(f"loaded {count:,} messages in {seconds:.1f} s ({count / seconds:,.0f} msgs/s)")
    return seconds


async def _wait_dispatched(admin: AsyncAdminClient, topic: str, at_least: int) -> int:
    """Wait until the topic's queues hold ``at_least`` messages (dispatch runs behind)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DISPATCH_WAIT_S
    while True:
        kept, _ = await _kept(admin, topic)
        if kept >= at_least or loop.time() >= deadline:
            return kept
        await asyncio.sleep(0.2)


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


def _target_text(target: Target, data_dir: Path | None) -> str:
    if not target.own:
        return f"NameServer {target.namesrv}"
    where = f"data in {data_dir}" if data_dir is not None else "temporary data folder"
    return f"own NameServer + Broker on 127.0.0.1 ({where})"


def machine() -> dict[str, str]:
    cpus = os.cpu_count() or 0
    return {
        "cpu": _cpu_model(),
        "cpus": str(cpus),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "os": f"{platform.system()} {platform.release()}",
        "load average at start": _loadavg(),
    }


def _new_group(prefix: str, run: int) -> str:
    return f"{prefix}-{os.getpid()}-{int(time.time() * 1000) % 10**9}-{run}"


def run_consume_bench(
    options: ConsumeBenchOptions, say: Say | None = None, meter: Meter | None = None
) -> ConsumeBenchResult:
    """Preload (unless skip_load), then ``runs`` catch-up reads. Raises MQError / ValueError."""
    options.validate()
    say = say or _nothing
    meter = meter or _nothing
    started_at = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    with target_cluster(options.namesrv, options.data_dir, say) as target:
        expected, load, flush = run_loop(_prepare_consume(target.namesrv, options, say, meter))
        runs: list[ConsumeRun] = []
        for i in range(options.runs):
            group = _new_group("BenchConsume", i)
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
        target=_target_text(target, options.data_dir),
        flush_types=flush,
        machine=machine(),
    )


async def _prepare_consume(
    namesrv: str, options: ConsumeBenchOptions, say: Say, meter: Meter
) -> tuple[int, LoadResult, dict[str, str]]:
    async with AsyncAdminClient(namesrv) as admin:
        await _ensure_topic(admin, options.topic, options.queues, say)
        kept, _ = await _kept(admin, options.topic)
        if options.skip_load:
            if kept < options.count:
                raise ClientError(
                    f"--skip-load: topic {options.topic!r} keeps {kept:,} messages, "
                    f"fewer than --count {options.count:,}"
                )
            say(f"reusing topic {options.topic}: {kept:,} messages kept")
            load = LoadResult(0, 0.0, skipped=True)
        else:
            seconds = await _load(
                namesrv, options.topic, options.count, options.size, options.load_batch, say, meter
            )
            load = LoadResult(options.count, seconds, skipped=False)
            kept = await _wait_dispatched(admin, options.topic, kept + options.count)
        flush = await _flush_types(admin, options.topic)
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

    consumer = _new_push_consumer(namesrv, group, options, ConsumeFromWhere.FIRST_OFFSET, count.add)

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


# ---------------------------------------------------------------------------- e2e bench


@dataclass(slots=True)
class E2EBenchOptions:
    namesrv: str | None = None
    data_dir: Path | None = None
    topic: str = DEFAULT_E2E_TOPIC
    queues: int = DEFAULT_QUEUES
    rate: float = 5000.0
    size: int = 1024
    duration_s: float = 30.0
    warmup_s: float = 2.0
    runs: int = 3
    tick_ms: float = 2.0
    """The producer sends what is due every tick, as one send_batch."""
    batch: int = 1
    """consume_batch_size of the push consumer."""
    pull_batch: int = 64
    threads: int = 20
    listener: str = "async"
    drain_s: float = 10.0
    command: str = ""

    def validate(self) -> None:
        problems = []
        if self.listener not in LISTENERS:
            problems.append(f"listener {self.listener!r} is not one of {', '.join(LISTENERS)}")
        if self.rate <= 0 or self.duration_s <= 0 or self.tick_ms <= 0:
            problems.append("rate, duration and tick must be positive")
        if self.warmup_s < 0 or self.drain_s < 0:
            problems.append("warm-up and drain must be >= 0")
        if self.size < _E2E_HEADER.size:
            problems.append(f"size must be at least {_E2E_HEADER.size} bytes (the timestamp)")
        if self.runs < 1 or self.queues < 1 or self.threads < 1:
            problems.append("runs, queues and threads must be at least 1")
        if not 1 <= self.batch <= 1024 or not 1 <= self.pull_batch <= 1024:
            problems.append("batch and pull batch must be 1..1024")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(slots=True)
class E2ERun:
    group: str
    sent: int
    """Measured messages the broker accepted (warm-up excluded)."""
    received: int
    """Measured messages the consumer got (duplicates counted once)."""
    seconds: float
    """The producer's measured phase."""
    errors: int
    latency_ms: dict[str, float]
    after_store_ms: dict[str, float] = field(default_factory=dict)
    """receive - the broker's store time (ms resolution): how much of the latency is the
    consuming side (dispatch, long-poll wake-up, the pull answer, the consumer)."""
    consumer_cpu_percent: float = 0.0
    """CPU of the consumer's process (all threads) over the run, in % of one core."""
    duplicates: int = 0
    first_error: str | None = None

    @property
    def achieved_rate(self) -> float:
        return self.sent / self.seconds if self.seconds > 0 else 0.0

    @property
    def missing(self) -> int:
        return max(0, self.sent - self.received)


@dataclass(slots=True)
class E2EBenchResult:
    options: E2EBenchOptions
    runs: list[E2ERun]
    started_at: str
    target: str
    flush_types: dict[str, str] = field(default_factory=dict)
    machine: dict[str, str] = field(default_factory=dict)

    def median(self, key: str) -> float:
        return statistics.median(r.latency_ms[key] for r in self.runs) if self.runs else 0.0

    @property
    def median_rate(self) -> float:
        return statistics.median(r.achieved_rate for r in self.runs) if self.runs else 0.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["options"]["data_dir"] = str(self.options.data_dir or "")
        for run, raw in zip(self.runs, data["runs"], strict=True):
            raw.update(achieved_rate=run.achieved_rate, missing=run.missing)
        data["median_latency_ms"] = {k: self.median(k) for k in _latency_keys()}
        data["median_achieved_rate"] = self.median_rate
        return data


def _latency_keys() -> list[str]:
    return [f"p{p:g}" for p in PERCENTILES] + ["max", "mean"]


class _Latencies:
    """Receive-side recorder: latency samples (ns) of this run's measured messages."""

    def __init__(self, run_id: int) -> None:
        self.run_id = run_id
        self.samples = array.array("q")
        self.after_store = array.array("q")
        """receive - the broker's store time (ms resolution): the consume side's share."""
        self.seen: set[tuple[str, str, int, int]] = set()
        self.duplicates = 0
        self.lock = threading.Lock()

    def add(self, msgs: Sequence[ConsumedMessage]) -> None:
        now = time.time_ns()
        unpack = _E2E_HEADER.unpack_from
        with self.lock:
            for m in msgs:
                body = m.message.body
                if len(body) < _E2E_HEADER.size:
                    continue
                sent_ns, run_id, magic, measured = unpack(body)
                if magic != E2E_MAGIC or run_id != self.run_id or not measured:
                    continue
                mq = m.queue
                key = (mq.topic, mq.broker_name, mq.queue_id, m.message.queue_offset)
                if key in self.seen:
                    self.duplicates += 1
                    continue
                self.seen.add(key)
                self.samples.append(now - sent_ns)
                self.after_store.append(now - m.message.store_timestamp_ms * 1_000_000)

    @property
    def received(self) -> int:
        with self.lock:
            return len(self.samples)

    def histogram(self, after_store: bool = False) -> HdrHistogram:
        hist = HdrHistogram(1, HIST_MAX_US, 3)
        with self.lock:
            samples = self.after_store if after_store else self.samples
            if samples:
                us = np.clip(np.frombuffer(samples, dtype=np.int64) // 1000, 1, HIST_MAX_US)
                values, counts = np.unique(us, return_counts=True)
                for v, c in zip(values.tolist(), counts.tolist(), strict=True):
                    hist.record_value(v, c)
        return hist


@dataclass(slots=True)
class _ProducerReport:
    sent: int
    warmup: int
    seconds: float
    errors: int
    first_error: str | None


def _e2e_producer_main(
    namesrv: str,
    topic: str,
    rate: float,
    size: int,
    warmup_s: float,
    duration_s: float,
    tick_s: float,
    run_id: int,
    results: MPQueue[_ProducerReport | str],
) -> None:
    """Entry point of the e2e producer process (spawned)."""
    import logging

    logging.getLogger("orbitmq").setLevel(logging.ERROR)
    try:
        report = run_loop(
            _e2e_produce(namesrv, topic, rate, size, warmup_s, duration_s, tick_s, run_id)
        )
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        results.put(f"{type(exc).__name__}: {exc}")
        return
    results.put(report)


async def _e2e_produce(
    namesrv: str,
    topic: str,
    rate: float,
    size: int,
    warmup_s: float,
    duration_s: float,
    tick_s: float,
    run_id: int,
) -> _ProducerReport:
    pad = b"x" * (size - _E2E_HEADER.size)
    pack = _E2E_HEADER.pack
    sent = warm = errors = 0
    first_error: str | None = None
    slots = asyncio.Semaphore(E2E_IN_FLIGHT)
    tasks: set[asyncio.Task[None]] = set()
    async with AsyncProducer(namesrv, ProducerConfig(compress_over_bytes=-1)) as producer:
        await producer.routes.get(topic)

        async def one(msgs: list[Message], measured: bool) -> None:
            nonlocal sent, warm, errors, first_error
            try:
                await producer.send_batch(msgs)
                if measured:
                    sent += len(msgs)
                else:
                    warm += len(msgs)
            except MQError as exc:
                errors += len(msgs)
                first_error = first_error or f"{type(exc).__name__}: {exc}"
            finally:
                slots.release()

        loop = asyncio.get_running_loop()
        start = loop.time()
        measure_at = start + warmup_s
        end = measure_at + duration_s
        issued = 0  # messages handed to send_batch, warm-up included
        while True:
            now = loop.time()
            if now >= end:
                break
            due = int((now - start) * rate) - issued
            if due > 0:
                n = min(due, 1024)
                measured = now >= measure_at
                body = pack(time.time_ns(), run_id, E2E_MAGIC, 1 if measured else 0) + pad
                msgs = [Message(topic, body)] * n
                await slots.acquire()
                task = asyncio.create_task(one(msgs, measured))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                issued += n
            next_due = start + (issued + 1) / rate
            await asyncio.sleep(max(tick_s, next_due - loop.time()))
        seconds = loop.time() - measure_at
        await asyncio.gather(*tasks)
    return _ProducerReport(sent, warm, seconds, errors, first_error)


def run_e2e_bench(
    options: E2EBenchOptions, say: Say | None = None, meter: Meter | None = None
) -> E2EBenchResult:
    options.validate()
    say = say or _nothing
    meter = meter or _nothing
    started_at = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    with target_cluster(options.namesrv, options.data_dir, say) as target:
        queues, flush = run_loop(_prepare_e2e(target.namesrv, options, say))
        runs = []
        for i in range(options.runs):
            group = _new_group("BenchE2E", i)
            say(f"run {i + 1}/{options.runs}: group {group}, {options.rate:g} msgs/s")
            run = _e2e_once(target.namesrv, options, group, queues, meter, say)
            lat = run.latency_ms
            say(
                f"run {i + 1}: {run.sent:,} sent, {run.received:,} received, "
                f"{run.achieved_rate:,.0f} msgs/s; p50 {lat['p50']:.2f} ms, "
                f"p99 {lat['p99']:.2f} ms, max {lat['max']:.2f} ms"
            )
            runs.append(run)
    return E2EBenchResult(
        options=options,
        runs=runs,
        started_at=started_at,
        target=_target_text(target, options.data_dir),
        flush_types=flush,
        machine=machine(),
    )


async def _prepare_e2e(
    namesrv: str, options: E2EBenchOptions, say: Say
) -> tuple[int, dict[str, str]]:
    async with AsyncAdminClient(namesrv) as admin:
        queues = await _ensure_topic(admin, options.topic, options.queues, say)
        return queues, await _flush_types(admin, options.topic)


def _e2e_once(
    namesrv: str, options: E2EBenchOptions, group: str, queues: int, meter: Meter, say: Say
) -> E2ERun:

    run_id = int.from_bytes(os.urandom(4), "big")
    rec = _Latencies(run_id)
    consumer = _new_push_consumer(namesrv, group, options, ConsumeFromWhere.LAST_OFFSET, rec.add)
    ctx = multiprocessing.get_context("spawn")
    results: MPQueue[_ProducerReport | str] = ctx.Queue()
    proc = None
    consumer.start()
    try:
        deadline = time.monotonic() + ASSIGN_TIMEOUT_S
        while len(consumer.assignment()) < queues:
            if time.monotonic() > deadline:
                raise ClientError(
                    f"the consumer holds {len(consumer.assignment())} of {queues} queues "
                    f"after {ASSIGN_TIMEOUT_S:g} s"
                )
            time.sleep(0.05)
        proc = ctx.Process(
            target=_e2e_producer_main,
            args=(
                namesrv,
                options.topic,
                options.rate,
                options.size,
                options.warmup_s,
                options.duration_s,
                options.tick_ms / 1000,
                run_id,
                results,
            ),
            name="orbitmq-bench-e2e-producer",
            daemon=True,
        )
        proc.start()
        total = options.warmup_s + options.duration_s
        begun = time.monotonic()
        cpu_before = time.process_time()
        report: _ProducerReport | str | None = None
        while report is None:
            try:
                report = results.get(timeout=0.25)
            except queue.Empty:
                if proc.exitcode not in (None, 0):
                    raise ClientError(f"the producer process died ({proc.exitcode})") from None
                meter("e2e", int(min(total, time.monotonic() - begun) * 10), int(total * 10))
        if isinstance(report, str):
            raise ClientError(f"the producer failed: {report}")
        meter("e2e", int(total * 10), int(total * 10))
        drain_until = time.monotonic() + options.drain_s
        while rec.received < report.sent and time.monotonic() < drain_until:
            time.sleep(0.05)
        cpu_percent = 100 * (time.process_time() - cpu_before) / (time.monotonic() - begun)
    finally:
        if proc is not None:
            proc.join(10)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
        results.close()
        consumer.shutdown()
    latency = _summary(rec.histogram())
    return E2ERun(
        group=group,
        sent=report.sent,
        received=rec.received,
        seconds=report.seconds,
        errors=report.errors,
        latency_ms=latency,
        after_store_ms=_summary(rec.histogram(after_store=True)),
        consumer_cpu_percent=cpu_percent,
        duplicates=rec.duplicates,
        first_error=report.first_error,
    )


def _summary(hist: HdrHistogram) -> dict[str, float]:
    out = {f"p{p:g}": hist.get_value_at_percentile(p) / 1000 for p in PERCENTILES}
    out["max"] = hist.get_max_value() / 1000
    out["mean"] = hist.get_mean_value() / 1000
    return out


def format_e2e_report(result: E2EBenchResult) -> str:
    o = result.options
    m = result.machine
    lines = [
        "OrbitMQ end-to-end latency benchmark (publish -> push consumer)",
        *([f"command: {o.command}"] if o.command else []),
        f"started: {result.started_at}; {m.get('cpus')} x {m.get('cpu')}; {m.get('python')}; "
        f"load {m.get('load average at start')}",
        f"cluster: {result.target}; flush "
        + (", ".join(f"{b} {t}" for b, t in sorted(result.flush_types.items())) or "?"),
        f"topic {o.topic}, {o.size} B bodies, target {o.rate:,.0f} msgs/s for {o.duration_s:g} s "
        f"(+{o.warmup_s:g} s warm-up), a send_batch every {o.tick_ms:g} ms; "
        f"{o.listener} listener, consume batch {o.batch}",
        "latency = listener receive time - producer send time (wall clock, µs HdrHistogram)",
        "",
    ]
    for i, r in enumerate(result.runs, 1):
        lat = r.latency_ms
        extra = ""
        if r.missing:
            extra += f"  MISSING {r.missing:,}"
        if r.errors:
            extra += f"  {r.errors:,} send errors ({r.first_error})"
        if r.duplicates:
            extra += f"  {r.duplicates:,} duplicates"
        lines.append(
            f"run {i}  {r.achieved_rate:,.0f} msgs/s ({r.sent:,} sent, {r.received:,} received)"
            "  ms " + "  ".join(f"{k} {lat[k]:.3f}" for k in _latency_keys()) + extra
        )
        if r.after_store_ms:
            a = r.after_store_ms
            lines.append(
                f"       of which after the broker stored it (ms resolution): p50 {a['p50']:.1f}"
                f"  p99 {a['p99']:.1f}  max {a['max']:.1f}; consumer process CPU "
                f"{r.consumer_cpu_percent:.0f}% of a core"
            )
    lines.append(
        f"median {result.median_rate:,.0f} msgs/s  ms "
        + "  ".join(f"{k} {result.median(k):.3f}" for k in _latency_keys())
        + f"  over {len(result.runs)} run{'s' if len(result.runs) != 1 else ''}"
    )
    return "\n".join(lines)


def _new_push_consumer(
    namesrv: str,
    group: str,
    options: Any,
    where: ConsumeFromWhere,
    sink: Callable[[list[ConsumedMessage]], None],
) -> PushConsumer:
    """A push consumer of ``options.topic`` whose listener (async or thread, as the options
    say) hands every batch to ``sink``; not started. Shared by bench consume and bench e2e."""
    from orbitmq.client.consumer.push import PushConsumer

    consumer = PushConsumer(
        namesrv,
        group,
        PushConfig(
            consume_from_where=where,
            consume_batch_size=options.batch,
            pull_batch_size=options.pull_batch,
            consume_threads=options.threads,
        ),
    )
    consumer.subscribe(options.topic, "*")
    if options.listener == "async":

        async def on_async(msgs: list[ConsumedMessage]) -> ConsumeResult:
            sink(msgs)
            return ConsumeResult.SUCCESS

        consumer.register_listener(on_async)
    else:

        def on_sync(msgs: list[ConsumedMessage]) -> ConsumeResult:
            sink(msgs)
            return ConsumeResult.SUCCESS

        consumer.register_listener(on_sync)
    return consumer

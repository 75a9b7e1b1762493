"""Producer benchmark against a running cluster: ``orbitmq bench produce`` or
``python -m orbitmq.bench produce`` (in the spirit of kafka-producer-perf-test and nats bench).

``--producers N`` starts N producer processes (multiprocessing, spawn) so several cores can
send; with 1 the producer runs in this process. Each producer warms up (route, one message to
every broker of the topic, not counted), waits for a common start signal, then sends its share
of ``--count`` messages (or sends for ``--duration`` seconds) with ``--size``-byte bodies:

    async   ``send_async``: the producer batches automatically (``--batch 0``) and at most
            ``--window`` messages per producer are unanswered; with ``--batch B`` explicit
            ``send_batch`` calls of B messages, up to window/B in flight.
            Latency: from handing a message over to its result (enqueue to result).
    sync    one ``send`` (or ``send_batch`` of B) at a time. Latency: the round trip.
    oneway  one ``send_oneway`` at a time, no answer. Latency: the call (a socket write).

Throughput is messages answered (sent, for oneway) over the longest producer's time from the
start signal to its last answer. Latencies go to an HdrHistogram per producer (microseconds,
3 significant digits), merged for the report. The broker side is reported too: each broker's
flush mode (GET_BROKER_RUNTIME_INFO ``flush_disk_type``) and how many messages the topic's
queues grew by (``stored``: for oneway, shows what arrived).

``--queues N`` creates the topic (or resets its queue count) with N queues per broker; without
it an existing topic is used as it is and a missing one is created with 8.

A CLI calls :func:`run_produce_bench` with :class:`ProduceBenchOptions` and prints
:func:`format_report`.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import datetime
import functools
import json
import logging
import multiprocessing
import os
import platform
import queue
import shlex
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from multiprocessing.queues import Queue as MPQueue
from typing import Any

import numpy as np
from hdrh.histogram import HdrHistogram

from orbitmq.client import AsyncAdminClient, AsyncProducer, Message, MessageQueue, SendResult
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.common.errors import ClientError, MQError
from orbitmq.net.loop import run as run_loop

MODES = ("async", "sync", "oneway")
DEFAULT_TOPIC = "BenchProduce"
DEFAULT_COUNT = 100_000
DEFAULT_QUEUES = 8
HIST_MAX_US = 60_000_000
PERCENTILES = (50.0, 90.0, 99.0, 99.9)
MAX_ERRORS = 1000
"""A producer stops sending after this many failed sends (the report says so)."""
STARTUP_TIMEOUT_S = 60.0
STORED_WAIT_S = 3.0

Progress = Callable[[str], None]


# ---------------------------------------------------------------------------- options/results


@dataclass(slots=True)
class ProduceBenchOptions:
    namesrv: str = "127.0.0.1:9876"
    topic: str = DEFAULT_TOPIC
    producers: int = 1
    size: int = 1024
    count: int | None = None
    """Messages over all producers (default DEFAULT_COUNT unless duration_s is set)."""
    duration_s: float | None = None
    batch: int = 0
    """Explicit send_batch size; 0 relies on the producer's automatic batching."""
    mode: str = "async"
    queues: int | None = None
    cluster: str | None = None
    rate: float = 0.0
    """Target msgs/s over all producers (0: as fast as possible)."""
    window: int = 16_384
    """async: unanswered messages per producer at most."""
    command: str = ""

    def validate(self) -> None:
        problems = []
        if self.mode not in MODES:
            problems.append(f"mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.producers < 1:
            problems.append("producers must be at least 1")
        if self.size < 1:
            problems.append("size must be at least 1 byte")
        if self.count is not None and self.duration_s is not None:
            problems.append("give count or duration, not both")
        if self.count is not None and self.count < self.producers:
            problems.append("count must be at least the number of producers")
        if self.duration_s is not None and self.duration_s <= 0:
            problems.append("duration must be positive")
        if self.batch < 0:
            problems.append("batch must be 0 (automatic) or more")
        if self.batch and self.mode == "oneway":
            problems.append("oneway sends one message at a time: no --batch")
        if self.queues is not None and self.queues < 1:
            problems.append("queues must be at least 1")
        if self.rate < 0 or self.window < 1:
            problems.append("rate must be >= 0 and window >= 1")
        if problems:
            raise ValueError("; ".join(problems))

    def share(self, index: int) -> int | None:
        """Messages producer ``index`` sends (None: until the duration is over)."""
        if self.duration_s is not None:
            return None
        total = self.count if self.count is not None else DEFAULT_COUNT
        base, extra = divmod(total, self.producers)
        return base + (1 if index < extra else 0)


@dataclass(slots=True)
class WorkerResult:
    index: int
    messages: int
    errors: int
    seconds: float
    warmup: int
    first_error: str | None = None
    histogram: str = ""
    """HdrHistogram.encode() of the latencies in microseconds (ASCII)."""


@dataclass(slots=True)
class ProduceBenchResult:
    options: ProduceBenchOptions
    messages: int
    errors: int
    seconds: float
    latency_ms: dict[str, float]
    flush_types: dict[str, str]
    """broker name -> ASYNC_FLUSH / SYNC_FLUSH."""
    stored: int | None
    """How much the topic's queues grew during the run, warm-up included (None: unknown)."""
    warmup: int
    workers: list[WorkerResult]
    started_at: str
    machine: dict[str, str] = field(default_factory=dict)
    first_error: str | None = None

    @property
    def body_bytes(self) -> int:
        return self.messages * self.options.size

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    @property
    def mib_per_s(self) -> float:
        return self.body_bytes / 1024 / 1024 / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for w in data["workers"]:
            w.pop("histogram", None)
        data.update(msgs_per_s=self.msgs_per_s, mib_per_s=self.mib_per_s)
        return data


def new_histogram() -> HdrHistogram:
    return HdrHistogram(1, HIST_MAX_US, 3)


# ---------------------------------------------------------------------------- one producer


class _Recorder:
    """Counts answers and keeps latencies; cheap per message (an append), binned afterwards.

    Latencies (ns) go to an array and into the histogram in bulk (numpy) when the run is over,
    or every SPILL_EVERY samples, so measuring costs the sender little.
    """

    SPILL_EVERY = 4_000_000

    def __init__(self) -> None:
        self.hist = new_histogram()
        self.samples = array.array("q")
        self.ok = 0
        self.errors = 0
        self.first_error: str | None = None

    def success(self, started_ns: int, n: int = 1) -> None:
        if n == 1:
            self.samples.append(time.perf_counter_ns() - started_ns)
            if len(self.samples) >= self.SPILL_EVERY:
                self.spill()
        else:
            us = (time.perf_counter_ns() - started_ns) // 1000
            self.hist.record_value(min(max(us, 1), HIST_MAX_US), n)
        self.ok += n

    def spill(self) -> None:
        """Move the kept samples into the histogram."""
        if not self.samples:
            return
        us = np.clip(np.frombuffer(self.samples, dtype=np.int64) // 1000, 1, HIST_MAX_US)
        values, counts = np.unique(us, return_counts=True)
        for v, c in zip(values.tolist(), counts.tolist(), strict=True):
            self.hist.record_value(v, c)
        self.samples = array.array("q")

    def failure(self, exc: BaseException, n: int = 1) -> None:
        self.errors += n
        if self.first_error is None:
            self.first_error = f"{type(exc).__name__}: {exc}"

    @property
    def give_up(self) -> bool:
        return self.errors >= MAX_ERRORS


async def produce(
    options: ProduceBenchOptions,
    index: int,
    wait_for_start: Callable[[], Awaitable[None]] | None = None,
) -> WorkerResult:
    """One producer: warm up, wait for the start signal, send its share, report."""
    count = options.share(index)
    body = (f"bench {index} ".encode() + b"x" * options.size)[: options.size]
    msg = Message(options.topic, body)
    rec = _Recorder()
    async with AsyncProducer(options.namesrv, ProducerConfig(compress_over_bytes=-1)) as producer:
        info = await producer.routes.get(options.topic)
        first: dict[str, MessageQueue] = {}
        for mq in info.write_queues:
            first.setdefault(mq.broker_name, mq)
        if not first:
            raise ClientError(f"topic {options.topic!r} has no writable queue")
        for mq in first.values():
            await producer.send(msg, queue=mq)
        if wait_for_start is not None:
            await wait_for_start()
        started = time.perf_counter()
        deadline = None if options.duration_s is None else started + options.duration_s
        interval = options.producers / options.rate if options.rate > 0 else 0.0

        sent = 0

        def more() -> bool:
            if rec.give_up:
                return False
            if count is not None:
                return sent < count
            assert deadline is not None
            return time.perf_counter() < deadline

        async def pace() -> bool:
            """Wait for the next send's slot; when it lies past the deadline, wait for that and say False.

            The loop guards against timers that fire a little early (uvloop rounds to
            milliseconds): a send must never go before its slot, or a paced run could
            exceed its rate by one.
            """
            if not interval:
                return True
            due = started + sent * interval
            in_window = deadline is None or due < deadline
            until = due if deadline is None else min(due, deadline)
            while (now := time.perf_counter()) < until:
                await asyncio.sleep(until - now)
            return in_window

        mode, batch = options.mode, options.batch
        if mode == "sync" and batch:
            while more() and await pace():
                n = batch if count is None else min(batch, count - sent)
                t0 = time.perf_counter_ns()
                try:
                    await producer.send_batch([msg] * n)
                    rec.success(t0)
                    rec.ok += n - 1
                except MQError as exc:
                    rec.failure(exc, n)
                sent += n
        elif mode == "sync":
            while more() and await pace():
                t0 = time.perf_counter_ns()
                try:
                    await producer.send(msg)
                    rec.success(t0)
                except MQError as exc:
                    rec.failure(exc)
                sent += 1
        elif mode == "oneway":
            while more() and await pace():
                t0 = time.perf_counter_ns()
                try:
                    await producer.send_oneway(msg)
                    rec.success(t0)
                except MQError as exc:
                    rec.failure(exc)
                sent += 1
        elif batch:
            slots = asyncio.Semaphore(max(1, options.window // batch))
            tasks: set[asyncio.Task[None]] = set()

            async def one(n: int, t0: int) -> None:
                try:
                    await producer.send_batch([msg] * n)
                    rec.success(t0, n)
                except MQError as exc:
                    rec.failure(exc, n)
                finally:
                    slots.release()

            while more() and await pace():
                await slots.acquire()
                n = batch if count is None else min(batch, count - sent)
                task = asyncio.create_task(one(n, time.perf_counter_ns()))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                sent += n
            await asyncio.gather(*tasks)
        else:
            outstanding = 0
            room = asyncio.Event()
            low_water = options.window // 2
            samples = rec.samples  # spilled at the end: a run holds at most a few 10M

            def done(t0: int, fut: asyncio.Future[SendResult]) -> None:
                nonlocal outstanding
                outstanding -= 1
                if fut.cancelled():
                    rec.failure(ClientError("cancelled"))
                elif (exc := fut.exception()) is not None:
                    rec.failure(exc)
                else:
                    samples.append(time.perf_counter_ns() - t0)
                    rec.ok += 1
                if outstanding <= low_water:
                    room.set()

            while more():
                if outstanding >= options.window:
                    room.clear()
                    await room.wait()
                    continue
                if not await pace():
                    break
                t0 = time.perf_counter_ns()
                fut = producer.send_async(msg)
                fut.add_done_callback(functools.partial(done, t0))
                outstanding += 1
                sent += 1
                if sent % 128 == 0:
                    await asyncio.sleep(0)  # let full batches go out
            await producer.flush()
        seconds = time.perf_counter() - started
    rec.spill()
    return WorkerResult(
        index=index,
        messages=rec.ok,
        errors=rec.errors,
        seconds=seconds,
        warmup=len(first),
        first_error=rec.first_error,
        histogram=rec.hist.encode().decode("ascii"),
    )


def _worker_process(
    options: ProduceBenchOptions,
    index: int,
    ready: MPQueue[tuple[int, str | None]],
    go: Any,
    results: MPQueue[WorkerResult | tuple[int, str]],
) -> None:
    """Entry point of a producer process (spawned: it imports this module afresh)."""
    logging.getLogger("orbitmq").setLevel(logging.ERROR)  # the parent reports failures

    async def wait_for_start() -> None:
        ready.put((index, None))
        await asyncio.to_thread(go.wait)

    try:
        result = run_loop(produce(options, index, wait_for_start))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the run
        ready.put((index, f"{type(exc).__name__}: {exc}"))
        results.put((index, f"{type(exc).__name__}: {exc}"))
        return
    results.put(result)


def _run_processes(options: ProduceBenchOptions, progress: Progress) -> list[WorkerResult]:
    ctx = multiprocessing.get_context("spawn")
    ready: MPQueue[tuple[int, str | None]] = ctx.Queue()
    results: MPQueue[WorkerResult | tuple[int, str]] = ctx.Queue()
    go = ctx.Event()
    procs = [
        ctx.Process(
            target=_worker_process,
            args=(options, i, ready, go, results),
            name=f"orbitmq-bench-producer-{i}",
            daemon=True,
        )
        for i in range(options.producers)
    ]
    try:
        for p in procs:
            p.start()
        progress(f"started {len(procs)} producer processes; warming up")
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        for _ in procs:
            try:
                index, problem = ready.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise ClientError("producer processes did not get ready in time") from None
            if problem is not None:
                raise ClientError(f"producer {index} failed to start: {problem}")
        progress("running")
        go.set()
        out: list[WorkerResult] = []
        while len(out) < len(procs):
            try:
                item = results.get(timeout=1.0)
            except queue.Empty:
                dead = [p.name for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise ClientError(f"producer process died: {', '.join(dead)}") from None
                continue
            if isinstance(item, tuple):
                raise ClientError(f"producer {item[0]} failed: {item[1]}")
            out.append(item)
        for p in procs:
            p.join(10)
        return sorted(out, key=lambda w: w.index)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(5)
        ready.close()
        results.close()


# ---------------------------------------------------------------------------- broker side


async def _queue_total(admin: AsyncAdminClient, topic: str) -> int:
    desc = await admin.describe_topic(topic)
    return sum(q.max_offset for s in desc.stats for q in s.queues)


async def _prepare_topic(
    options: ProduceBenchOptions, progress: Progress
) -> tuple[dict[str, str], int]:
    """Create the topic if asked or missing; return the flush mode per broker and queue total."""
    async with AsyncAdminClient(options.namesrv) as admin:
        exists = options.topic in await admin.list_topics()
        if options.queues is not None or not exists:
            queues = options.queues or DEFAULT_QUEUES
            addrs = await admin.create_topic(
                options.topic,
                read_queue_nums=queues,
                write_queue_nums=queues,
                cluster=options.cluster,
            )
            progress(f"topic {options.topic}: {queues} queues on {len(addrs)} broker(s)")
            await _wait_for_queues(admin, options.topic, queues, len(addrs))
        info = await admin.routes.refresh(options.topic)
        names = sorted(info.broker_addrs)
        runtime = await asyncio.gather(
            *(admin.broker_runtime_info(info.broker_addrs[n]) for n in names)
        )
        flush = {
            n: str(rt.get("flush_disk_type", "?")) for n, rt in zip(names, runtime, strict=True)
        }
        return flush, await _queue_total(admin, options.topic)


async def _wait_for_queues(admin: AsyncAdminClient, topic: str, queues: int, brokers: int) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10.0
    while loop.time() < deadline:
        try:
            route = await admin.topic_route(topic)
        except ClientError:
            route = None
        if route is not None:
            ok = [q for q in route.queue_datas if q.write_queue_nums == queues]
            if len(ok) >= brokers:
                return
        await asyncio.sleep(0.1)
    raise ClientError(f"the NameServers do not route {topic!r} with {queues} queues yet")


async def _stored_after(options: ProduceBenchOptions, before: int, expected: int) -> int | None:
    """Queue growth since ``before``, waiting a little for dispatch to catch up."""
    try:
        async with AsyncAdminClient(options.namesrv) as admin:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + STORED_WAIT_S
            grown = await _queue_total(admin, options.topic) - before
            while grown < expected and loop.time() < deadline:
                await asyncio.sleep(0.1)
                grown = await _queue_total(admin, options.topic) - before
            return grown
    except MQError:
        return None


# ---------------------------------------------------------------------------- run and report


def run_produce_bench(
    options: ProduceBenchOptions, progress: Progress | None = None
) -> ProduceBenchResult:
    """Run the benchmark against the cluster at ``options.namesrv``. Raises MQError (cannot
    reach it, no route, a producer failed to start) or ValueError (bad options)."""
    options.validate()
    say: Progress = progress or (lambda _line: None)
    started_at = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    flush, before = run_loop(_prepare_topic(options, say))
    if options.producers == 1:
        say("warming up and running 1 producer in this process")
        workers = [run_loop(produce(options, 0))]
    else:
        workers = _run_processes(options, say)
    hist = new_histogram()
    for w in workers:
        hist.add(HdrHistogram.decode(w.histogram.encode("ascii")))
    messages = sum(w.messages for w in workers)
    warmup = sum(w.warmup for w in workers)
    expected = messages + warmup
    stored = run_loop(_stored_after(options, before, expected))
    latency = {f"p{p:g}": hist.get_value_at_percentile(p) / 1000 for p in PERCENTILES}
    latency["max"] = hist.get_max_value() / 1000
    latency["mean"] = hist.get_mean_value() / 1000
    return ProduceBenchResult(
        options=options,
        messages=messages,
        errors=sum(w.errors for w in workers),
        seconds=max(w.seconds for w in workers),
        latency_ms=latency,
        flush_types=flush,
        stored=stored,
        warmup=warmup,
        workers=workers,
        started_at=started_at,
        machine={
            "python": platform.python_version(),
            "cpus": str(os.cpu_count()),
            "platform": platform.platform(terse=True),
        },
        first_error=next((w.first_error for w in workers if w.first_error), None),
    )


def format_report(result: ProduceBenchResult) -> str:
    o = result.options
    what = f"{o.duration_s:g} s" if o.duration_s is not None else f"{o.count or DEFAULT_COUNT} msgs"
    batching = f"batch {o.batch}" if o.batch else "automatic batching" if o.mode == "async" else ""
    flush = ", ".join(f"{b} {t}" for b, t in sorted(result.flush_types.items()))
    lat = result.latency_ms
    lines = [
        "OrbitMQ producer benchmark",
        *([f"command: {o.command}"] if o.command else []),
        f"started: {result.started_at}; python {result.machine.get('python')}, "
        f"{result.machine.get('cpus')} cpus",
        f"topic {o.topic}, mode {o.mode}{', ' + batching if batching else ''}, "
        f"{o.producers} producer{'s' if o.producers != 1 else ''}, {o.size} B bodies, {what}"
        + (f", rate {o.rate:g} msgs/s" if o.rate else ""),
        f"broker flush: {flush or '?'}",
        "",
        f"messages   {result.messages:,} in {result.seconds:.2f} s"
        + (f" ({result.errors:,} failed)" if result.errors else ""),
        f"throughput {result.msgs_per_s:,.0f} msgs/s, {result.mib_per_s:,.2f} MiB/s",
        "latency ms "
        + "  ".join(f"{k} {v:.3f}" for k, v in lat.items() if k != "mean")
        + f"  (mean {lat['mean']:.3f}; "
        + (
            "enqueue to result"
            if o.mode == "async"
            else "round trip"
            if o.mode == "sync"
            else "send call"
        )
        + ")",
    ]
    if result.stored is not None:
        counted = "sent" if o.mode == "oneway" else "answered"
        lines.append(
            f"stored     {result.stored:,} ({counted} {result.messages:,} + warm-up {result.warmup})"
        )
        missing = result.messages + result.warmup - result.stored
        if missing > 0:
            lines.append(
                f"MISSING    {missing:,} messages are not in the topic's queues "
                f"{STORED_WAIT_S:g} s after the run"
                + (
                    " (oneway sends have no answer: lost without a trace)"
                    if o.mode == "oneway"
                    else ""
                )
            )
    if len(result.workers) > 1:
        lines.append(
            "producers  "
            + ", ".join(
                f"#{w.index} {w.messages / w.seconds if w.seconds else 0:,.0f}/s"
                for w in result.workers
            )
        )
    if result.first_error:
        lines.append(f"first error: {result.first_error}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- CLI glue


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--namesrv", "-n", default=os.environ.get("ORBITMQ_NAMESRV", "127.0.0.1:9876")
    )
    parser.add_argument("--topic", default=DEFAULT_TOPIC)
    parser.add_argument("--producers", type=int, default=1, help="producer processes")
    parser.add_argument("--size", type=int, default=1024, help="body bytes")
    parser.add_argument(
        "--count", type=int, default=None, help=f"messages (default {DEFAULT_COUNT})"
    )
    parser.add_argument("--duration", type=float, default=None, help="seconds, instead of --count")
    parser.add_argument("--batch", type=int, default=0, help="send_batch size; 0: automatic")
    parser.add_argument("--mode", choices=MODES, default="async")
    parser.add_argument(
        "--queues", type=int, default=None, help="(re)create the topic with N queues"
    )
    parser.add_argument("--cluster", default=None)
    parser.add_argument("--rate", type=float, default=0.0, help="target msgs/s, 0: unlimited")
    parser.add_argument("--window", type=int, default=16_384, help="async: in flight per producer")
    parser.add_argument("--json", default=None, help="also write the result as JSON here")


def options_from_args(ns: argparse.Namespace, command: str) -> ProduceBenchOptions:
    options = ProduceBenchOptions(
        namesrv=ns.namesrv,
        topic=ns.topic,
        producers=ns.producers,
        size=ns.size,
        count=ns.count,
        duration_s=ns.duration,
        batch=ns.batch,
        mode=ns.mode,
        queues=ns.queues,
        cluster=ns.cluster,
        rate=ns.rate,
        window=ns.window,
        command=command,
    )
    options.validate()
    return options


def main(argv: list[str], command: str | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="orbitmq bench produce", description=__doc__.split("\n")[0] if __doc__ else None
    )
    add_arguments(parser)
    ns = parser.parse_args(argv)
    cmd = command or shlex.join([sys.executable, "-m", "orbitmq.bench", "produce", *argv])
    try:
        options = options_from_args(ns, cmd)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        result = run_produce_bench(options, lambda line: print(f"  {line}", file=sys.stderr))
    except MQError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(format_report(result))
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(result.to_json(), f, indent=2, default=str)
            f.write("\n")
    return 0 if result.messages else 1

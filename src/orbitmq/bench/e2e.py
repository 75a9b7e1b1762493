"""End-to-end latency benchmark: ``orbitmq bench e2e`` (publish-to-receive latency at a fixed
rate).

A producer in its own process sends at ``rate`` msgs/s (``send_batch`` of what is due every
``tick_ms``, up to 64 batches in flight) for ``warmup_s`` + ``duration_s``; each body starts
with the wall-clock send time (ns), a run id and a "measured" flag. One PushConsumer in this
process (new group, joined and assigned every queue before the producer starts) takes
``time.time_ns()`` when its listener gets a message: latency = receive - send, into an
HdrHistogram (µs). Messages sent during the warm-up are not measured; after the producer stops
the consumer gets ``drain_s`` to receive the rest (what never comes is reported missing).

It runs against ``namesrv`` or its own NameServer + Broker (:mod:`orbitmq.bench.cluster`).
A CLI calls :func:`run_e2e_bench` and prints :func:`format_e2e_report`.
"""

from __future__ import annotations

import array
import asyncio
import datetime
import multiprocessing
import os
import queue
import statistics
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.queues import Queue as MPQueue
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

import numpy as np
from hdrh.histogram import HdrHistogram

from orbitmq.bench.cluster import (
    DEFAULT_QUEUES,
    LISTENERS,
    Meter,
    Say,
    ensure_topic,
    flush_types,
    machine,
    new_group,
    new_push_consumer,
    nothing,
    target_cluster,
    target_text,
)
from orbitmq.client import AsyncAdminClient, AsyncProducer, Message
from orbitmq.client.consumer_types import ConsumedMessage, ConsumeFromWhere
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.common.errors import ClientError, MQError
from orbitmq.common.tasks import TaskSet
from orbitmq.net.loop import run as run_loop

DEFAULT_E2E_TOPIC = "BenchE2E"


HIST_MAX_US = 60_000_000
PERCENTILES = (50.0, 90.0, 99.0, 99.9)


ASSIGN_TIMEOUT_S = 30.0


E2E_IN_FLIGHT = 64
E2E_MAGIC = 0x0E2E
_E2E_HEADER = struct.Struct(">qIHB")
"""e2e body prefix: send time (ns since the epoch), run id, magic, measured flag."""


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
    broker_gc: dict[str, float] = field(default_factory=dict)
    """The brokers' cyclic-GC pauses over 5 ms during the run (``over_5ms``, summed over the
    masters, from runtime info) and the longest pause since their start (``max_ms``); empty
    when runtime info could not be read."""

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
    tasks = TaskSet("bench e2e producer")
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
                tasks.spawn(one(msgs, measured))
                issued += n
            next_due = start + (issued + 1) / rate
            await asyncio.sleep(max(tick_s, next_due - loop.time()))
        seconds = loop.time() - measure_at
        await tasks.wait()
        if tasks.failures:  # not an MQError: a bug, already logged by the set
            raise ClientError(f"{tasks.failures} send task(s) failed unexpectedly (see the log)")
    return _ProducerReport(sent, warm, seconds, errors, first_error)


def run_e2e_bench(
    options: E2EBenchOptions, say: Say | None = None, meter: Meter | None = None
) -> E2EBenchResult:
    options.validate()
    say = say or nothing
    meter = meter or nothing
    started_at = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    with target_cluster(options.namesrv, options.data_dir, say) as target:
        queues, flush = run_loop(_prepare_e2e(target.namesrv, options, say))
        runs = []
        for i in range(options.runs):
            group = new_group("BenchE2E", i)
            say(f"run {i + 1}/{options.runs}: group {group}, {options.rate:g} msgs/s")
            gc_before = run_loop(_broker_gc(target.namesrv))
            run = _e2e_once(target.namesrv, options, group, queues, meter, say)
            gc_after = run_loop(_broker_gc(target.namesrv))
            if gc_before and gc_after:
                run.broker_gc = {
                    "over_5ms": gc_after["over_5ms"] - gc_before["over_5ms"],
                    "max_ms": gc_after["max_ms"],
                }
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
        target=target_text(target, options.data_dir),
        flush_types=flush,
        machine=machine(),
    )


async def _prepare_e2e(
    namesrv: str, options: E2EBenchOptions, say: Say
) -> tuple[int, dict[str, str]]:
    async with AsyncAdminClient(namesrv) as admin:
        queues = await ensure_topic(admin, options.topic, options.queues, say)
        return queues, await flush_types(admin, options.topic)


async def _broker_gc(namesrv: str) -> dict[str, float]:
    """Every master's GC pause counters (runtime info): pauses over 5 ms so far (summed) and
    the longest pause (the largest); empty if a broker does not answer."""
    try:
        async with AsyncAdminClient(namesrv) as admin:
            infos = [await admin.broker_runtime_info(a) for a in (await admin.masters()).values()]
        return {
            "over_5ms": sum(float(i.get("gc_pauses_over_5ms", 0)) for i in infos),
            "max_ms": max(float(i.get("gc_pause_max_ms", 0)) for i in infos),
        }
    except (MQError, ValueError):
        return {}


def _e2e_once(
    namesrv: str, options: E2EBenchOptions, group: str, queues: int, meter: Meter, say: Say
) -> E2ERun:

    run_id = int.from_bytes(os.urandom(4), "big")
    rec = _Latencies(run_id)
    consumer = new_push_consumer(namesrv, group, options, ConsumeFromWhere.LAST_OFFSET, rec.add)
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
        if r.broker_gc:
            g = r.broker_gc
            lines.append(
                f"       broker GC pauses over 5 ms during the run: {g['over_5ms']:.0f} "
                f"(longest since the broker started {g['max_ms']:.1f} ms)"
            )
    lines.append(
        f"median {result.median_rate:,.0f} msgs/s  ms "
        + "  ".join(f"{k} {result.median(k):.3f}" for k in _latency_keys())
        + f"  over {len(result.runs)} run{'s' if len(result.runs) != 1 else ''}"
    )
    return "\n".join(lines)

"""``orbitmq bench spark``: the Spark connector's throughput on a local Spark.

Loads ``count`` messages of ``size`` bytes into a topic (native producer, send_batch calls in
flight), then measures on one SparkSession (``local[2]`` by default):

- batch read: ``spark.read.format("orbitmq")`` of the whole topic into the ``noop`` sink;
- streaming read: ``readStream`` with ``Trigger.AvailableNow`` into ``noop`` (query start
  included, as a user pays it);
- streaming write: the loaded topic read as a stream and written with the orbitmq sink into
  another topic (the sink's default, exactly-once, guarantee);
- per-micro-batch overhead: the median ``triggerExecution`` of tiny micro-batches.

Each figure is the median of ``runs`` runs (the first run of each kind also pays Spark's
warm-up, which is why several are taken).
"""

from __future__ import annotations

import asyncio
import functools
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orbitmq.bench.cluster import target_cluster
from orbitmq.client import AsyncAdminClient, AsyncProducer
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.common.errors import ClientError, MQError
from orbitmq.common.message import Message
from orbitmq.common.tasks import TaskSet

__all__ = ["SparkBenchOptions", "SparkBenchResult", "format_report", "run_spark_bench"]

Say = Callable[[str], None]
LOAD_IN_FLIGHT = 16
LOAD_BATCH = 512


@dataclass(frozen=True, slots=True)
class SparkBenchOptions:
    count: int = 1_000_000
    size: int = 200
    queues: int = 4
    runs: int = 3
    master: str = "local[2]"
    namesrv: str | None = None
    topic: str = ""
    skip_write: bool = False
    ceiling: bool = True
    """Also time Spark on a zero-cost source of the same rows (:mod:`.spark_ceiling`)."""
    write_batch_messages: int = 2000
    overhead_batches: int = 15


@dataclass(slots=True)
class SparkBenchResult:
    count: int
    size: int
    queues: int
    master: str
    load_msgs_per_s: float = 0.0
    batch_read_s: list[float] = field(default_factory=list)
    ceiling_read_s: list[float] = field(default_factory=list)
    ceiling_stream_s: list[float] = field(default_factory=list)
    stream_read_s: list[float] = field(default_factory=list)
    stream_write_s: list[float] = field(default_factory=list)
    write_note: str = ""
    micro_batch_ms: list[float] = field(default_factory=list)

    def rate(self, seconds: list[float]) -> float:
        return self.count / statistics.median(seconds) if seconds else 0.0

    def summary(self) -> dict[str, Any]:
        out = asdict(self)
        out["batch_read_rows_per_s"] = self.rate(self.batch_read_s)
        out["ceiling_read_rows_per_s"] = self.rate(self.ceiling_read_s)
        out["ceiling_stream_rows_per_s"] = self.rate(self.ceiling_stream_s)
        out["stream_read_rows_per_s"] = self.rate(self.stream_read_s)
        out["stream_write_rows_per_s"] = self.rate(self.stream_write_s)
        out["micro_batch_overhead_ms"] = (
            statistics.median(self.micro_batch_ms) if self.micro_batch_ms else None
        )
        return out


async def _prepare_topic(namesrv: str, topic: str, queues: int) -> None:
    async with AsyncAdminClient(namesrv) as admin:
        await admin.create_topic(topic, read_queue_nums=queues, write_queue_nums=queues)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15
        while loop.time() < deadline:
            try:
                if len(await admin.queues(topic)) >= queues:
                    return
            except MQError:
                pass
            await asyncio.sleep(0.1)
    raise ClientError(f"the NameServers do not route {topic!r}")


async def _load(namesrv: str, topic: str, count: int, size: int) -> float:
    """``count`` bodies of ``size`` bytes, send_batch calls in flight, queues in turn; seconds."""
    body = (b"bench-spark " + b"x" * size)[:size]
    async with AsyncProducer(namesrv, ProducerConfig(compress_over_bytes=-1)) as producer:
        queues = list((await producer.routes.get(topic)).write_queues)
        slots = asyncio.Semaphore(LOAD_IN_FLIGHT)
        failures: list[BaseException] = []
        tasks = TaskSet("bench spark preload")

        async def one(n: int, i: int) -> None:
            try:
                await producer.send_batch([Message(topic, body)] * n, queue=queues[i % len(queues)])
            except MQError as exc:
                failures.append(exc)
            finally:
                slots.release()

        started = time.perf_counter()
        sent = i = 0
        while sent < count and not failures:
            await slots.acquire()
            n = min(LOAD_BATCH, count - sent)
            tasks.spawn(one(n, i))
            sent += n
            i += 1
        await tasks.wait()
        if tasks.failures:  # not an MQError: a bug, already logged by the set
            raise ClientError(f"{tasks.failures} send task(s) failed unexpectedly (see the log)")
        if failures:
            raise failures[0]
        return time.perf_counter() - started


def _source(spark: Any, namesrv: str, topic: str, *, stream: bool, **options: str) -> Any:
    reader = (spark.readStream if stream else spark.read).format("orbitmq")
    reader = reader.option("namesrv", namesrv).option("topic", topic)
    if stream:
        reader = reader.option("startingOffsets", "earliest")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def _timed(fn: Callable[[], None]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _measure(
    label: str, fn: Callable[[int], None], o: SparkBenchOptions, into: list[float], say: Say
) -> None:
    """``o.runs`` timed runs of ``fn(run)``, each appended to ``into`` and reported."""
    for run in range(o.runs):
        t = _timed(functools.partial(fn, run))
        into.append(t)
        say(f"{label} {run + 1}/{o.runs}: {t:.2f} s ({o.count / t:,.0f} rows/s)")


def _noop_write(df: Any) -> None:
    df.write.format("noop").mode("overwrite").save()


def _noop_stream(df: Any, tmp: Path, what: str) -> None:
    """``df`` read by an ``availableNow`` query into the noop sink, from a fresh checkpoint."""
    q = (
        df.writeStream.format("noop")
        .option("checkpointLocation", str(tmp / f"read-{uuid.uuid4().hex}"))
        .trigger(availableNow=True)
        .start()
    )
    _await_query(q, what)


def _await_query(q: Any, what: str) -> None:
    """Wait for an availableNow query; its failure becomes a ClientError."""
    q.awaitTermination()
    if q.exception() is not None:
        raise ClientError(f"{what} failed: {q.exception()}")


_LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


def _session(master: str, tmp: Path) -> Any:
    """A quiet session (errors only, on stderr; no UI) whose workers run this interpreter.
    Built here, not with the pipelines' helper: the benchmark layer does not import the
    connector, it only names its format."""
    import os
    import sys

    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    log4j = tmp / "log4j2.properties"
    log4j.write_text(_LOG4J)
    spark = (
        SparkSession.builder.master(master)
        .appName("orbitmq-bench-spark")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}")
        .config("spark.python.authenticate.socketTimeout", "120s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run_spark_bench(o: SparkBenchOptions, say: Say) -> SparkBenchResult:
    result = SparkBenchResult(o.count, o.size, o.queues, o.master)
    with target_cluster(o.namesrv, None, say) as target:
        ns = target.namesrv
        topic = o.topic or f"bench-spark-{uuid.uuid4().hex[:8]}"
        asyncio.run(_prepare_topic(ns, topic, o.queues))
        say(f"loading {o.count:,} messages of {o.size} B into {topic} ({o.queues} queues)")
        seconds = asyncio.run(_load(ns, topic, o.count, o.size))
        result.load_msgs_per_s = o.count / seconds
        tmp = Path(tempfile.mkdtemp(prefix="orbitmq-bench-spark-"))
        spark = _session(o.master, tmp)
        try:
            _measure(
                "batch read",
                lambda _run: _noop_write(_source(spark, ns, topic, stream=False)),
                o,
                result.batch_read_s,
                say,
            )
            if o.ceiling:
                _ceiling_reads(spark, ns, topic, o, tmp, result, say)

            def stream_read(_run: int) -> None:
                _noop_stream(_source(spark, ns, topic, stream=True), tmp, "streaming read")

            _measure("streaming read", stream_read, o, result.stream_read_s, say)
            if o.ceiling:
                _measure(
                    "zero-cost stream",
                    lambda _run: _noop_stream(_ceiling_df(spark, o, tmp, stream=True), tmp, "z"),
                    o,
                    result.ceiling_stream_s,
                    say,
                )
            result.micro_batch_ms = _micro_batch_overhead(spark, ns, topic, o, tmp)
            say(f"micro-batch overhead: median {statistics.median(result.micro_batch_ms):.0f} ms")
            if not o.skip_write:
                _stream_writes(spark, ns, topic, o, tmp, result, say)
        finally:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return result


def _ceiling_reads(
    spark: Any,
    ns: str,
    topic: str,
    o: SparkBenchOptions,
    tmp: Path,
    result: SparkBenchResult,
    say: Say,
) -> None:
    """The batch read's rows from a source that does no work: Spark's own ceiling."""
    from orbitmq.bench.spark_ceiling import ROWS_PER_BATCH, CeilingSource, write_sample

    write_sample(
        _source(spark, ns, topic, stream=False).limit(ROWS_PER_BATCH).toArrow(),
        tmp / "ceiling-sample.arrow",
    )
    spark.dataSource.register(CeilingSource)
    _measure(
        "zero-cost source",
        lambda _run: _noop_write(_ceiling_df(spark, o, tmp, stream=False)),
        o,
        result.ceiling_read_s,
        say,
    )


def _ceiling_df(spark: Any, o: SparkBenchOptions, tmp: Path, *, stream: bool) -> Any:
    """The zero-cost source's ``o.count`` rows (its sample written by :func:`_ceiling_reads`)."""
    from orbitmq.bench.spark_ceiling import FORMAT

    reader = (spark.readStream if stream else spark.read).format(FORMAT)
    return (
        reader.option("sample", str(tmp / "ceiling-sample.arrow"))
        .option("rows", str(o.count))
        .option("partitions", str(o.queues))
        .load()
    )


def _micro_batch_overhead(
    spark: Any, ns: str, topic: str, o: SparkBenchOptions, tmp: Path
) -> list[float]:
    """triggerExecution of micro-batches of 10 rows (the fixed cost of a batch)."""
    q = (
        _source(spark, ns, topic, stream=True, maxOffsetsPerTrigger="10")
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp / "overhead"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            done = [p for p in q.recentProgress if p["numInputRows"]]
            if len(done) >= o.overhead_batches + 2:
                break
            time.sleep(0.2)
        progress = [p for p in q.recentProgress if p["numInputRows"]][2:]  # skip warm-up
        return [float(p["durationMs"]["triggerExecution"]) for p in progress]
    finally:
        q.stop()


def _stream_writes(
    spark: Any,
    ns: str,
    topic: str,
    o: SparkBenchOptions,
    tmp: Path,
    result: SparkBenchResult,
    say: Say,
) -> None:
    import importlib.util

    if importlib.util.find_spec("orbitmq.spark.sink") is None:
        result.write_note = "sink not available"
        return
    result.write_note = f"exactlyOnce, maxBatchMessages={o.write_batch_messages}"

    for run in range(o.runs):  # created before timing: the writes alone are measured
        asyncio.run(_prepare_topic(ns, f"{topic}-out{run}", o.queues))

    def stream_write(run: int) -> None:
        q = (
            _source(spark, ns, topic, stream=True)
            .select("key", "value", "tags")
            .writeStream.format("orbitmq")
            .option("namesrv", ns)
            .option("topic", f"{topic}-out{run}")
            .option("maxBatchMessages", str(o.write_batch_messages))
            .option("checkpointLocation", str(tmp / f"write-{run}"))
            .trigger(availableNow=True)
            .start()
        )
        _await_query(q, "streaming write")

    _measure("streaming write", stream_write, o, result.stream_write_s, say)


def format_report(r: SparkBenchResult, command: str = "") -> str:
    s = r.summary()

    def row(name: str, seconds: list[float], rate: float, target: int) -> str:
        if not seconds:
            return f"{name:<22} {'-':>10} {'-':>14} {target:>12,}"
        med = statistics.median(seconds)
        return f"{name:<22} {med:>9.2f}s {rate:>14,.0f} {target:>12,}"

    lines = [
        f"orbitmq bench spark: {r.count:,} msgs x {r.size} B, {r.queues} queues, {r.master}, "
        f"median of {len(r.batch_read_s)} runs" + (f"\n  {command}" if command else ""),
        f"load (native producer): {r.load_msgs_per_s:,.0f} msgs/s",
        f"{'':<22} {'time':>10} {'rows/s':>14} {'target':>12}",
        row("batch read", r.batch_read_s, s["batch_read_rows_per_s"], 500_000),
    ]
    if r.ceiling_read_s:
        med = statistics.median(r.ceiling_read_s)
        lines.append(
            f"{'  zero-cost source':<22} {med:>9.2f}s {s['ceiling_read_rows_per_s']:>14,.0f}"
            f" {'(Spark alone)':>12}"
        )
    lines.append(row("streaming read", r.stream_read_s, s["stream_read_rows_per_s"], 300_000))
    if r.ceiling_stream_s:
        med = statistics.median(r.ceiling_stream_s)
        lines.append(
            f"{'  zero-cost stream':<22} {med:>9.2f}s {s['ceiling_stream_rows_per_s']:>14,.0f}"
            f" {'(Spark alone)':>12}"
        )
    lines += [
        row("streaming write", r.stream_write_s, s["stream_write_rows_per_s"], 150_000),
    ]
    if r.write_note:
        lines.append(f"  streaming write: {r.write_note}")
    if r.micro_batch_ms:
        lines.append(
            f"micro-batch overhead (10-row batches): median "
            f"{statistics.median(r.micro_batch_ms):.0f} ms, min {min(r.micro_batch_ms):.0f}, "
            f"max {max(r.micro_batch_ms):.0f} ({len(r.micro_batch_ms)} batches)"
        )
    return "\n".join(lines)

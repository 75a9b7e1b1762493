"""Ready-made Spark jobs on the ``orbitmq`` format: what ``orbitmq pipeline`` runs and what the
scripts in ``examples/`` call, so the two never drift apart (docs/spark.md, "Pipelines").

- :func:`aggregate`: JSON events from a topic, counted (and summed) per event-time window with a
  watermark, results as JSON messages to another topic.
- :func:`archive`: a topic into Parquet files partitioned by ``date=YYYY-MM-DD``.
- :func:`dlq_reprocess`: a consumer group's dead-letter queue read in batch, the bodies fixed by
  a Spark expression, each message sent back to the topic it was first sent to.

The streaming jobs run either until the data present at start is processed
(:data:`AVAILABLE_NOW`: a cron job or a backfill) or for ever (:func:`continuous`). Either way
the checkpoint folder is the job's memory: rerun the same command and it continues where it
stopped, with no message read twice (the source is exactly-once) and, for the topic sink, no
message written twice per micro-batch.

Every function takes the SparkSession from its caller (see :mod:`orbitmq.spark.session`) and
imports pyspark lazily, so the CLI can import this module to show its help without Spark.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orbitmq.common.errors import ClientError, ConfigError
from orbitmq.common.message import (
    DELIVERY_PROPERTIES,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
)
from orbitmq.protocol.consumer import (
    DLQ_GROUP_TOPIC_PREFIX,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_POP_CK,
    PROPERTY_RETRY_TOPIC,
)
from orbitmq.protocol.group_config import (
    PROPERTY_DLQ_ORIGIN_MESSAGE_ID,
    PROPERTY_DLQ_ORIGIN_TOPIC,
    PROPERTY_DLQ_REASON,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.readwriter import DataStreamWriter

__all__ = [
    "AVAILABLE_NOW",
    "FORMAT",
    "DlqResult",
    "RunMode",
    "WindowSpec",
    "aggregate",
    "aggregate_frame",
    "archive",
    "archive_frame",
    "continuous",
    "dlq_frame",
    "dlq_reprocess",
    "dlq_topic",
    "ensure_dlq_readable",
    "parse_json",
    "read_batch",
    "read_stream",
    "run_query",
    "to_messages",
    "windowed_aggregation",
]

FORMAT = "orbitmq"


# --------------------------------------------------------------------------- running


@dataclass(frozen=True, slots=True)
class RunMode:
    """How a streaming job runs: up to the data present at start, or until stopped."""

    available_now: bool = True
    interval: str = "1 second"
    """For a continuous run: how often Spark looks for new messages. Each look asks the
    brokers for the queues' end offsets, so an idle topic costs a request per interval."""


AVAILABLE_NOW = RunMode()


def continuous(interval: str = "1 second") -> RunMode:
    """Run until stopped (Ctrl-C), a micro-batch every ``interval`` when there is data."""
    return RunMode(available_now=False, interval=interval)


def _with_trigger(writer: DataStreamWriter, mode: RunMode) -> DataStreamWriter:
    if mode.available_now:
        return writer.trigger(availableNow=True)
    return writer.trigger(processingTime=mode.interval)


def run_query(
    query: StreamingQuery,
    *,
    timeout_s: float | None = None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
) -> bool:
    """Wait for ``query`` to end, calling ``on_progress`` once per finished micro-batch with
    Spark's progress report. Ctrl-C, SIGTERM or ``timeout_s`` stop it cleanly, so the
    checkpoint holds every micro-batch that finished; True when a signal stopped it. A failed
    query raises its error.

    The signals are caught here, not by PySpark's own SIGINT handler, which cancels jobs from
    inside a py4j call and prints tracebacks of the interrupted call."""
    stop = threading.Event()
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    seen: set[int] = set()

    def report() -> None:
        for progress in query.recentProgress:
            batch = int(progress["batchId"])
            if batch not in seen:
                seen.add(batch)
                if on_progress is not None:
                    on_progress(progress)

    try:
        while query.isActive and not stop.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                break
            query.awaitTermination(1)
            report()
        if query.isActive:
            query.stop()
        report()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    error = query.exception()
    if error is not None:
        raise error
    return stop.is_set()


# --------------------------------------------------------------------------- reading


def read_stream(
    spark: SparkSession,
    namesrv: str,
    topic: str,
    *,
    starting_offsets: str = "earliest",
    max_offsets_per_trigger: int | None = None,
    options: Mapping[str, str] | None = None,
) -> DataFrame:
    """A streaming DataFrame over ``topic`` (source schema: docs/spark.md). ``options`` adds any
    other source option (``tagExpression``, ``sqlFilter``, ...)."""
    reader = (
        spark.readStream.format(FORMAT)
        .option("namesrv", namesrv)
        .option("topic", topic)
        .option("startingOffsets", starting_offsets)
    )
    if max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    for key, value in (options or {}).items():
        reader = reader.option(key, value)
    return reader.load()


def read_batch(
    spark: SparkSession,
    namesrv: str,
    topic: str,
    *,
    starting_offsets: str = "earliest",
    ending_offsets: str = "latest",
    options: Mapping[str, str] | None = None,
) -> DataFrame:
    """A batch DataFrame over ``topic`` between two offsets (default: all of it)."""
    reader = (
        spark.read.format(FORMAT)
        .option("namesrv", namesrv)
        .option("topic", topic)
        .option("startingOffsets", starting_offsets)
        .option("endingOffsets", ending_offsets)
    )
    for key, value in (options or {}).items():
        reader = reader.option(key, value)
    return reader.load()


# --------------------------------------------------------------------------- aggregate


@dataclass(frozen=True, slots=True)
class WindowSpec:
    """What :func:`aggregate` computes from JSON events.

    Per ``window`` of event time and per value of the ``group_by`` fields: ``count`` (events)
    and ``sum_<f>`` for each field of ``sums``. Events later than ``watermark`` behind the
    newest event seen are dropped; a window's result is written once, when the watermark
    passes its end (append mode), so the result topic holds final numbers only.
    """

    schema: str
    """The events' fields as Spark DDL, e.g. ``"user STRING, amount DOUBLE, ts TIMESTAMP"``.
    Fields missing from a message are null; a message that is not a JSON object is skipped."""
    time_field: str | None = None
    """The event-time field (a TIMESTAMP in ``schema``); None: the message's born time."""
    window: str = "1 minute"
    watermark: str = "1 minute"
    group_by: tuple[str, ...] = ()
    sums: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        names = {part.split()[0].strip("`").lower() for part in _ddl_fields(self.schema)}
        for name in (
            *self.group_by,
            *self.sums,
            *([self.time_field] if self.time_field else []),
        ):
            if name.lower() not in names:
                raise ConfigError(
                    f"field {name!r} is not in the event schema ({', '.join(sorted(names))})"
                )


def _ddl_fields(ddl: str) -> list[str]:
    """Top-level ``name TYPE`` parts of a DDL string (commas inside <> or () do not split)."""
    parts: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(ddl):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(ddl[start:i])
            start = i + 1
    parts.append(ddl[start:])
    fields = [p.strip() for p in parts if p.strip()]
    if not fields:
        raise ConfigError("the event schema is empty: give fields as 'name TYPE, ...'")
    return fields


def parse_json(frame: DataFrame, schema: str) -> DataFrame:
    """The JSON object in each message's body as columns (``schema``'s fields), next to the
    message's ``msg_id`` and ``born_timestamp``. Bodies that are not a JSON object are dropped:
    an aggregation cannot place them, and the source topic still has them."""
    from pyspark.sql import functions as F

    event = F.from_json(F.col("value").cast("string"), schema)
    return (
        frame.select(event.alias("_event"), "msg_id", "born_timestamp")
        .where(F.col("_event").isNotNull())
        .select(
            "_event.*", F.col("msg_id").alias("_msg_id"), F.col("born_timestamp").alias("_born")
        )
    )


def windowed_aggregation(events: DataFrame, spec: WindowSpec) -> DataFrame:
    """Count (and sum) events per event-time window and group, with ``spec.watermark``.
    Columns: ``window_start``, ``window_end``, the group fields, ``count``, ``sum_<f>``."""
    from pyspark.sql import functions as F

    time_col = spec.time_field or "_born"
    timed = events.where(F.col(time_col).isNotNull()).withWatermark(time_col, spec.watermark)
    aggs = [F.count(F.lit(1)).alias("count")] + [F.sum(f).alias(f"sum_{f}") for f in spec.sums]
    grouped = timed.groupBy(F.window(time_col, spec.window).alias("_window"), *spec.group_by)
    return grouped.agg(*aggs).select(
        F.col("_window.start").alias("window_start"),
        F.col("_window.end").alias("window_end"),
        *spec.group_by,
        "count",
        *[f"sum_{f}" for f in spec.sums],
    )


def to_messages(frame: DataFrame, key_columns: Sequence[str] = ()) -> DataFrame:
    """Each row as one message: ``value`` = the row as a JSON object, ``key`` = the
    ``key_columns`` joined with ``|`` (so consumers can look results up by key)."""
    from pyspark.sql import functions as F

    cols = [F.col(c) for c in frame.columns]
    out = frame.select(F.to_json(F.struct(*cols)).alias("value"), *cols)
    if key_columns:
        key = F.concat_ws("|", *[F.col(c).cast("string") for c in key_columns])
        out = out.withColumn("key", key)
    return out.select("value", *(["key"] if key_columns else []))


def aggregate_frame(
    spark: SparkSession,
    *,
    namesrv: str,
    topic: str,
    spec: WindowSpec,
    starting_offsets: str = "earliest",
    max_offsets_per_trigger: int | None = None,
) -> DataFrame:
    """The streaming result of :func:`aggregate` as messages (``value`` JSON, ``key``),
    before it is written anywhere: to test it, or to send it to another sink."""
    source = read_stream(
        spark,
        namesrv,
        topic,
        starting_offsets=starting_offsets,
        max_offsets_per_trigger=max_offsets_per_trigger,
    )
    result = windowed_aggregation(parse_json(source, spec.schema), spec)
    return to_messages(result, ["window_start", *spec.group_by])


def aggregate(
    spark: SparkSession,
    *,
    namesrv: str,
    topic: str,
    to_topic: str,
    spec: WindowSpec,
    checkpoint: str,
    mode: RunMode = AVAILABLE_NOW,
    starting_offsets: str = "earliest",
    max_offsets_per_trigger: int | None = None,
    sink_options: Mapping[str, str] | None = None,
) -> StreamingQuery:
    """Start the windowed aggregation ``topic`` → ``to_topic``; returns the running query
    (wait with :func:`run_query`). One message per closed window and group, JSON such as
    ``{"window_start": "...", "window_end": "...", "user": "ann", "count": 3, "sum_amount": 7.5}``."""
    messages = aggregate_frame(
        spark,
        namesrv=namesrv,
        topic=topic,
        spec=spec,
        starting_offsets=starting_offsets,
        max_offsets_per_trigger=max_offsets_per_trigger,
    )
    writer = (
        messages.writeStream.format(FORMAT)
        .outputMode("append")
        .option("namesrv", namesrv)
        .option("topic", to_topic)
        .option("checkpointLocation", checkpoint)
        .queryName(f"orbitmq-aggregate-{topic}-to-{to_topic}")
    )
    for key, value in (sink_options or {}).items():
        writer = writer.option(key, value)
    return _with_trigger(writer, mode).start()


# --------------------------------------------------------------------------- archive


def archive_frame(frame: DataFrame, date_column: str = "store_timestamp") -> DataFrame:
    """The source rows plus ``date`` (UTC day of ``date_column``), the Parquet partition."""
    from pyspark.sql import functions as F

    if date_column not in frame.columns:
        raise ConfigError(
            f"date column {date_column!r} is not a source column ({', '.join(frame.columns)})"
        )
    return frame.withColumn("date", F.to_date(F.col(date_column)))


def archive(
    spark: SparkSession,
    *,
    namesrv: str,
    topic: str,
    path: str,
    checkpoint: str | None = None,
    mode: RunMode = AVAILABLE_NOW,
    date_column: str = "store_timestamp",
    starting_offsets: str = "earliest",
    max_offsets_per_trigger: int | None = None,
    source_options: Mapping[str, str] | None = None,
) -> StreamingQuery:
    """Start archiving ``topic`` into Parquet under ``path``, one ``date=YYYY-MM-DD`` folder
    per UTC day of ``date_column`` (``store_timestamp``: when the broker stored it;
    ``born_timestamp``: when the producer sent it). Every source column is kept.

    The checkpoint defaults to ``<path>/_checkpoint`` (Parquet readers skip ``_`` folders).
    Spark's file sink and the checkpoint together make each message land in exactly one
    committed file, however often the job is stopped and rerun."""
    frame = archive_frame(
        read_stream(
            spark,
            namesrv,
            topic,
            starting_offsets=starting_offsets,
            max_offsets_per_trigger=max_offsets_per_trigger,
            options=source_options,
        ),
        date_column,
    )
    writer = (
        frame.writeStream.format("parquet")
        .outputMode("append")
        .partitionBy("date")
        .option("path", path)
        .option("checkpointLocation", checkpoint or f"{path.rstrip('/')}/_checkpoint")
        .queryName(f"orbitmq-archive-{topic}")
    )
    return _with_trigger(writer, mode).start()


# --------------------------------------------------------------------------- DLQ

PROPERTY_REPROCESSED_FROM = "REPROCESSED_FROM"
"""On a message :func:`dlq_reprocess` sent back: the id of the dead-lettered message (the
sink gives the resent message a new id; this keeps the trail)."""

_BOOKKEEPING = tuple(
    sorted(
        DELIVERY_PROPERTIES
        | {
            PROPERTY_TAGS,
            PROPERTY_KEYS,
            PROPERTY_RETRY_TOPIC,
            PROPERTY_ORIGIN_MESSAGE_ID,
            PROPERTY_DLQ_ORIGIN_TOPIC,
            PROPERTY_DLQ_ORIGIN_MESSAGE_ID,
            PROPERTY_DLQ_REASON,
            PROPERTY_POP_CK,
            PROPERTY_UNIQ_KEY,
            PROPERTY_REPROCESSED_FROM,
            "TRAN_BATCH",
        }
    )
)
"""Properties that described a delivery (retries, the DLQ, timers, transactions), travel in
their own columns (tags, keys) or that the sink sets itself (the message id): not sent back."""


def dlq_topic(group: str) -> str:
    return f"{DLQ_GROUP_TOPIC_PREFIX}{group}"


async def _grant_read(namesrv: str, topic: str, wait_s: float) -> bool:
    """Add read permission to ``topic`` on every broker holding it; wait until the
    NameServers route reads to it. False if the topic does not exist (no dead letter yet)."""
    from orbitmq.client import AsyncAdminClient
    from orbitmq.client.route import TopicRouteNotFoundError
    from orbitmq.protocol.bodies import PERM_READ, TopicConfig

    async with AsyncAdminClient(namesrv) as admin:
        try:
            if await admin.queues(topic):
                return True
        except TopicRouteNotFoundError:
            return False
        route = await admin.topic_route(topic)
        for bd in route.broker_datas:
            addr = bd.master_addr()
            if addr is None:
                continue
            for cfg in await admin.topic_configs(addr):
                if cfg.topic_name == topic and not cfg.perm & PERM_READ:
                    fields = {f: getattr(cfg, f) for f in cfg.__struct_fields__}
                    fields["perm"] = cfg.perm | PERM_READ
                    await admin.update_topic(TopicConfig(**fields), broker_addr=addr)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if await admin.queues(topic):
                return True
            await _sleep(0.2)
        raise ClientError(
            f"read permission on {topic} was granted but the NameServers still route no reads "
            f"to it after {wait_s:.0f}s; retry in a moment"
        )


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)


def ensure_dlq_readable(namesrv: str, group: str, *, wait_s: float = 40.0) -> bool:
    """Make ``%DLQ%<group>`` readable by the connector (a DLQ is created write-only, so that
    consumers cannot drain it by mistake; Spark reads by pulling). This is the change
    ``orbitmq topic update -t %DLQ%<group> --perm RW`` makes. False: the group has no DLQ."""
    from orbitmq.net.loop import run

    return run(_grant_read(namesrv, dlq_topic(group), wait_s))


async def _queue_ends(namesrv: str, topic: str) -> dict[str, int]:
    from orbitmq.client import AsyncAdminClient

    async with AsyncAdminClient(namesrv) as admin:
        return {
            f"{q.broker_name}/{q.queue_id}": await admin.max_offset(q)
            for q in await admin.queues(topic)
        }


def _dlq_has_new(namesrv: str, group: str, start: Mapping[str, int]) -> bool:
    """Whether the DLQ holds anything at or after ``start`` (queues it leaves out: from 0)."""
    from orbitmq.net.loop import run

    ends = run(_queue_ends(namesrv, dlq_topic(group)))
    return any(end > max(0, start.get(key, 0)) for key, end in ends.items())


def dlq_frame(
    spark: SparkSession,
    *,
    namesrv: str,
    group: str,
    starting_offsets: str = "earliest",
) -> DataFrame:
    """The group's dead letters in batch, with what reprocessing needs next to the source
    columns: ``origin_topic`` (where it was first sent), ``origin_msg_id``, ``reason`` and
    ``body`` (the value as UTF-8 text)."""
    from pyspark.sql import functions as F

    props = F.col("properties")
    frame = read_batch(spark, namesrv, dlq_topic(group), starting_offsets=starting_offsets)
    return frame.select(
        "*",
        F.coalesce(props[PROPERTY_DLQ_ORIGIN_TOPIC], props[PROPERTY_RETRY_TOPIC]).alias(
            "origin_topic"
        ),
        F.coalesce(
            props[PROPERTY_DLQ_ORIGIN_MESSAGE_ID],
            props[PROPERTY_ORIGIN_MESSAGE_ID],
            F.col("msg_id"),
        ).alias("origin_msg_id"),
        props[PROPERTY_DLQ_REASON].alias("reason"),
        F.col("value").cast("string").alias("body"),
    )


def _start_offsets(starting_offsets: str) -> dict[str, dict[str, int]]:
    """The offsets JSON a run started from (empty for ``earliest``), to carry queues that had
    nothing new into the next run's offsets."""
    text = starting_offsets.strip()
    if text.lower() in ("earliest", "latest", ""):
        return {}
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"starting offsets: not earliest or JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ConfigError("starting offsets: JSON must be an object of topics")
    return {str(t): {str(q): int(o) for q, o in dict(qs).items()} for t, qs in doc.items()}


@dataclass(frozen=True, slots=True)
class DlqResult:
    """What :func:`dlq_reprocess` did."""

    read: int
    """Dead letters read (copies, before the filter and the one-per-id rule)."""
    resent: dict[str, int] = field(default_factory=dict)
    """Messages sent back per original topic (would be sent, on a dry run)."""
    skipped_no_origin: int = 0
    """Copies that name no original topic (nowhere to send them)."""
    next_offsets: str = ""
    """``startingOffsets`` JSON for the next run, to reprocess only newer dead letters."""

    @property
    def total(self) -> int:
        return sum(self.resent.values())


def dlq_reprocess(
    spark: SparkSession,
    *,
    namesrv: str,
    group: str,
    fix: Callable[[Column], Column] | str | None = None,
    where: Column | str | None = None,
    starting_offsets: str = "earliest",
    dry_run: bool = False,
    grant_read: bool = True,
    sink_options: Mapping[str, str] | None = None,
) -> DlqResult:
    """Send the group's dead letters back to their original topics, fixed.

    ``fix`` makes the new body from the old one: a function of the ``body`` column (text), or
    a Spark SQL expression over ``body`` such as ``"replace(body, 'amout', 'amount')"``; None
    sends the body unchanged (binary bodies stay byte for byte). ``where`` (a Column or SQL
    condition over the :func:`dlq_frame` columns) chooses which dead letters to resend. Each
    message id is sent once per run even if it was dead-lettered twice. Tags, keys and user
    properties travel with the message; retry and DLQ bookkeeping does not.

    A batch write is at-least-once, and the DLQ keeps its copies: run again with
    ``starting_offsets=result.next_offsets`` to reprocess only what arrived since.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    if grant_read and not ensure_dlq_readable(namesrv, group):
        return DlqResult(read=0)
    start = _start_offsets(starting_offsets).get(dlq_topic(group))
    if start is not None and not _dlq_has_new(namesrv, group, start):
        return DlqResult(read=0, next_offsets=starting_offsets)  # no Spark job for nothing
    frame = dlq_frame(spark, namesrv=namesrv, group=group, starting_offsets=starting_offsets)
    # One read of the DLQ for the counts, the offsets and the write: pinned in memory (or on
    # disk), so dead letters arriving meanwhile cannot make the numbers disagree.
    frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        read = frame.count()
        ends = frame.groupBy("broker", "queue_id").agg(F.max("queue_offset").alias("last"))
        offsets = _start_offsets(starting_offsets)
        per_queue = offsets.setdefault(dlq_topic(group), {})
        for row in ends.collect():
            per_queue[f"{row['broker']}/{row['queue_id']}"] = int(row["last"]) + 1
        chosen = frame
        if where is not None:
            chosen = chosen.where(F.expr(where) if isinstance(where, str) else where)
        no_origin = chosen.where(F.col("origin_topic").isNull()).count()
        chosen = chosen.where(F.col("origin_topic").isNotNull()).dropDuplicates(["origin_msg_id"])
        if fix is None:
            value = F.col("value")
        else:
            fixed = F.expr(fix) if isinstance(fix, str) else fix(F.col("body"))
            value = fixed.cast("string").cast("binary")
        from orbitmq.spark import commit

        sink_marks = (
            commit.PROPERTY_QUERY,
            commit.PROPERTY_BATCH,
            commit.PROPERTY_ATTEMPT,
            commit.PROPERTY_MARKER_TOPIC,
        )
        dropped = (*_BOOKKEEPING, *sink_marks)
        bookkeeping = F.array(*[F.lit(p) for p in dropped])
        kept = F.map_filter("properties", lambda k, _v: ~F.array_contains(bookkeeping, k))
        trail = F.create_map(F.lit(PROPERTY_REPROCESSED_FROM), F.col("origin_msg_id"))
        out = chosen.select(
            value.alias("value"),
            F.col("origin_topic").alias("topic"),
            F.col("key"),
            F.col("tags"),
            F.map_concat(kept, trail).alias("properties"),
        )
        counts = {r["topic"]: int(r["count"]) for r in out.groupBy("topic").count().collect()}
        if not dry_run and counts:
            writer = out.write.format(FORMAT).mode("append").option("namesrv", namesrv)
            for key, val in (sink_options or {}).items():
                writer = writer.option(key, val)
            writer.save()
        return DlqResult(
            read=read,
            resent=dict(sorted(counts.items())),
            skipped_no_origin=no_origin,
            next_offsets=json.dumps(offsets, sort_keys=True) if per_queue else starting_offsets,
        )
    finally:
        frame.unpersist()

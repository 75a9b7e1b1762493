"""The windowed-aggregation job (:func:`aggregate`): JSON events from a topic, counted (and
summed) per event-time window with a watermark, one JSON result message per closed window and
group to another topic through the exactly-once streaming sink."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orbitmq.common.errors import ConfigError
from orbitmq.spark.pipelines.running import (
    AVAILABLE_NOW,
    FORMAT,
    RunMode,
    read_stream,
    with_trigger,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = [
    "WindowSpec",
    "aggregate",
    "aggregate_frame",
    "parse_json",
    "to_messages",
    "windowed_aggregation",
]


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
    return with_trigger(writer, mode).start()

"""The archive job (:func:`archive`): a topic into Parquet files partitioned by
``date=YYYY-MM-DD``, Spark's file sink and the checkpoint making each message land in exactly
one committed file."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from orbitmq.common.errors import ConfigError
from orbitmq.spark.pipelines.running import AVAILABLE_NOW, RunMode, read_stream, with_trigger

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = ["archive", "archive_frame"]


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
    return with_trigger(writer, mode).start()

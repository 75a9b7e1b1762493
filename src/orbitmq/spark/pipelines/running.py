"""How the ready-made jobs run and read: the run modes (:data:`AVAILABLE_NOW`,
:func:`continuous`), :func:`run_query` (wait, report progress, stop cleanly on a signal), and
the source readers every job starts from (:func:`read_stream`, :func:`read_batch`).

pyspark is imported only for types, so the CLI can import this to show its help without Spark.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.readwriter import DataStreamWriter

__all__ = [
    "AVAILABLE_NOW",
    "FORMAT",
    "RunMode",
    "continuous",
    "read_batch",
    "read_stream",
    "run_query",
    "with_trigger",
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


def with_trigger(writer: DataStreamWriter, mode: RunMode) -> DataStreamWriter:
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

"""``orbitmq pipeline``: the ready-made Spark jobs of :mod:`orbitmq.spark.pipelines`.

``archive`` (a topic into date-partitioned Parquet), ``aggregate`` (JSON events into windowed
counts on another topic) and ``dlq-reprocess`` (a group's dead letters, fixed, back to their
topics). Each runs on a local Spark (``local[*]``) unless ``--master`` names a cluster.

pyspark is imported inside the commands only: ``orbitmq --help`` stays fast and works without
the ``spark`` extra; a command run without it says how to install it (exit 1). Spark's own
logging is kept to errors on stderr; the command prints a line per micro-batch on stderr and
its result on stdout. docs/spark.md.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from orbitmq.cli.common import DEFAULT_NAMESRV, NamesrvOpt, err, fail, out
from orbitmq.common.errors import MQError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from orbitmq.spark.pipelines import RunMode

pipeline_app = typer.Typer(
    no_args_is_help=True,
    help="Spark jobs on OrbitMQ topics: archive to Parquet, windowed aggregation, DLQ "
    "reprocessing (needs the spark extra: pip install 'orbitmq\\[spark]').",
)

INSTALL_HINT = "pip install 'orbitmq[spark]'"

MasterOpt = Annotated[
    str,
    typer.Option(
        "--master",
        help="Spark master: local[*], local[4], spark://host:7077, yarn, k8s://https://host:443.",
        envvar="ORBITMQ_SPARK_MASTER",
    ),
]
ConfOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--conf",
        help="A Spark setting KEY=VALUE (repeatable), e.g. spark.executor.memory=2g.",
    ),
]
SparkLogOpt = Annotated[
    str,
    typer.Option(
        "--spark-log-level",
        help="Spark's own log level, on stderr (ERROR or INFO to see why a job failed).",
    ),
]
AvailableNowOpt = Annotated[
    bool,
    typer.Option(
        "--available-now/--continuous",
        help="Process what the topic holds now, then exit; or keep running until Ctrl-C.",
    ),
]
IntervalOpt = Annotated[
    str, typer.Option("--interval", help="With --continuous: how often to look for new messages.")
]
StartOpt = Annotated[
    str,
    typer.Option(
        "--starting-offsets",
        help="Where a new job starts: earliest, latest or offsets JSON (a rerun with the same "
        "checkpoint continues where it stopped instead).",
    ),
]
MaxPerTriggerOpt = Annotated[
    int | None,
    typer.Option("--max-per-batch", min=1, help="At most this many messages per micro-batch."),
]
TopicIn = Annotated[str, typer.Option("--topic", "-t", help="Topic to read.")]


# --------------------------------------------------------------------------- Spark plumbing


def _conf(pairs: list[str] | None) -> dict[str, str]:
    conf: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"{pair!r}: expected KEY=VALUE", param_hint="--conf")
        conf[key.strip()] = value
    return conf


def _spark(master: str, conf: list[str] | None, log_level: str, app: str) -> SparkSession:
    """The session, or a one-line reason why there cannot be one (exit 1)."""
    missing = [m for m in ("pyspark", "pyarrow") if importlib.util.find_spec(m) is None]
    if missing:
        fail(f"this command runs on Spark, and {missing[0]} is not installed: {INSTALL_HINT}")
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        fail("Spark needs Java 17 or newer: install a JDK (e.g. apt-get install openjdk-17-jre)")
    from orbitmq.spark.session import SessionOptions, build_session

    options = SessionOptions(master=master, app_name=app, log_level=log_level, conf=_conf(conf))
    try:
        return build_session(options)
    except ValueError as exc:
        fail(str(exc), 2)
    except Exception as exc:  # noqa: BLE001 - the JVM failing to start: one line, not a trace
        fail(f"Spark did not start: {_spark_error(exc)}")


_PY_ERROR = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception)): (.+)$")


def _spark_error(exc: BaseException) -> str:
    """One readable line out of a Spark error: its first line, and the Python error a worker
    raised when the JVM wraps one (an OrbitMQ error first: the option a user got wrong, say,
    rather than what PySpark's runner raised while handling it)."""
    text = str(exc).strip() or type(exc).__name__
    lines = [line.strip() for line in text.splitlines()]
    first = lines[0].split("Traceback (most recent call last)")[0].rstrip(" :")
    causes = [(line, m) for line in lines if (m := _PY_ERROR.match(line))]
    ours = [c for c in causes if c[0].startswith("orbitmq.")]
    if not causes:
        return first
    _, m = ours[0] if ours else causes[-1]
    cause = f"{m.group(1)}: {m.group(2)}"
    if not first or m.group(2) in first:
        return cause
    return f"{first}: {cause}"


def _mode(available_now: bool, interval: str) -> RunMode:
    from orbitmq.spark.pipelines import AVAILABLE_NOW, continuous

    return AVAILABLE_NOW if available_now else continuous(interval)


def _watch(query: StreamingQuery, what: str) -> int:
    """Wait for the query with a line on stderr per micro-batch; Ctrl-C or SIGTERM stop it
    cleanly (the checkpoint keeps every finished micro-batch). Returns the messages read."""
    from orbitmq.spark.pipelines import run_query

    console = err()
    total = 0

    def progress(p: dict[str, Any]) -> None:
        nonlocal total
        rows = int(p.get("numInputRows") or 0)
        total += rows
        if rows:
            ms = p.get("durationMs", {}).get("triggerExecution", 0)
            console.print(f"batch {p['batchId']}: {rows} messages in {ms} ms", highlight=False)

    if run_query(query, on_progress=progress):
        console.print(f"stopped {what} (the checkpoint keeps what is done)")
    return total


def _guard(what: str, start: float) -> Any:
    """Context for a command body: OrbitMQ and Spark errors become one red line."""
    import contextlib

    @contextlib.contextmanager
    def guard() -> Any:
        try:
            yield
        except typer.Exit:
            raise
        except MQError as exc:
            fail(f"{what}: {exc}")
        except Exception as exc:  # Spark's errors come as many JVM/py4j types
            if type(exc).__module__.startswith(("pyspark", "py4j")):
                fail(f"{what} failed after {time.monotonic() - start:.1f}s: {_spark_error(exc)}")
            raise

    return guard()


# --------------------------------------------------------------------------- commands


@pipeline_app.command("archive")
def archive(
    topic: TopicIn,
    to: Annotated[
        str, typer.Option("--to", help="Folder (or URL: hdfs://, s3a://) for the Parquet files.")
    ],
    checkpoint: Annotated[
        str | None,
        typer.Option(help="Checkpoint folder (default: <to>/_checkpoint). Keep it to resume."),
    ] = None,
    date_column: Annotated[
        str,
        typer.Option(help="Partition by the UTC date of store_timestamp or born_timestamp."),
    ] = "store_timestamp",
    available_now: AvailableNowOpt = True,
    interval: IntervalOpt = "1 second",
    starting_offsets: StartOpt = "earliest",
    max_per_batch: MaxPerTriggerOpt = None,
    master: MasterOpt = "local[*]",
    conf: ConfOpt = None,
    spark_log_level: SparkLogOpt = "FATAL",
    namesrv: NamesrvOpt = DEFAULT_NAMESRV,
) -> None:
    """Archive a topic into Parquet, one date=YYYY-MM-DD folder per day.

    Every message lands in exactly one file, however often the job is stopped and rerun with the same checkpoint.

    Example: orbitmq pipeline archive -t Orders --to ./archive/orders
    """
    from orbitmq.spark import pipelines

    start = time.monotonic()
    spark = _spark(master, conf, spark_log_level, f"orbitmq-archive-{topic}")
    with _guard("archive", start):
        query = pipelines.archive(
            spark,
            namesrv=namesrv,
            topic=topic,
            path=to,
            checkpoint=checkpoint,
            mode=_mode(available_now, interval),
            date_column=date_column,
            starting_offsets=starting_offsets,
            max_offsets_per_trigger=max_per_batch,
        )
        total = _watch(query, f"archive of {topic}")
    out().print(
        f"archived {total} messages of {escape(topic)} to {escape(to)} "
        f"in {time.monotonic() - start:.1f}s",
        soft_wrap=True,
    )


@pipeline_app.command("aggregate")
def aggregate(
    topic: TopicIn,
    to: Annotated[str, typer.Option("--to", help="Topic for the results (JSON, one a window).")],
    schema: Annotated[
        str,
        typer.Option(
            "--schema",
            help="The JSON events' fields as Spark DDL: 'user STRING, amount DOUBLE, ts TIMESTAMP'.",
        ),
    ],
    time_field: Annotated[
        str | None,
        typer.Option(help="Event-time field (TIMESTAMP); default: when the message was sent."),
    ] = None,
    window: Annotated[str, typer.Option(help="Window length.")] = "1 minute",
    watermark: Annotated[
        str, typer.Option(help="How late an event may come; a window is final after this.")
    ] = "1 minute",
    group_by: Annotated[
        list[str] | None, typer.Option("--group-by", help="Group by this field (repeatable).")
    ] = None,
    sum_: Annotated[
        list[str] | None, typer.Option("--sum", help="Also sum this field (repeatable).")
    ] = None,
    checkpoint: Annotated[
        str | None,
        typer.Option(help="Checkpoint folder (default: ./orbitmq-checkpoints/aggregate-T-TO)."),
    ] = None,
    available_now: AvailableNowOpt = True,
    interval: IntervalOpt = "1 second",
    starting_offsets: StartOpt = "earliest",
    max_per_batch: MaxPerTriggerOpt = None,
    master: MasterOpt = "local[*]",
    conf: ConfOpt = None,
    spark_log_level: SparkLogOpt = "FATAL",
    namesrv: NamesrvOpt = DEFAULT_NAMESRV,
) -> None:
    """Count (and sum) JSON events per event-time window into another topic.

    One message per window and group once the watermark closes the window: {"window_start": ..., "window_end": ..., "user": "ann", "count": 3, "sum_amount": 7.5}.

    Example: orbitmq pipeline aggregate -t Clicks --to ClickCounts --schema 'page STRING, ts TIMESTAMP' --time-field ts --group-by page --continuous
    """
    from orbitmq.spark import pipelines

    try:
        spec = pipelines.WindowSpec(
            schema=schema,
            time_field=time_field,
            window=window,
            watermark=watermark,
            group_by=tuple(group_by or ()),
            sums=tuple(sum_ or ()),
        )
    except MQError as exc:
        fail(str(exc), 2)
    start = time.monotonic()
    spark = _spark(master, conf, spark_log_level, f"orbitmq-aggregate-{topic}")
    where = checkpoint or str(Path("orbitmq-checkpoints") / f"aggregate-{topic}-{to}")
    with _guard("aggregate", start):
        query = pipelines.aggregate(
            spark,
            namesrv=namesrv,
            topic=topic,
            to_topic=to,
            spec=spec,
            checkpoint=where,
            mode=_mode(available_now, interval),
            starting_offsets=starting_offsets,
            max_offsets_per_trigger=max_per_batch,
        )
        total = _watch(query, f"aggregation of {topic}")
    out().print(
        f"aggregated {total} messages of {escape(topic)} into {escape(to)} "
        f"in {time.monotonic() - start:.1f}s (checkpoint {escape(where)})",
        soft_wrap=True,
    )


@pipeline_app.command("dlq-reprocess")
def dlq_reprocess(
    group: Annotated[str, typer.Option("--group", "-g", help="Consumer group whose DLQ to read.")],
    fix: Annotated[
        str | None,
        typer.Option(
            help="Spark SQL expression over `body` (text) giving the new body, e.g. "
            "\"replace(body, 'amout', 'amount')\". Default: the body unchanged."
        ),
    ] = None,
    where: Annotated[
        str | None,
        typer.Option(
            help="Only dead letters matching this SQL condition (columns: body, origin_topic, "
            "reason, tags, reconsume_times, properties, ...)."
        ),
    ] = None,
    starting_offsets: Annotated[
        str,
        typer.Option(
            "--starting-offsets",
            help="earliest, or the JSON a previous run printed (only newer dead letters).",
        ),
    ] = "earliest",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count what would be resent; send nothing.")
    ] = False,
    master: MasterOpt = "local[*]",
    conf: ConfOpt = None,
    spark_log_level: SparkLogOpt = "FATAL",
    namesrv: NamesrvOpt = DEFAULT_NAMESRV,
) -> None:
    """Send a group's dead letters back to their original topics, bodies fixed.

    The DLQ is made readable first (it is created write-only). At-least-once: the DLQ keeps its copies, so pass the printed --starting-offsets next time to skip them.

    Example: orbitmq pipeline dlq-reprocess -g Billing --fix "replace(body, 'EUR ', '')"
    """
    from orbitmq.spark import pipelines

    start = time.monotonic()
    spark = _spark(master, conf, spark_log_level, f"orbitmq-dlq-{group}")
    with _guard("dlq-reprocess", start):
        result = pipelines.dlq_reprocess(
            spark,
            namesrv=namesrv,
            group=group,
            fix=fix,
            where=where,
            starting_offsets=starting_offsets,
            dry_run=dry_run,
        )
    console = out()
    verb = "would resend" if dry_run else "resent"
    for topic, n in result.resent.items():
        console.print(f"{verb} {n} to {escape(topic)}", soft_wrap=True)
    console.print(
        f"{result.read} dead letters read, {result.total} {verb}"
        + (
            f", {result.skipped_no_origin} without an original topic"
            if result.skipped_no_origin
            else ""
        ),
        soft_wrap=True,
    )
    if result.next_offsets:
        console.print(f"next run: --starting-offsets '{result.next_offsets}'", soft_wrap=True)

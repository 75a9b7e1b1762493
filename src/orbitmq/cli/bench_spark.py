"""``orbitmq bench spark``: the Spark connector's read and write throughput
(:mod:`orbitmq.bench.spark`)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from orbitmq.cli.common import err, expected_errors, out, quiet_library_logs


def _say(line: str) -> None:
    err().print(f"[dim]{escape(line)}[/]", soft_wrap=True)


def bench_spark(
    count: Annotated[int, typer.Option("--count", min=1, help="Messages to load.")] = 1_000_000,
    size: Annotated[int, typer.Option("--size", min=1, help="Body size in bytes.")] = 200,
    queues: Annotated[int, typer.Option("--queues", min=1, help="Queues of the topic.")] = 4,
    runs: Annotated[int, typer.Option("--runs", min=1, help="Runs of each measure.")] = 3,
    master: Annotated[str, typer.Option("--master", help="Spark master.")] = "local[2]",
    namesrv: Annotated[
        str | None,
        typer.Option(
            "--namesrv",
            "-n",
            help="A running cluster's NameServers; default: start a NameServer + Broker.",
        ),
    ] = None,
    skip_write: Annotated[
        bool, typer.Option("--skip-write", help="Do not measure the streaming write.")
    ] = False,
    ceiling: Annotated[
        bool,
        typer.Option(
            "--ceiling/--no-ceiling",
            help="Also time Spark on a zero-cost source of the same rows (Spark's own ceiling).",
        ),
    ] = True,
    write_batch: Annotated[
        int, typer.Option("--write-batch", min=1, help="Sink option maxBatchMessages.")
    ] = 2000,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the result as JSON here.")
    ] = None,
) -> None:
    """Spark connector: batch read, streaming read and write rows/s, micro-batch overhead."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        err().print("[red]pyspark is not installed: pip install 'orbitmq[spark]'[/]")
        raise typer.Exit(2) from None
    from orbitmq.bench.spark import SparkBenchOptions, format_report, run_spark_bench

    options = SparkBenchOptions(
        count=count, size=size, queues=queues, runs=runs, master=master, namesrv=namesrv,
        skip_write=skip_write, ceiling=ceiling, write_batch_messages=write_batch,
    )  # fmt: skip
    command = shlex.join(["orbitmq", *sys.argv[1:]]) if sys.argv[1:3] == ["bench", "spark"] else ""
    with quiet_library_logs(), expected_errors():
        result = run_spark_bench(options, _say)
    out().print(escape(format_report(result, command)), soft_wrap=True)
    if json_path is not None:
        summary = result.summary()
        summary["command"] = command
        json_path.write_text(json.dumps(summary, indent=2) + "\n")

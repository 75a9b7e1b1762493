"""``orbitmq bench produce``: the producer benchmark (:mod:`orbitmq.bench.produce`)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from orbitmq.bench.produce import (
    APIS,
    DEFAULT_COUNT,
    DEFAULT_TOPIC,
    MODES,
    ProduceBenchOptions,
    format_report,
    run_produce_bench,
)
from orbitmq.cli.common import (
    DEFAULT_NAMESRV,
    NamesrvOpt,
    err,
    expected_errors,
    out,
    quiet_library_logs,
)


def bench_produce(
    topic: Annotated[str, typer.Option("--topic", "-t", help="Topic to send to.")] = DEFAULT_TOPIC,
    producers: Annotated[
        int, typer.Option("--producers", "-p", min=1, help="Producer processes.")
    ] = 1,
    size: Annotated[int, typer.Option("--size", min=1, help="Body size in bytes.")] = 1024,
    count: Annotated[
        int | None,
        typer.Option("--count", min=1, help=f"Messages in all (default {DEFAULT_COUNT:,})."),
    ] = None,
    duration: Annotated[
        float | None, typer.Option("--duration", help="Send for this many seconds instead.")
    ] = None,
    batch: Annotated[
        int, typer.Option("--batch", min=0, help="Explicit send_batch size; 0: automatic.")
    ] = 0,
    mode: Annotated[str, typer.Option("--mode", help="async, sync or oneway.")] = "async",
    api: Annotated[
        str, typer.Option("--api", help="async (AsyncProducer) or blocking (Producer).")
    ] = "async",
    queues: Annotated[
        int | None,
        typer.Option("--queues", min=1, help="Create (or reset) the topic with N queues."),
    ] = None,
    cluster: Annotated[str | None, typer.Option("--cluster", "-c", help="Cluster.")] = None,
    rate: Annotated[
        float, typer.Option("--rate", min=0, help="Target msgs/s in all; 0: unlimited.")
    ] = 0.0,
    window: Annotated[
        int, typer.Option("--window", min=1, help="async: unanswered messages per producer.")
    ] = 16_384,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the result as JSON here.")
    ] = None,
    namesrv: NamesrvOpt = DEFAULT_NAMESRV,
) -> None:
    """Producer throughput and latency against a running cluster.

    Example: orbitmq bench produce --producers 2 --size 1024 --count 200000 --mode async
    (add --api blocking to send through the blocking Producer instead)
    """
    if mode not in MODES:
        raise typer.BadParameter(f"{mode!r}: one of {', '.join(MODES)}", param_hint="--mode")
    if api not in APIS:
        raise typer.BadParameter(f"{api!r}: one of {', '.join(APIS)}", param_hint="--api")
    options = ProduceBenchOptions(
        namesrv=namesrv,
        topic=topic,
        producers=producers,
        size=size,
        count=count,
        duration_s=duration,
        batch=batch,
        mode=mode,
        queues=queues,
        cluster=cluster,
        rate=rate,
        window=window,
        api=api,
        command=shlex.join(["orbitmq", "bench", "produce", *sys.argv[3:]])
        if sys.argv[1:3] == ["bench", "produce"]
        else "",
    )
    try:
        options.validate()
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    progress = err()
    with expected_errors(), quiet_library_logs():
        result = run_produce_bench(options, lambda line: progress.print(f"[dim]{escape(line)}[/]"))
    out().print(escape(format_report(result)), soft_wrap=True)
    if json_path is not None:
        json_path.write_text(json.dumps(result.to_json(), indent=2, default=str) + "\n")
    if not result.messages:
        raise typer.Exit(1)

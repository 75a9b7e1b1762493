"""``orbitmq bench grpc``: the official RocketMQ 5 Python client via the gRPC proxy against the
native SDK, side by side (:mod:`orbitmq.bench.grpc`)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from orbitmq.bench.grpc import (
    DEFAULT_COUNT,
    DEFAULT_RECEIVE_THREADS,
    DEFAULT_RUNS,
    DEFAULT_THREADS,
    DEFAULT_TOPIC,
    GrpcBenchOptions,
    format_report,
    run_grpc_bench,
)
from orbitmq.cli.common import err, expected_errors, out, quiet_library_logs


def bench_grpc(
    namesrv: Annotated[
        str | None,
        typer.Option(
            "--namesrv",
            "-n",
            help="A running cluster's NameServer (with --proxy); default: start one.",
        ),
    ] = None,
    proxy: Annotated[
        str | None, typer.Option("--proxy", help="The gRPC proxy host:port (with --namesrv).")
    ] = None,
    topic: Annotated[
        str, typer.Option("--topic", "-t", help="Topic prefix (<topic>Grpc, <topic>Native).")
    ] = DEFAULT_TOPIC,
    threads: Annotated[
        int, typer.Option("--threads", min=1, help="Sending threads sharing one producer.")
    ] = DEFAULT_THREADS,
    count: Annotated[
        int, typer.Option("--count", min=1, help="Sync sends per side per run.")
    ] = DEFAULT_COUNT,
    size: Annotated[int, typer.Option("--size", min=1, help="Body size in bytes.")] = 1024,
    receive_threads: Annotated[
        int, typer.Option("--receive-threads", min=1, help="Receiving threads.")
    ] = DEFAULT_RECEIVE_THREADS,
    runs: Annotated[
        int, typer.Option("--runs", min=1, help="Runs (medians are reported).")
    ] = DEFAULT_RUNS,
    receive: Annotated[
        bool, typer.Option("--receive/--no-receive", help="Also measure receiving.")
    ] = True,
    proxy_tls: Annotated[
        str,
        typer.Option(
            "--proxy-tls", help="TLS mode of the proxy started here: permissive, required, off."
        ),
    ] = "permissive",
    floor: Annotated[
        bool,
        typer.Option(
            "--floor/--no-floor",
            help="Also measure a bare Python gRPC echo server (the floor under the proxy).",
        ),
    ] = True,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the result as JSON here.")
    ] = None,
) -> None:
    """Official RocketMQ 5 Python client via the gRPC proxy vs the native SDK.

    Example: orbitmq bench grpc --threads 16 --count 10000 --runs 3
    """
    options = GrpcBenchOptions(
        namesrv=namesrv,
        proxy=proxy,
        topic=topic,
        threads=threads,
        count=count,
        size=size,
        receive_threads=receive_threads,
        runs=runs,
        receive=receive,
        proxy_tls=proxy_tls,
        floor=floor,
        command=shlex.join(["orbitmq", "bench", "grpc", *sys.argv[3:]])
        if sys.argv[1:3] == ["bench", "grpc"]
        else "",
    )
    try:
        options.validate()
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    progress = err()
    with expected_errors(), quiet_library_logs():
        result = run_grpc_bench(options, lambda line: progress.print(f"[dim]{escape(line)}[/]"))
    out().print(escape(format_report(result)), soft_wrap=True)
    if json_path is not None:
        json_path.write_text(json.dumps(result.to_json(), indent=2, default=str) + "\n")
    if not all(run["grpc"].sent and run["native"].sent for run in result.runs):
        raise typer.Exit(1)

"""``orbitmq bench sink-commit``: the exactly-once sink's half-batch commit beside the same rows
through the idempotent producer, in one run (:mod:`orbitmq.spark.sink_ab`)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from orbitmq.bench.cluster import target_cluster
from orbitmq.spark.sink_ab import run_sink_ab


def bench_sink_commit(
    rows: Annotated[int, typer.Option("--rows", min=1, help="Rows per protocol.")] = 20_000,
    size: Annotated[int, typer.Option("--size", min=1, help="Body bytes.")] = 200,
    chunk: Annotated[int, typer.Option("--chunk", min=1, help="Rows per send.")] = 1000,
    queues: Annotated[int, typer.Option("--queues", min=1, help="Queues per topic.")] = 4,
    namesrv: Annotated[
        str | None, typer.Option("--namesrv", "-n", help="A running cluster; default: start one.")
    ] = None,
) -> None:
    """Time the Spark sink's write+commit (half batches, marker, COMMITs) and an idempotent
    producer writing the same rows, one after the other on the same cluster."""
    with target_cluster(namesrv, None, lambda s: typer.echo(s, err=True)) as target:
        result = asyncio.run(run_sink_ab(target.namesrv, rows, size, chunk, queues))
    typer.echo(result.text())

"""``orbitmq bench ...``: the benchmark commands in one group (figures go in
docs/benchmarks.md).

A group of its own, imported by :mod:`orbitmq.cli.main` only when a ``bench`` command runs
(:mod:`orbitmq.cli.lazy`): the benchmarks bring gRPC models, clients and the in-process
cluster, which no server start needs.
"""

from __future__ import annotations

import typer

from orbitmq.cli import auth as auth_cli
from orbitmq.cli import (
    bench_consume,
    bench_grpc,
    bench_kafka,
    bench_produce,
    bench_sink,
    bench_spark,
    bench_timer,
)

bench_app = typer.Typer(help="Benchmarks (figures go in docs/benchmarks.md).", no_args_is_help=True)


@bench_app.command(
    "store", context_settings={"allow_extra_args": True, "ignore_unknown_options": True}
)
def bench_store(ctx: typer.Context) -> None:
    """Storage engine benchmark (options: see `orbitmq bench store --help`)."""
    from orbitmq.bench.__main__ import main as bench_main

    raise typer.Exit(bench_main(["store", *ctx.args]))


@bench_app.command(
    "proxy", context_settings={"allow_extra_args": True, "ignore_unknown_options": True}
)
def bench_proxy(ctx: typer.Context) -> None:
    """gRPC proxy SendMessage vs a bare grpc.aio echo, asyncio generator (options: see
    `orbitmq bench proxy --help`)."""
    from orbitmq.bench.__main__ import main as bench_main

    raise typer.Exit(bench_main(["proxy", *ctx.args]))


bench_app.command("produce")(bench_produce.bench_produce)
bench_app.command("consume")(bench_consume.bench_consume)
bench_app.command("e2e")(bench_consume.bench_e2e)
bench_app.command("timer")(bench_timer.bench_timer)
bench_app.command("grpc")(bench_grpc.bench_grpc)
bench_app.command("spark")(bench_spark.bench_spark)
bench_app.command("kafka")(bench_kafka.bench_kafka)
bench_app.command("sink-commit")(bench_sink.bench_sink_commit)
bench_app.command("auth")(auth_cli.bench_auth)

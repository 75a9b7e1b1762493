"""``orbitmq bench kafka``: Kafka clients through the gateway beside the native SDK
(:mod:`orbitmq.bench.kafka`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from orbitmq.bench.kafka import KafkaBenchOptions, format_report, run_kafka_bench


def bench_kafka(
    count: Annotated[int, typer.Option(help="Messages per step.")] = 100_000,
    size: Annotated[int, typer.Option(help="Body bytes.")] = 1024,
    partitions: Annotated[int, typer.Option(help="Partitions (queues) per topic.")] = 8,
    namesrv: Annotated[
        str | None, typer.Option("--namesrv", "-n", help="A running cluster (with --bootstrap).")
    ] = None,
    bootstrap: Annotated[
        str | None, typer.Option(help="Its Kafka listener host:port (with --namesrv).")
    ] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write JSON here.")] = None,
    inflight: Annotated[
        int | None,
        typer.Option(
            help="The gateway's max_inflight_produce for the `orbitmq up` started here "
            "(default: its setting, 5); 1 serves one Produce per connection at a time."
        ),
    ] = None,
) -> None:
    """Produce and consume with confluent-kafka through the Kafka gateway and with the native
    SDK, in one run (default: an `orbitmq up` started here on free ports)."""
    opts = KafkaBenchOptions(count, size, partitions, namesrv, bootstrap, inflight)
    result = run_kafka_bench(opts, lambda s: typer.echo(s, err=True))
    typer.echo(format_report(result))
    if json_path is not None:
        json_path.write_text(json.dumps(result, indent=2))

"""`orbitmq kafka`: the Kafka gateway alone, in front of the brokers a NameServer knows.

Kafka clients connect to it as to a Kafka broker (`orbitmq up` already runs one on 9092, and
`orbitmq broker --kafka-port` beside a broker). Its settings are the ``[kafka]`` table (TOML
``--config``, ``ORBITMQ_KAFKA_*`` env); the flags below override them. See docs/kafka.md.
"""

from __future__ import annotations

from typing import Annotated

import typer

from orbitmq.cli.runner import ConfigOpt, LogLevel, announcer, configure_logging, load_or_exit

kafka_app = typer.Typer(
    help="Kafka wire-protocol gateway for unmodified Kafka clients.", invoke_without_command=True
)


@kafka_app.callback()
def kafka(
    config: ConfigOpt = None,
    namesrv: Annotated[
        str | None,
        typer.Option(
            "--namesrv", "-n", help="NameServers, ';'-separated host:port (default 127.0.0.1:9876)."
        ),
    ] = None,
    host: Annotated[
        str | None, typer.Option(help="Address to listen on (default 127.0.0.1).")
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Kafka port (default 9092); 0: a free one.")
    ] = None,
    advertised_host: Annotated[
        str | None, typer.Option(help="Host clients are told to connect to (default: --host).")
    ] = None,
    node_id: Annotated[int | None, typer.Option(help="Kafka node id (default 0).")] = None,
    log_level: LogLevel = "INFO",
) -> None:
    """Run a Kafka gateway routing by NameServer routes."""
    from orbitmq.cli.runner import run_server
    from orbitmq.cli.server import run_kafka

    configure_logging(log_level)
    settings = load_or_exit(
        config,
        {
            "kafka": {
                "namesrv_addrs": None if namesrv is None else namesrv.replace(";", ","),
                "host": host,
                "port": port,
                "advertised_host": advertised_host,
                "node_id": node_id,
            }
        },
    )
    run_server(run_kafka(settings, announcer("Kafka gateway", "kafka")))

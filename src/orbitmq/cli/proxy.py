"""`orbitmq proxy`: the gRPC proxy for Apache RocketMQ 5 clients, in cluster mode.

A stateless process in front of the brokers a NameServer knows; run as many as you like behind
one address. (`orbitmq up` already runs one in local mode.)
"""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

proxy_app = typer.Typer(
    help="gRPC proxy for Apache RocketMQ 5 clients (cluster mode).",
    invoke_without_command=True,
)


@proxy_app.callback()
def proxy(
    namesrv: Annotated[
        str, typer.Option("--namesrv", "-n", help="NameServers, ';'-separated host:port.")
    ] = "127.0.0.1:9876",
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="gRPC port; 0 picks a free one.")] = 8081,
    acl: Annotated[bool, typer.Option("--acl", help="Verify MQv2-HMAC-SHA1 signatures.")] = False,
    access_key: Annotated[
        list[str] | None, typer.Option("--access-key", help="AK:SK (repeatable).")
    ] = None,
    max_message_size: Annotated[
        int | None, typer.Option(help="Largest body accepted (default 4 MiB).")
    ] = None,
    tls: Annotated[
        str, typer.Option(help="permissive (TLS and plaintext on one port), required or off.")
    ] = "permissive",
    tls_cert: Annotated[
        str | None, typer.Option(help="PEM certificate (default: a self-signed one).")
    ] = None,
    tls_key: Annotated[str | None, typer.Option(help="PEM key of --tls-cert.")] = None,
    tls_client_ca: Annotated[
        str | None,
        typer.Option(
            help="Mutual TLS: clients must present a certificate signed by this PEM CA "
            "(needs --tls required)."
        ),
    ] = None,
    log_level: Annotated[str, typer.Option("--log-level")] = "INFO",
) -> None:
    """Run a stateless gRPC proxy routing by NameServer routes."""
    from orbitmq.cli.main import _announce, _run
    from orbitmq.cli.server import run_proxy
    from orbitmq.common.errors import MQError
    from orbitmq.proxy.__main__ import build_config

    logging.basicConfig(
        level=log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        config = build_config(
            namesrv,
            host,
            port,
            acl=acl,
            access_keys=access_key or [],
            max_message_size=max_message_size,
            tls=tls,
            tls_cert=tls_cert,
            tls_key=tls_key,
            tls_client_ca=tls_client_ca,
        )
    except (MQError, ValueError) as exc:
        typer.echo(f"configuration error: {exc}", err=True)
        raise typer.Exit(2) from exc
    _run(run_proxy(config, _announce("Proxy", "proxy")))

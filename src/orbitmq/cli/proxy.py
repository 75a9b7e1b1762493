"""`orbitmq proxy`: the gRPC proxy for Apache RocketMQ 5 clients, in cluster mode.

A stateless process in front of the brokers a NameServer knows; run as many as you like behind
one address. (`orbitmq up` already runs one in local mode.) Its settings are the ``[proxy]``
table (TOML ``--config``, ``ORBITMQ_PROXY_*`` env); the flags below override them.
"""

from __future__ import annotations

from typing import Annotated

import typer

from orbitmq.cli.runner import ConfigOpt, LogLevel, announcer, configure_logging, load_or_exit

proxy_app = typer.Typer(
    help="gRPC proxy for Apache RocketMQ 5 clients (cluster mode).",
    invoke_without_command=True,
)


@proxy_app.callback()
def proxy(
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
        int | None, typer.Option(help="gRPC port (default 8081); 0 picks a free one.")
    ] = None,
    acl: Annotated[bool, typer.Option("--acl", help="Verify MQv2-HMAC-SHA1 signatures.")] = False,
    access_key: Annotated[
        list[str] | None, typer.Option("--access-key", help="AK:SK (repeatable).")
    ] = None,
    max_message_size: Annotated[
        int | None, typer.Option(help="Largest body accepted (default 4 MiB).")
    ] = None,
    tls: Annotated[
        str | None,
        typer.Option(
            help="permissive (TLS and plaintext on one port; the default), required or off."
        ),
    ] = None,
    tls_cert: Annotated[
        str | None, typer.Option(help="PEM certificate (default: a self-signed one).")
    ] = None,
    tls_key: Annotated[str | None, typer.Option(help="PEM key of --tls-cert.")] = None,
    tls_client_ca: Annotated[
        str | None,
        typer.Option(
            help="Mutual TLS: TLS clients must present a certificate signed by this PEM CA; "
            "with --acl it names the user of calls without a signature (needs --tls required, "
            "or permissive with --acl)."
        ),
    ] = None,
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            help="Proxy processes sharing the port (SO_REUSEPORT; the kernel spreads client "
            "connections over them).",
        ),
    ] = 1,
    metrics_port: Annotated[
        int | None,
        typer.Option(help="Serve the RocketMQ proxy metrics on this port (0: a free one)."),
    ] = None,
    log_level: LogLevel = "INFO",
) -> None:
    """Run a stateless gRPC proxy routing by NameServer routes."""
    from orbitmq.cli.runner import run_server
    from orbitmq.cli.server import run_proxy
    from orbitmq.proxy.config import parse_access_keys

    configure_logging(log_level)
    if workers > 1:
        from orbitmq.cli.proxy_workers import run_workers

        if metrics_port is not None:
            # Each worker would need its own metrics port, and the ready line names one.
            typer.echo("configuration error: --metrics-port works with --workers 1 only", err=True)
            raise typer.Exit(2)

        given = {
            "--config": config, "--namesrv": namesrv, "--host": host,
            "--max-message-size": max_message_size, "--tls": tls, "--tls-cert": tls_cert,
            "--tls-key": tls_key, "--tls-client-ca": tls_client_ca, "--log-level": log_level,
        }  # fmt: skip
        args = [item for flag, v in given.items() if v is not None for item in (flag, str(v))]
        args += [item for key in access_key or () for item in ("--access-key", key)]
        args += ["--acl"] if acl else []
        settings = load_or_exit(config, {"proxy": {"host": host, "port": port}})
        code = run_workers(
            args, settings.proxy.host, settings.proxy.port, workers, announcer("Proxy", "proxy")
        )
        raise typer.Exit(code)
    try:
        keys = parse_access_keys(access_key) if access_key else None
    except ValueError as exc:
        typer.echo(f"configuration error: {exc}", err=True)
        raise typer.Exit(2) from exc
    settings = load_or_exit(
        config,
        {
            "proxy": {
                "namesrv_addrs": None if namesrv is None else namesrv.replace(";", ","),
                "host": host,
                "port": port,
                "acl_enabled": True if acl else None,
                "access_keys": keys,
                "max_message_size": max_message_size,
                "tls_mode": tls,
                "tls_cert_file": tls_cert,
                "tls_key_file": tls_key,
                "tls_client_ca_file": tls_client_ca,
                "metrics_port": metrics_port,
            }
        },
    )
    run_server(run_proxy(settings, announcer("Proxy", "proxy")))

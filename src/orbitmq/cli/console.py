"""`orbitmq console`: the web console (extra ``orbitmq[console]``), by default on
http://127.0.0.1:8088 (`orbitmq up` runs one too). Settings: the ``[console]`` table
(``ORBITMQ_CONSOLE_*`` env); the flags below override them. See docs/console.md."""

from __future__ import annotations

from typing import Annotated

import typer

from orbitmq.cli.runner import ConfigOpt, LogLevel, announcer, configure_logging, load_or_exit

console_app = typer.Typer(help="Web console: topics, groups and lag, messages, DLQ, audit.")


@console_app.callback(invoke_without_command=True)
def console(
    ctx: typer.Context,
    config: ConfigOpt = None,
    namesrv: Annotated[
        str | None, typer.Option("--namesrv", "-n", help="NameServers, ';'-separated host:port.")
    ] = None,
    host: Annotated[str | None, typer.Option(help="Listen address (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="HTTP port (default 8088).")] = None,
    read_only: Annotated[bool, typer.Option("--read-only", help="Refuse every write.")] = False,
    hide_bodies: Annotated[
        bool, typer.Option("--hide-bodies", help="Never send message bodies to the browser.")
    ] = False,
    tls_cert: Annotated[
        str | None, typer.Option("--tls-cert", help="Serve HTTPS with this PEM certificate chain.")
    ] = None,
    tls_key: Annotated[
        str | None, typer.Option("--tls-key", help="PEM key of --tls-cert (if not in it).")
    ] = None,
    tls_ca: Annotated[
        str | None,
        typer.Option("--tls-ca", help="Require client certificates of this PEM CA (mutual TLS)."),
    ] = None,
    log_level: LogLevel = "INFO",
) -> None:
    """Run the web console (HTTPS with --tls-cert)."""
    if ctx.invoked_subcommand is not None:
        return
    from orbitmq.cli.runner import run_server
    from orbitmq.cli.server import run_console

    configure_logging(log_level)
    settings = load_or_exit(
        config,
        {
            "console": {
                "namesrv_addrs": None if namesrv is None else namesrv.replace(";", ","),
                "host": host,
                "port": port,
                "allow_writes": False if read_only else None,
                "allow_message_bodies": False if hide_bodies else None,
                "tls_cert_file": tls_cert,
                "tls_key_file": tls_key,
                "tls_ca_file": tls_ca,
            }
        },
    )
    run_server(run_console(settings, announcer("Console", "console")))


@console_app.command("hash-password")
def hash_password_cmd(
    role: Annotated[str, typer.Option(help="viewer or admin.")] = "viewer",
    password: Annotated[
        str, typer.Option(prompt=True, hide_input=True, confirmation_prompt=True)
    ] = "",
) -> None:
    """Print a `[console.users]` entry value for a password (PBKDF2-SHA256)."""
    from orbitmq.console.auth import ROLES, hash_password

    if role not in ROLES:
        raise typer.BadParameter(f"role must be one of {', '.join(ROLES)}")
    typer.echo(f"{role}:{hash_password(password)}")

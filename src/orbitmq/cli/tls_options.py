"""The ``orbitmq`` command's client TLS options, shared by every client command.

``orbitmq --tls [--tls-ca FILE] [--tls-cert FILE --tls-key FILE] [--tls-insecure] <command>``
(or ``ORBITMQ_TLS=1``, ``ORBITMQ_TLS_CA`` ...) makes every Remoting connection the command
opens use TLS, verifying the server's certificate chain and host name against the system roots
or ``--tls-ca``; ``--tls-cert``/``--tls-key`` add a client certificate (mutual TLS).
``--tls-insecure`` skips verification and says so on stderr: for development only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orbitmq.common.errors import ConfigError
from orbitmq.net.client import set_default_ssl_context
from orbitmq.net.tls import client_context

TlsOpt = Annotated[
    bool, typer.Option("--tls", envvar="ORBITMQ_TLS", help="Connect to servers with TLS.")
]
TlsCaOpt = Annotated[
    Path | None,
    typer.Option(envvar="ORBITMQ_TLS_CA", help="PEM CA file the servers are verified with."),
]
TlsCertOpt = Annotated[
    Path | None,
    typer.Option(envvar="ORBITMQ_TLS_CERT", help="PEM client certificate (mutual TLS)."),
]
TlsKeyOpt = Annotated[
    Path | None, typer.Option(envvar="ORBITMQ_TLS_KEY", help="PEM key of --tls-cert.")
]
TlsInsecureOpt = Annotated[
    bool,
    typer.Option(envvar="ORBITMQ_TLS_INSECURE", help="Do not verify servers (development only)."),
]
"""The root options of ``orbitmq`` (cli/main.py) that :func:`client_tls` applies."""


def client_tls(
    tls: TlsOpt = False,
    tls_ca: TlsCaOpt = None,
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    tls_insecure: TlsInsecureOpt = False,
) -> None:
    """OrbitMQ: a messaging and streaming platform on the design of Apache RocketMQ 5."""
    if not (tls or tls_ca or tls_cert or tls_insecure):
        return
    try:
        ctx = client_context(
            ca_file=str(tls_ca) if tls_ca else None,
            verify=not tls_insecure,
            cert_file=str(tls_cert) if tls_cert else None,
            key_file=str(tls_key) if tls_key else None,
        )
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    if tls_insecure:
        typer.echo("warning: TLS server certificates are NOT verified (--tls-insecure)", err=True)
    set_default_ssl_context(ctx)

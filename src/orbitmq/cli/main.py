"""The `orbitmq` command (typer + rich).

Servers: ``up`` (NameServer + Broker + gRPC proxy in one process), ``namesrv`` (with
``--controller``, a controller node beside it), ``broker``, ``proxy``, ``controller`` (each run
by :mod:`orbitmq.cli.runner`; ``python -m orbitmq`` is the same command).
Configuration: ``config show``. Benchmarks: ``bench store``, ``bench produce``,
``bench consume``, ``bench e2e``, ``bench timer``.
HA admin: ``broker elect``, ``cluster describe``.
Clients (docs/cli.md): ``topic``, ``cluster``, ``message``, ``group``, ``dlq``, ``send``,
``tail``, ``consume``. Security (docs/security.md): ``user``, ``acl``, ``audit verify``; the
root options ``--access-key``/``--secret-key`` sign every client command's requests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from orbitmq.cli.common import ACCESS_KEY_ENV, SECRET_KEY_ENV, set_credentials
from orbitmq.cli.ha import broker_app
from orbitmq.cli.lazy import lazy_group
from orbitmq.cli.runner import (
    ConfigOpt,
    LogLevel,
    announcer,
    configure_logging,
    load_or_exit,
    run_server,
)
from orbitmq.cli.settings import settings_rows
from orbitmq.cli.tls_options import (
    TlsCaOpt,
    TlsCertOpt,
    TlsInsecureOpt,
    TlsKeyOpt,
    TlsOpt,
    client_tls,
)

LAZY = {
    "send": "orbitmq.cli.produce:send",
    "tail": "orbitmq.cli.tail:tail",
    "consume": "orbitmq.cli.consume:consume",
    "bench": "orbitmq.cli.bench:bench_app",
    "topic": "orbitmq.cli.admin:topic_app",
    "cluster": "orbitmq.cli.cluster:cluster_app",
    "message": "orbitmq.cli.message:message_app",
    "group": "orbitmq.cli.group:group_app",
    "dlq": "orbitmq.cli.dlq:dlq_app",
    "pipeline": "orbitmq.cli.pipeline:pipeline_app",
    "proxy": "orbitmq.cli.proxy:proxy_app",
    "kafka": "orbitmq.cli.kafka:kafka_app",
    "console": "orbitmq.cli.console:console_app",
    "user": "orbitmq.cli.auth:user_app",
    "acl": "orbitmq.cli.auth:acl_app",
    "audit": "orbitmq.cli.auth:audit_app",
    "tier": "orbitmq.cli.tier:tier_app",
}
"""Commands imported only when they run (:mod:`orbitmq.cli.lazy`): a server start imports the
servers' modules, not every client command's and benchmark's (a start took about 0.3 s more
CPU with all of them)."""

ORDER = ("up", "namesrv", "controller", "send", "tail", "consume", "config", "bench", "topic",
         "cluster", "message", "group", "dlq", "pipeline", "proxy", "kafka", "console", "broker",
         "user", "acl", "audit", "tier")  # fmt: skip
"""``orbitmq --help``'s order: the servers, the client commands, then the groups."""

app = typer.Typer(
    name="orbitmq",
    help="OrbitMQ: a messaging and streaming platform on the design of Apache RocketMQ 5.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    cls=lazy_group(LAZY, ORDER),
)
config_app = typer.Typer(help="Configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")
app.add_typer(broker_app, name="broker")


@app.callback()
def _root(
    access_key: Annotated[
        str | None,
        typer.Option(
            "--access-key",
            envvar=ACCESS_KEY_ENV,
            show_envvar=True,
            help="User that signs the client commands' requests (servers with auth on).",
        ),
    ] = None,
    secret_key: Annotated[
        str | None,
        typer.Option(
            "--secret-key",
            envvar=SECRET_KEY_ENV,
            show_envvar=True,
            help="That user's secret (prefer the environment variable to the flag).",
        ),
    ] = None,
    tls: TlsOpt = False,
    tls_ca: TlsCaOpt = None,
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    tls_insecure: TlsInsecureOpt = False,
) -> None:
    """OrbitMQ: a messaging and streaming platform on the design of Apache RocketMQ 5. The
    options here apply to every client command: credentials (servers with authentication on)
    and TLS (servers with TLS on)."""
    set_credentials(access_key, secret_key)
    client_tls(tls, tls_ca, tls_cert, tls_key, tls_insecure)


console = Console()

ProxyTlsMode = Annotated[
    str | None,
    typer.Option(
        help="Proxy TLS: permissive (TLS and plaintext on one port; the default), required or off."
    ),
]
ProxyTlsCert = Annotated[
    Path | None, typer.Option(help="PEM certificate for the proxy (default: self-signed).")
]
ProxyTlsKey = Annotated[Path | None, typer.Option(help="PEM key of --proxy-tls-cert.")]
ProxyTlsClientCa = Annotated[
    Path | None,
    typer.Option(
        help="Mutual TLS: proxy TLS clients must present a certificate signed by this PEM CA "
        "(needs --proxy-tls required, or permissive with the proxy's ACL on)."
    ),
]


def _proxy_tls(
    mode: str | None, cert: Path | None, key: Path | None, client_ca: Path | None
) -> dict[str, object]:
    """The ``--proxy-tls*`` flags as ``[proxy]`` settings (ProxyConfig checks them)."""
    return {
        "tls_mode": mode,
        "tls_cert_file": str(cert) if cert else None,
        "tls_key_file": str(key) if key else None,
        "tls_client_ca_file": str(client_ca) if client_ca else None,
    }


@app.command()
def up(
    config: ConfigOpt = None,
    data_dir: Annotated[Path, typer.Option(help="Folder for all data.")] = Path("orbitmq-data"),
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    namesrv_port: Annotated[
        int | None, typer.Option(help="NameServer port (default 9876).")
    ] = None,
    broker_port: Annotated[int | None, typer.Option(help="Broker port (default 10911).")] = None,
    flush: Annotated[str | None, typer.Option(help="ASYNC_FLUSH or SYNC_FLUSH.")] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="Prometheus port for the broker.")
    ] = None,
    proxy_port: Annotated[
        int | None,
        typer.Option(help="gRPC proxy port for RocketMQ 5 clients (default 8081; -1: none)."),
    ] = None,
    proxy_tls: ProxyTlsMode = None,
    proxy_tls_cert: ProxyTlsCert = None,
    proxy_tls_key: ProxyTlsKey = None,
    proxy_tls_client_ca: ProxyTlsClientCa = None,
    kafka_port: Annotated[
        int | None,
        typer.Option(help="Kafka listener port for Kafka clients (default 9092; -1: none)."),
    ] = None,
    console_port: Annotated[
        int | None,
        typer.Option(help="Web console port (default 8088; -1: none; needs orbitmq[console])."),
    ] = None,
    log_level: LogLevel = "INFO",
) -> None:
    """Start NameServer + Broker + gRPC proxy + Kafka listener + web console in one process (dev
    profile: topics are created on first use)."""
    from orbitmq.cli.server import dev_settings, run_all_in_one

    configure_logging(log_level)
    settings = load_or_exit(
        config,
        {
            "namesrv": {"host": host, "port": namesrv_port},
            "broker": {"host": host, "port": broker_port, "metrics_port": metrics_port},
            "store": {"flush_disk_type": flush},
            "proxy": _proxy_tls(proxy_tls, proxy_tls_cert, proxy_tls_key, proxy_tls_client_ca),
        },
    )
    run_server(
        run_all_in_one(
            dev_settings(settings, data_dir),
            announcer("OrbitMQ up", "up"),
            proxy_port,
            kafka_port,
            console_port,
        )
    )


ControllerPeers = Annotated[
    str | None,
    typer.Option(
        help="Every controller node as host:port/raft_port, ','-separated, this one included "
        "(default: a one-node controller)."
    ),
]
RaftSecret = Annotated[
    str | None,
    typer.Option(
        help="Shared secret for Raft traffic (better: env ORBITMQ_CONTROLLER_RAFT_SECRET).",
        show_default=False,
    ),
]


@app.command()
def namesrv(
    config: ConfigOpt = None,
    host: Annotated[str | None, typer.Option()] = None,
    port: Annotated[int | None, typer.Option(help="Default 9876; 0 picks a free port.")] = None,
    metrics_port: Annotated[int | None, typer.Option()] = None,
    controller: Annotated[
        bool,
        typer.Option(
            "--controller",
            help="Also run a controller node in this process (settings: the --controller-* "
            "flags and the \\[controller] table).",
        ),
    ] = False,
    controller_port: Annotated[int | None, typer.Option(help="Default 9878.")] = None,
    controller_raft_port: Annotated[int | None, typer.Option(help="Default 9880.")] = None,
    controller_peers: ControllerPeers = None,
    controller_data_dir: Annotated[Path | None, typer.Option()] = None,
    controller_raft_secret: RaftSecret = None,
    log_level: LogLevel = "INFO",
) -> None:
    """Run a NameServer (with --controller, a controller node beside it; --host is both's)."""
    from orbitmq.cli.server import run_namesrv

    given = (
        controller_port,
        controller_raft_port,
        controller_peers,
        controller_data_dir,
        controller_raft_secret,
    )
    if not controller and any(v is not None for v in given):
        raise typer.BadParameter(
            "the --controller-* options need --controller", param_hint="--controller"
        )
    configure_logging(log_level)
    settings = load_or_exit(
        config,
        {
            "namesrv": {"host": host, "port": port, "metrics_port": metrics_port},
            "controller": {
                "host": host,
                "port": controller_port,
                "raft_port": controller_raft_port,
                "peers": controller_peers,
                "data_dir": None if controller_data_dir is None else str(controller_data_dir),
                "raft_secret": controller_raft_secret,
            },
        },
        controller=controller,
    )
    ctl = settings.controller if controller else None
    run_server(run_namesrv(settings, announcer("NameServer", "namesrv"), ctl))


@app.command("controller")
def controller_cmd(
    config: ConfigOpt = None,
    host: Annotated[str | None, typer.Option(help="Default 127.0.0.1.")] = None,
    port: Annotated[int | None, typer.Option(help="Remoting port (default 9878).")] = None,
    raft_port: Annotated[int | None, typer.Option(help="Raft port (default 9880).")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Raft journal folder.")] = None,
    peers: ControllerPeers = None,
    raft_secret: RaftSecret = None,
    metrics_port: Annotated[int | None, typer.Option()] = None,
    enable_unclean_election: Annotated[
        bool | None,
        typer.Option(
            help="Elect outside the SyncStateSet when no member is alive (may lose messages)."
        ),
    ] = None,
    log_level: LogLevel = "INFO",
) -> None:
    """Run a controller node: it elects broker masters (docs/ha.md)."""
    from orbitmq.cli.server import run_controller

    configure_logging(log_level)
    settings = load_or_exit(
        config,
        {
            "controller": {
                "host": host,
                "port": port,
                "raft_port": raft_port,
                "data_dir": None if data_dir is None else str(data_dir),
                "peers": peers,
                "raft_secret": raft_secret,
                "metrics_port": metrics_port,
                "enable_unclean_election": enable_unclean_election,
            }
        },
        controller=True,
    )
    run_server(run_controller(settings, announcer("Controller", "controller")))


@broker_app.callback(invoke_without_command=True)
def broker(
    ctx: typer.Context,
    config: ConfigOpt = None,
    host: Annotated[str | None, typer.Option()] = None,
    port: Annotated[int | None, typer.Option(help="Default 10911; 0 picks a free port.")] = None,
    name: Annotated[str | None, typer.Option("--name", help="Broker name.")] = None,
    cluster: Annotated[str | None, typer.Option()] = None,
    namesrv_addr: Annotated[
        str | None, typer.Option("--namesrv", "-n", help="NameServers, ';'-separated host:port.")
    ] = None,
    store_path: Annotated[Path | None, typer.Option()] = None,
    flush: Annotated[str | None, typer.Option(help="ASYNC_FLUSH or SYNC_FLUSH.")] = None,
    auto_create_topic: Annotated[bool | None, typer.Option()] = None,
    metrics_port: Annotated[int | None, typer.Option()] = None,
    controller_addr: Annotated[
        str | None,
        typer.Option(
            "--controller",
            help="Controller nodes, ';'-separated host:port: controller mode (docs/ha.md).",
        ),
    ] = None,
    proxy_port: Annotated[
        int | None,
        typer.Option(
            help="Also run a gRPC proxy in this process on this port (0: a free one; default: "
            "only if the [proxy] table sets a port)."
        ),
    ] = None,
    proxy_tls: ProxyTlsMode = None,
    proxy_tls_cert: ProxyTlsCert = None,
    proxy_tls_key: ProxyTlsKey = None,
    proxy_tls_client_ca: ProxyTlsClientCa = None,
    kafka_port: Annotated[
        int | None,
        typer.Option(
            help="Also run a Kafka listener in this process on this port (0: a free one; "
            "default: only if the [kafka] table sets a port)."
        ),
    ] = None,
    tier_restore: Annotated[
        bool | None,
        typer.Option(
            "--tier-restore",
            help="Rebuild queues lost locally from the tier's manifests (docs/tiered-storage.md).",
        ),
    ] = None,
    log_level: LogLevel = "INFO",
) -> None:
    """Run a Broker (with --proxy-port, a gRPC proxy beside it); `broker elect` moves a
    group's master."""
    if ctx.invoked_subcommand is not None:
        return
    from orbitmq.cli.server import run_broker

    configure_logging(log_level)
    settings = load_or_exit(
        config,
        {
            "broker": {
                "host": host,
                "port": port,
                "broker_name": name,
                "cluster": cluster,
                "namesrv_addrs": None if namesrv_addr is None else namesrv_addr.replace(";", ","),
                "auto_create_topic": auto_create_topic,
                "metrics_port": metrics_port,
                "controller_addrs": None
                if controller_addr is None
                else controller_addr.replace(";", ","),
            },
            "store": {
                "store_path": store_path,
                "flush_disk_type": flush,
                "tier_restore": tier_restore,
            },
            "proxy": _proxy_tls(proxy_tls, proxy_tls_cert, proxy_tls_key, proxy_tls_client_ca),
        },
    )
    run_server(run_broker(settings, announcer("Broker", "broker"), proxy_port, kafka_port))


@config_app.command("show")
def config_show(config: ConfigOpt = None) -> None:
    """Print the effective configuration and where each value came from."""
    settings = load_or_exit(config, {})
    table = Table("setting", "value", "source")
    for key, value, source in settings_rows(settings):
        table.add_row(key, value, source if source != "default" else "[dim]default[/]")
    console.print(table)


@config_app.command("docs")
def config_docs() -> None:
    """Print docs/configuration.md: every setting with its default and meaning."""
    from orbitmq.cli.settings import settings_markdown

    print(settings_markdown())


def main() -> None:
    app()

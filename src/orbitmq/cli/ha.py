"""Admin commands on the controller (docs/ha.md): ``orbitmq cluster describe`` shows each broker
group's master, epochs, SyncStateSet and replicas and each controller node's role; ``orbitmq
broker elect`` moves a group's master (manual failover).

Through :class:`orbitmq.controller.client.ControllerClient` only, which finds the Raft leader
itself. The controller has no request that lists its groups, so ``describe`` asks it about the
groups named with ``--broker-name``, or else about every broker name the NameServers know.

Replica lag (bytes and ms behind the master) is what the master reported in its last heartbeat
to the controller leader (every 500 ms); "n/a" when it reported none for that replica (not
connected, or a static-mode group).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.markup import escape
from rich.table import Column, Table

from orbitmq.cli.common import (
    DEFAULT_NAMESRV,
    NamesrvOpt,
    admin_config,
    credentials,
    fail,
    out,
    run,
    split_list,
)
from orbitmq.cli.runner import ConfigOpt
from orbitmq.common.errors import MQError
from orbitmq.controller.client import ControllerClient
from orbitmq.protocol.controller import ControllerMetadata, ReplicaInfo

DEFAULT_CONTROLLER = "127.0.0.1:9878"

ControllerOpt = Annotated[
    str,
    typer.Option(
        "--controller",
        envvar="ORBITMQ_CONTROLLER",
        help="Controller nodes, host:port separated by ';' or ',' (any of them; the leader is "
        "found).",
        show_envvar=True,
    ),
]

broker_app = typer.Typer(help="Run a Broker, or act on a broker group through the controller.")


def _client(controller: str) -> ControllerClient:
    addrs = split_list(controller)
    if not addrs:
        fail("--controller names no address")
    return ControllerClient(addrs, **credentials())


def _master_text(info: ReplicaInfo) -> str:
    if not info.has_master:
        return "[red]none[/]"
    return f"{info.master_broker_id} at {escape(info.master_address)}"


@broker_app.command("elect")
def broker_elect(
    broker_name: Annotated[str, typer.Option("--broker-name", "-b", help="The broker group.")],
    to: Annotated[
        int | None,
        typer.Option("--to", help="Broker id to make master (default: the controller chooses)."),
    ] = None,
    controller: ControllerOpt = DEFAULT_CONTROLLER,
) -> None:
    """Elect a new master for a broker group (manual failover).

    With --to the broker must be alive and in the SyncStateSet; without it the controller's
    policy chooses, as after a failure.

    Example: orbitmq broker elect --broker-name broker-a --to 2 --controller 127.0.0.1:9878
    """

    async def go() -> ReplicaInfo:
        client = _client(controller)
        try:
            before = await client.replica_info(broker_name)
            return await client.elect(before.cluster, broker_name, to)
        finally:
            await client.close()

    info = run(go())
    out().print(
        f"{escape(broker_name)}: master {_master_text(info)}, master epoch {info.master_epoch}",
        soft_wrap=True,
    )


def describe_cluster(
    controller: str,
    broker_names: list[str] | None,
    namesrv: str,
) -> None:
    async def names_from_namesrv() -> list[str]:
        from orbitmq.client import AsyncAdminClient

        async with AsyncAdminClient(namesrv, admin_config()) as admin:
            info = await admin.cluster_info()
        return sorted(info.broker_addr_table)

    async def go() -> tuple[
        list[tuple[str, ControllerMetadata | BaseException]],
        list[tuple[str, ReplicaInfo | MQError]],
    ]:
        names = broker_names or await names_from_namesrv()
        client = _client(controller)
        try:
            metas = await asyncio.gather(
                *(client.metadata(a) for a in client.addrs), return_exceptions=True
            )
            groups: list[tuple[str, ReplicaInfo | MQError]] = []
            for name in names:
                try:
                    groups.append((name, await client.replica_info(name)))
                except MQError as exc:
                    groups.append((name, exc))
        finally:
            await client.close()
        return list(zip(client.addrs, metas, strict=True)), groups

    nodes, groups = run(go())
    console = out()
    node_table = Table(
        Column("controller", no_wrap=True),
        Column("role", no_wrap=True),
        Column("term", justify="right", no_wrap=True),
        Column("leader (as it knows)", no_wrap=True),
        title="controller nodes",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for addr, meta in nodes:
        if isinstance(meta, BaseException):
            if not isinstance(meta, MQError | OSError):
                raise meta
            node_table.add_row(escape(addr), "[red]unreachable[/]", "-", "-")
            continue
        role = "[bold green]leader[/]" if meta.is_leader else "follower"
        node_table.add_row(
            escape(addr), role, str(meta.term), escape(meta.leader_address or "unknown")
        )
    console.print(node_table)
    if not groups:
        console.print("no broker group known (name one with --broker-name)")
    for name, info in groups:
        if isinstance(info, MQError):
            console.print(f"[red]{escape(name)}: {escape(str(info))}[/]", soft_wrap=True)
            continue
        console.print(_group_summary(info), soft_wrap=True)
        console.print(_group_table(info))


def _group_summary(info: ReplicaInfo) -> str:
    """One line (a table title would wrap at the table's width, splitting it for scripts)."""
    members = ", ".join(map(str, sorted(info.sync_state_set)))
    return (
        f"[bold]group {escape(info.broker_name)}[/] (cluster {escape(info.cluster)}): master"
        f" {_master_text(info)}, master epoch {info.master_epoch}, SyncStateSet"
        f" {{{members}}} epoch {info.sync_state_set_epoch}"
    )


def _group_table(info: ReplicaInfo) -> Table:
    in_sync = set(info.sync_state_set)
    table = Table(
        # Short headers: the nine columns fit an 80-column terminal with full addresses.
        Column("id", justify="right", no_wrap=True),
        Column("address", no_wrap=True),
        Column("role", no_wrap=True),
        Column("sync", no_wrap=True),
        Column("alive", no_wrap=True),
        Column("max offset", justify="right", no_wrap=True),
        Column("lag bytes", justify="right", no_wrap=True),
        Column("lag ms", justify="right", no_wrap=True),
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for replica in sorted(info.replicas, key=lambda r: r.broker_id):
        master = info.has_master and replica.broker_id == info.master_broker_id
        table.add_row(
            str(replica.broker_id),
            escape(replica.address),
            "[bold]master[/]" if master else "slave",
            "yes" if replica.broker_id in in_sync else "no",
            "yes" if replica.alive else "[red]no[/]",
            str(replica.max_offset) if replica.max_offset >= 0 else "n/a",
            str(replica.lag_bytes) if replica.lag_bytes >= 0 else "n/a",
            str(replica.lag_ms) if replica.lag_ms >= 0 else "n/a",
        )
    return table


def cluster_describe(
    controller: ControllerOpt = DEFAULT_CONTROLLER,
    broker_name: Annotated[
        list[str] | None,
        typer.Option(
            "--broker-name",
            "-b",
            help="A broker group to show (repeatable; default: every one the NameServers know).",
        ),
    ] = None,
    namesrv: NamesrvOpt = DEFAULT_NAMESRV,
) -> None:
    """Show the controller nodes (leader or follower) and, per broker group, its master, master
    epoch, SyncStateSet and replicas with their lag behind the master.

    Example: orbitmq cluster describe --controller 127.0.0.1:9878 -b broker-a
    """
    describe_cluster(controller, broker_name, namesrv)


@broker_app.command("resync")
def broker_resync(
    config: ConfigOpt = None,
    store_path: Annotated[
        Path | None, typer.Option(help="The stopped broker's store (else from --config).")
    ] = None,
    to: Annotated[
        int | None,
        typer.Option(
            "--to", help="Cut the log at this known-good CommitLog offset instead of emptying it."
        ),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
) -> None:
    """Rebuild a replica from its master: empty its log (moved aside, not deleted) or cut it at
    a known-good offset; at its next start it copies the rest from its master (docs/ha.md).

    The broker must be stopped. Example: orbitmq broker resync --config broker-b.toml
    """
    from orbitmq.broker.ha.resync import resync
    from orbitmq.cli.runner import load_or_exit

    settings = load_or_exit(
        config, {"store": {"store_path": None if store_path is None else str(store_path)}}
    )
    store = settings.broker.store
    what = "empty its log" if to is None else f"cut its log at offset {to}"
    if not yes and not typer.confirm(f"Resync {store.store_path}: {what}?"):
        fail("not resynced")
    try:
        report = resync(store, to=to)
    except MQError as exc:
        fail(str(exc))
    if report.backup is not None:
        out().print(
            f"resynced {escape(str(report.store))}: moved {', '.join(report.moved) or 'nothing'} "
            f"to {escape(str(report.backup))}; start the broker to copy its master's log"
        )
    else:
        out().print(
            f"resynced {escape(str(report.store))}: log cut from {report.end_before} to "
            f"{report.cut_at}; start the broker to copy the rest from its master"
        )

"""``orbitmq cluster list``: the clusters the NameServers know, their brokers and each broker's
runtime state (commit log size, dispatch lag, disk use), asked of every broker at once.
``orbitmq cluster up`` (a local replicated cluster of processes) is in
:mod:`orbitmq.cli.cluster_up`; ``cluster describe`` in :mod:`orbitmq.cli.ha`.

Through :class:`orbitmq.client.AsyncAdminClient` only; an unreachable broker is a red row, not a
failure of the command.
"""

from __future__ import annotations

import asyncio
from typing import Any

import typer
from rich import box
from rich.markup import escape
from rich.table import Column, Table

from orbitmq.cli.cluster_up import cluster_up
from orbitmq.cli.common import DEFAULT_NAMESRV, NamesrvOpt, admin_config, human_bytes, out, run
from orbitmq.cli.ha import cluster_describe
from orbitmq.client import AsyncAdminClient
from orbitmq.common.errors import MQError

cluster_app = typer.Typer(no_args_is_help=True, help="Clusters and their brokers.")
cluster_app.command("up")(cluster_up)


@cluster_app.command("list")
def cluster_list(namesrv: NamesrvOpt = DEFAULT_NAMESRV) -> None:
    """List clusters, their brokers and each broker's runtime state.

    Example: orbitmq cluster list
    """

    async def go() -> None:
        async with AsyncAdminClient(namesrv, admin_config()) as admin:
            info = await admin.cluster_info()
            rows: list[tuple[str, str, int, str]] = []
            for cluster in sorted(info.cluster_addr_table):
                for name in sorted(info.cluster_addr_table[cluster]):
                    bd = info.broker_addr_table.get(name)
                    for bid, addr in sorted(bd.broker_addrs.items()) if bd else []:
                        rows.append((cluster, name, bid, addr))
            runtime = await asyncio.gather(
                *(admin.broker_runtime_info(r[3]) for r in rows), return_exceptions=True
            )
        console = out()
        if not rows:
            console.print("no broker is registered with the NameServers")
            return
        problems: list[str] = []
        for cluster in sorted({r[0] for r in rows}):
            table = Table(
                Column("broker", no_wrap=True),
                Column("address", no_wrap=True),
                Column("commit log", justify="right", no_wrap=True),
                Column("lag", justify="right", no_wrap=True),
                Column("disk", justify="right", no_wrap=True),
                Column("on disk", justify="right", no_wrap=True),
                Column("flush", no_wrap=True),
                Column("topics", justify="right", no_wrap=True),
                Column("health"),
                title=f"cluster {escape(cluster)}",
                box=box.SIMPLE_HEAD,
                pad_edge=False,
            )
            for (c, name, bid, addr), rt in zip(rows, runtime, strict=True):
                if c != cluster:
                    continue
                broker = escape(name) + ("" if bid == 0 else f" (slave {bid})")
                if isinstance(rt, MQError):
                    problems.append(f"{name} at {addr}: {rt}")
                    table.add_row(broker, addr, "[red]unreachable[/]")
                    continue
                if isinstance(rt, BaseException):
                    raise rt
                table.add_row(
                    broker,
                    addr,
                    _int_text(rt.get("commit_log_max_offset"), human_bytes),
                    _int_text(rt.get("dispatch_lag_bytes"), human_bytes),
                    _percent(rt.get("disk_used_percent")),
                    _int_text(rt.get("disk_used_bytes"), human_bytes),
                    str(rt.get("flush_disk_type", "?")),
                    _int_text(rt.get("topics"), str),
                    _health(rt.get("health")),
                )
            console.print(table)
        for line in problems:
            console.print(f"[red]{escape(line)}[/]", soft_wrap=True)

    run(go())


def _int_text(value: Any, fmt: Any) -> str:
    try:
        return str(fmt(int(value)))
    except (TypeError, ValueError):
        return "?"


def _percent(value: Any) -> str:
    """The broker reports disk_used_percent (as the store's watermark settings)."""
    try:
        return f"{float(value):.0f}%"
    except (TypeError, ValueError):
        return "?"


def _health(value: Any) -> str:
    """The broker's health line: "ok", or what is degraded and why (in red)."""
    if value is None:
        return "?"  # a broker from before health was reported
    text = escape(str(value))
    return text if text == "ok" else f"[red]{text}[/]"


cluster_app.command("describe")(cluster_describe)

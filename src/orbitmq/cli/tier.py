"""``orbitmq tier status``: how far each broker's tier has come (docs/tiered-storage.md).

Per broker (GET_BROKER_RUNTIME_INFO's ``tier_*`` fields): whether the object store is reachable,
failed upload turns, messages not uploaded yet and how long the oldest waits. Per queue
(GET_TOPIC_STATS's tier fields, for the topics asked for or all of them): the tier's range, the
local range, the upload lag in messages and the last upload. A broker without a tier shows
"off". Nothing here needs a request of its own: both requests already exist.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Column, Table

from orbitmq.cli.common import DEFAULT_NAMESRV, NamesrvOpt, out, run, timestamp
from orbitmq.client import AsyncAdminClient
from orbitmq.protocol.bodies import TopicStats

tier_app = typer.Typer(no_args_is_help=True, help="Tiered storage: upload progress and ranges.")

TopicsOpt = Annotated[
    list[str] | None,
    typer.Option("--topic", "-t", help="Only these topics (repeatable); default: all."),
]


async def _gather(namesrv: str, topics: list[str] | None) -> tuple[
    list[tuple[str, str, dict[str, Any] | BaseException]], list[TopicStats]
]:  # fmt: skip
    async with AsyncAdminClient(namesrv) as admin:
        info = await admin.cluster_info()
        masters = sorted(
            (name, bd.broker_addrs[0])
            for name, bd in info.broker_addr_table.items()
            if 0 in bd.broker_addrs
        )
        runtime = await asyncio.gather(
            *(admin.broker_runtime_info(addr) for _, addr in masters), return_exceptions=True
        )
        names = topics or sorted(t for t in await admin.list_topics() if not t.startswith("RMQ_"))
        stats: list[TopicStats] = []
        for res in await asyncio.gather(
            *(admin.topic_stats(t) for t in names), return_exceptions=True
        ):
            if isinstance(res, list):
                stats.extend(res)
    brokers = [(n, a, r) for (n, a), r in zip(masters, runtime, strict=True)]
    return brokers, stats


@tier_app.command("status")
def tier_status(topic: TopicsOpt = None, namesrv: NamesrvOpt = DEFAULT_NAMESRV) -> None:
    """Show each broker's tier (reachable, errors, upload lag) and, per queue, the tier and
    local ranges, the messages not uploaded yet and the last upload.

    Example: orbitmq tier status -t Orders
    """
    brokers, stats = run(_gather(namesrv, topic))
    console = out()
    table = Table(
        Column("broker", no_wrap=True),
        Column("tier", no_wrap=True),
        Column("errors", justify="right"),
        Column("lag (msgs)", justify="right"),
        Column("oldest wait", justify="right"),
        Column("uploaded", justify="right"),
        Column("gaps", justify="right"),
        title="brokers",
    )
    for name, addr, rt in brokers:
        if isinstance(rt, BaseException):
            table.add_row(escape(name), f"[red]{escape(str(rt))}[/]", "", "", "", "", "")
            continue
        if "tier_available" not in rt:
            table.add_row(escape(name), "off", "", "", "", "", "")
            continue
        up = str(rt["tier_available"]) == "1"
        table.add_row(
            f"{escape(name)} ({escape(addr)})",
            "[green]available[/]" if up else "[red]unavailable[/]",
            str(rt.get("tier_errors", 0)),
            str(rt.get("tier_upload_lag_messages", 0)),
            f"{int(rt.get('tier_upload_lag_ms', 0)) / 1000:.1f} s",
            f"{rt.get('tier_uploaded_chunks', 0)} chunks",
            str(rt.get("tier_gap_messages", 0)),
        )
    console.print(table)
    queues = Table(
        Column("broker", no_wrap=True),
        Column("topic", no_wrap=True),
        Column("queue", justify="right"),
        Column("tier", justify="right", no_wrap=True),
        Column("local", justify="right", no_wrap=True),
        Column("lag (msgs)", justify="right"),
        Column("last upload", no_wrap=True),
        title="queues",
    )
    for ts in sorted(stats, key=lambda s: (s.topic, s.broker_name)):
        for q in sorted(ts.queues, key=lambda q: q.queue_id):
            if q.tier_max_offset is None:
                continue
            queues.add_row(
                escape(ts.broker_name),
                escape(ts.topic),
                str(q.queue_id),
                f"[{q.tier_min_offset}, {q.tier_max_offset})",
                f"[{q.local_min_offset}, {q.max_offset})",
                str(max(0, q.max_offset - q.tier_max_offset)),
                timestamp(q.tier_last_upload_ms, zone=False) if q.tier_last_upload_ms else "never",
            )
    console.print(queues)

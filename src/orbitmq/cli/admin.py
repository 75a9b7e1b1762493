"""Topic administration: ``orbitmq topic create|update|delete|list|describe``.

The other read-only views have modules of their own: :mod:`orbitmq.cli.cluster` (``orbitmq
cluster list``) and :mod:`orbitmq.cli.message` (``orbitmq message get|query``). Everything goes
through :class:`orbitmq.client.AsyncAdminClient` (the Remoting protocol), never to a
store or broker object directly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Column, Table

from orbitmq.cli.common import (
    DEFAULT_NAMESRV,
    NamesrvOpt,
    TopicOpt,
    admin_config,
    human_bytes,
    out,
    parse_perm,
    perm_text,
    run,
    split_list,
    timestamp,
)
from orbitmq.client import AsyncAdminClient
from orbitmq.client.route import TopicRouteNotFoundError
from orbitmq.common.errors import ClientError, MQError
from orbitmq.protocol.bodies import MESSAGE_TYPES, QueueStats, TopicConfig

topic_app = typer.Typer(
    no_args_is_help=True, help="Create, change, delete, list and describe topics."
)

ClusterOpt = Annotated[
    str | None,
    typer.Option("--cluster", "-c", help="Cluster (default: the only one there is)."),
]
BrokerOpt = Annotated[
    str | None,
    typer.Option(
        "--broker",
        "-b",
        help="Only these brokers: names or host:port addresses, ';' or ',' separated.",
    ),
]
ROUTE_WAIT_S = 5.0


# ---------------------------------------------------------------------------------- helpers


def _message_type(value: str | None) -> str | None:
    if value is None:
        return None
    upper = value.strip().upper()
    if upper not in MESSAGE_TYPES:
        raise typer.BadParameter(
            f"{value!r}: one of {', '.join(MESSAGE_TYPES)}", param_hint="--type"
        )
    return upper


async def _broker_addrs(admin: AsyncAdminClient, brokers: Sequence[str]) -> list[str]:
    """Broker names or addresses -> master addresses (names are looked up in the cluster)."""
    out_addrs: list[str] = []
    names = [b for b in brokers if ":" not in b]
    masters: dict[str, str] = {}
    if names:
        info = await admin.cluster_info()
        for name, bd in info.broker_addr_table.items():
            master = bd.master_addr()
            if master:
                masters[name] = master
    for b in brokers:
        if ":" in b:
            out_addrs.append(b)
        elif b in masters:
            out_addrs.append(masters[b])
        else:
            known = ", ".join(sorted(masters)) or "none"
            raise ClientError(f"no broker {b!r} with a master is registered (known: {known})")
    return list(dict.fromkeys(out_addrs))


async def _wait_for_route(admin: AsyncAdminClient, config: TopicConfig, brokers: int) -> bool:
    """Wait (up to ROUTE_WAIT_S) until the NameServers route the topic to ``brokers`` brokers
    with the config's queue counts. Brokers re-register right after a change."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ROUTE_WAIT_S
    while True:
        try:
            route = await admin.topic_route(config.topic_name)
        except ClientError:
            route = None
        if route is not None:
            ready = [
                qd
                for qd in route.queue_datas
                if qd.read_queue_nums == config.read_queue_nums
                and qd.write_queue_nums == config.write_queue_nums
            ]
            if len(ready) >= brokers:
                return True
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.1)


async def _wait_for_absence(admin: AsyncAdminClient, topic: str) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ROUTE_WAIT_S
    while topic in await admin.list_topics():
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.1)
    return True


async def _current_config(
    admin: AsyncAdminClient, topic: str
) -> tuple[TopicConfig, dict[str, str]]:
    """The topic's config as its first broker has it, and broker name -> master address."""
    missing = ClientError(f"topic {topic!r} does not exist (create it with `orbitmq topic create`)")
    try:
        info = await admin.routes.refresh(topic)
    except TopicRouteNotFoundError:
        raise missing from None
    if info.route is None or not info.broker_addrs:
        raise missing
    for name in sorted(info.broker_addrs):
        for config in await admin.topic_configs(info.broker_addrs[name]):
            if config.topic_name == topic:
                return config, dict(info.broker_addrs)
    raise ClientError(f"no broker of topic {topic!r} has its configuration")


def _targets_text(addrs: Sequence[str]) -> str:
    return ", ".join(addrs)


# ---------------------------------------------------------------------------------- topic


@topic_app.command("create")
def topic_create(
    topic: TopicOpt,
    queues: Annotated[
        int, typer.Option("--queues", "-q", min=1, help="Read and write queues per broker.")
    ] = 8,
    read_queues: Annotated[
        int | None, typer.Option(min=0, help="Read queues per broker (default: --queues).")
    ] = None,
    write_queues: Annotated[
        int | None, typer.Option(min=0, help="Write queues per broker (default: --queues).")
    ] = None,
    perm: Annotated[str, typer.Option(help="RW, R, W or a number (6 = RW).")] = "RW",
    message_type: Annotated[
        str, typer.Option("--type", help="NORMAL, FIFO, DELAY, TRANSACTION or MIXED.")
    ] = "NORMAL",
    retention_ms: Annotated[
        int | None, typer.Option(min=1, help="Serve no message older than this.")
    ] = None,
    retention_bytes: Annotated[
        int | None, typer.Option(min=1, help="Keep at most this many bytes per queue.")
    ] = None,
    tier_retention_ms: Annotated[
        int | None, typer.Option(min=1, help="Tiered storage keeps chunks this long.")
    ] = None,
    cluster: ClusterOpt = None,
    broker: BrokerOpt = None,
    namesrv: NamesrvOpt = DEFAULT_NAMESRV,
) -> None:
    """Create a topic on every master of the cluster (or on --broker).

    Example: orbitmq topic create -t Orders --queues 4 --type FIFO --retention-ms 86400000
    """
    config = TopicConfig(
        topic_name=topic,
        read_queue_nums=queues if read_queues is None else read_queues,
        write_queue_nums=queues if write_queues is None else write_queues,
        perm=parse_perm(perm),
        message_type=_message_type(message_type) or "NORMAL",
        retention_ms=retention_ms,
        retention_bytes=retention_bytes,
        tier_retention_ms=tier_retention_ms,
    )

    async def go() -> None:
        async with AsyncAdminClient(namesrv, admin_config()) as admin:
            if topic in await admin.list_topics():
                raise ClientError(
                    f"topic {topic!r} already exists (change it with `orbitmq topic update`)"
                )
            await _apply(admin, config, cluster, broker, "created")

    run(go())


async def _apply(
    admin: AsyncAdminClient, config: TopicConfig, cluster: str | None, broker: str | None, verb: str
) -> None:
    addrs: list[str] = []
    if broker:
        addrs = await _broker_addrs(admin, split_list(broker))
        for addr in addrs:
            await admin.update_topic(config, broker_addr=addr)
    else:
        addrs = await admin.update_topic(config, cluster=cluster)
    console = out()
    console.print(
        f"{verb} topic [bold]{escape(config.topic_name)}[/] on {_targets_text(addrs)}: "
        f"{config.read_queue_nums} read / {config.write_queue_nums} write queues, "
        f"perm {perm_text(config.perm)}, type {config.message_type}",
        soft_wrap=True,
    )
    if not await _wait_for_route(admin, config, len(addrs)):
        console.print(
            f"[yellow]note:[/] the NameServers do not show the change yet "
            f"(waited {ROUTE_WAIT_S:.0f} s); brokers register it with their next heartbeat"
        )


@topic_app.command("update")
def topic_update(
    topic: TopicOpt,
    queues: Annotated[
        int | None, typer.Option("--queues", "-q", min=1, help="Read and write queues per broker.")
    ] = None,
    read_queues: Annotated[int | None, typer.Option(min=0, help="Read queues per broker.")] = None,
    write_queues: Annotated[
        int | None, typer.Option(min=0, help="Write queues per broker.")
    ] = None,
    perm: Annotated[str | None, typer.Option(help="RW, R, W or a number (6 = RW).")] = None,
    message_type: Annotated[
        str | None, typer.Option("--type", help="NORMAL, FIFO, DELAY, TRANSACTION or MIXED.")
    ] = None,
    retention_ms: Annotated[
        int | None, typer.Option(help="Serve no message older than this (0: broker default).")
    ] = None,
    retention_bytes: Annotated[
        int | None, typer.Option(help="Keep at most this many bytes per queue (0: no limit).")
    ] = None,
    tier_retention_ms: Annotated[
        int | None, typer.Option(help="Tiered storage keeps chunks this long (0: broker's).")
    ] = None,
    cluster: ClusterOpt = None,
    broker: BrokerOpt = None,
    namesrv: NamesrvOpt = DEFAULT_NAMESRV,
) -> None:
    """Change an existing topic; options not given keep their current value.

    Applies to the brokers that hold the topic, or to --cluster/--broker (which may add it to
    more brokers). Example: orbitmq topic update -t Orders --write-queues 8 --perm R
    """
    new_perm = parse_perm(perm) if perm is not None else None
    new_type = _message_type(message_type)

    async def go() -> None:
        async with AsyncAdminClient(namesrv, admin_config()) as admin:
            current, holders = await _current_config(admin, topic)
            changes: dict[str, Any] = {}
            if queues is not None:
                changes.update(read_queue_nums=queues, write_queue_nums=queues)
            if read_queues is not None:
                changes["read_queue_nums"] = read_queues
            if write_queues is not None:
                changes["write_queue_nums"] = write_queues
            if new_perm is not None:
                changes["perm"] = new_perm
            if new_type is not None:
                changes["message_type"] = new_type
            if retention_ms is not None:
                changes["retention_ms"] = retention_ms or None
            if retention_bytes is not None:
                changes["retention_bytes"] = retention_bytes or None
            if tier_retention_ms is not None:
                changes["tier_retention_ms"] = tier_retention_ms or None
            fields = {f: getattr(current, f) for f in current.__struct_fields__}
            config = TopicConfig(**{**fields, **changes})
            if cluster is None and broker is None:
                target = ";".join(sorted(holders.values()))
                await _apply(admin, config, None, target, "updated")
            else:
                await _apply(admin, config, cluster, broker, "updated")

    run(go())


@topic_app.command("delete")
def topic_delete(
    topic: TopicOpt,
    cluster: ClusterOpt = None,
    namesrv: NamesrvOpt = DEFAULT_NAMESRV,
) -> None:
    """Delete a topic and its messages from every broker holding it and from the NameServers.

    Example: orbitmq topic delete -t Orders
    """

    async def go() -> None:
        async with AsyncAdminClient(namesrv, admin_config()) as admin:
            addrs = await admin.delete_topic(topic, cluster=cluster)
            gone = await _wait_for_absence(admin, topic)
        console = out()
        console.print(
            f"deleted topic [bold]{escape(topic)}[/] on {_targets_text(addrs) or 'no broker'}",
            soft_wrap=True,
        )
        if not gone:
            console.print("[yellow]note:[/] a NameServer still lists it")

    run(go())


@topic_app.command("list")
def topic_list(
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Names only, one a line.")] = False,
    namesrv: NamesrvOpt = DEFAULT_NAMESRV,
) -> None:
    """List topics with their brokers, queues, permission and type.

    Example: orbitmq topic list
    """

    async def go() -> None:
        async with AsyncAdminClient(namesrv, admin_config()) as admin:
            names = await admin.list_topics()
            if quiet:
                for name in names:
                    print(name)
                return
            info = await admin.cluster_info()
            masters = {n: a for n, bd in info.broker_addr_table.items() if (a := bd.master_addr())}
            order = sorted(masters)
            results = await asyncio.gather(
                *(admin.topic_configs(masters[n]) for n in order), return_exceptions=True
            )
        per_topic: dict[str, list[tuple[str, TopicConfig]]] = {}
        unreachable: list[str] = []
        for name, res in zip(order, results, strict=True):
            if isinstance(res, MQError):
                unreachable.append(f"{name}: {res}")
                continue
            if isinstance(res, BaseException):
                raise res
            for config in res:
                per_topic.setdefault(config.topic_name, []).append((name, config))
        table = Table("topic", "brokers", "read/write queues", "perm", "type", "retention")
        for topic in names:
            held = per_topic.get(topic, [])
            if not held:
                table.add_row(escape(topic), "?", "?", "?", "?", "?")
                continue
            table.add_row(
                escape(topic),
                ", ".join(b for b, _ in held),
                ", ".join(f"{c.read_queue_nums}/{c.write_queue_nums}" for _, c in held),
                ", ".join(sorted({perm_text(c.perm) for _, c in held})),
                ", ".join(sorted({c.message_type for _, c in held})),
                ", ".join(sorted({_retention(c) for _, c in held})),
            )
        console = out()
        console.print(table)
        console.print(f"{len(names)} topic{'s' if len(names) != 1 else ''}")
        for line in unreachable:
            console.print(f"[yellow]broker {escape(line)}[/]", soft_wrap=True)

    run(go())


def _retention(config: TopicConfig) -> str:
    parts = []
    if config.retention_ms:
        parts.append(f"{config.retention_ms} ms")
    if config.retention_bytes:
        parts.append(f"{human_bytes(config.retention_bytes)}/queue")
    if config.tier_retention_ms:
        parts.append(f"tier {config.tier_retention_ms} ms")
    return ", ".join(parts) or "default"


def _tier_ranges(q: QueueStats) -> tuple[str, str]:
    """The "local" and "tier" cells of one queue: the offsets on disk, the offsets uploaded."""
    return f"[{q.local_min_offset}, {q.max_offset})", f"[{q.tier_min_offset}, {q.tier_max_offset})"


@topic_app.command("describe")
def topic_describe(topic: TopicOpt, namesrv: NamesrvOpt = DEFAULT_NAMESRV) -> None:
    """Show a topic's route and, per queue, its min/max offsets and last store time.

    Example: orbitmq topic describe -t Orders
    """

    async def go() -> None:
        async with AsyncAdminClient(namesrv, admin_config()) as admin:
            desc = await admin.describe_topic(topic)
            addrs = {
                bd.broker_name: bd.master_addr() or ""
                for bd in desc.route.broker_datas
                if bd.master_addr()
            }
            order = sorted(addrs)
            configs = await asyncio.gather(
                *(admin.topic_configs(addrs[n]) for n in order), return_exceptions=True
            )
        console = out()
        config = next(
            (c for res in configs if isinstance(res, list) for c in res if c.topic_name == topic),
            None,
        )
        console.print(f"[bold]topic[/] {escape(topic)}", soft_wrap=True)
        if config is not None:
            console.print(
                f"type {config.message_type}, perm {perm_text(config.perm)}, "
                f"retention {_retention(config)}"
            )
        route = Table(
            Column("broker", no_wrap=True),
            Column("cluster", no_wrap=True),
            Column("address", no_wrap=True),
            Column("read", justify="right"),
            Column("write", justify="right"),
            "perm",
            title="route (queues per broker)",
        )
        queue_datas = {qd.broker_name: qd for qd in desc.route.queue_datas}
        for bd in sorted(desc.route.broker_datas, key=lambda b: b.broker_name):
            qd = queue_datas.get(bd.broker_name)
            route.add_row(
                escape(bd.broker_name),
                escape(bd.cluster),
                ", ".join(
                    a if i == 0 else f"{a} (slave {i})" for i, a in sorted(bd.broker_addrs.items())
                ),
                str(qd.read_queue_nums) if qd else "-",
                str(qd.write_queue_nums) if qd else "-",
                perm_text(qd.perm) if qd else "-",
            )
        console.print(route)
        queues = Table(
            Column("broker", no_wrap=True),
            Column("queue", justify="right"),
            Column("min offset", justify="right"),
            Column("max offset", justify="right"),
            Column("messages", justify="right"),
            Column("last stored", no_wrap=True),
            title="queues",
        )
        tiered = any(q.tier_max_offset is not None for s in desc.stats for q in s.queues)
        if tiered:  # docs/tiered-storage.md: where each range lives
            queues.add_column("local", justify="right", no_wrap=True)
            queues.add_column("tier", justify="right", no_wrap=True)
        total = 0
        for stats in desc.stats:
            for q in sorted(stats.queues, key=lambda q: q.queue_id):
                count = max(0, q.max_offset - q.min_offset)
                total += count
                queues.add_row(
                    escape(stats.broker_name),
                    str(q.queue_id),
                    str(q.min_offset),
                    str(q.max_offset),
                    str(count),
                    timestamp(q.last_update_timestamp_ms, zone=False),
                    *(_tier_ranges(q) if tiered else ()),
                )
        queues.add_section()
        queues.add_row("total", "", "", "", str(total), "")
        console.print(queues)
        for name, why in sorted(desc.errors.items()):
            console.print(f"[red]broker {escape(name)}: {escape(why)}[/]", soft_wrap=True)

    run(go())

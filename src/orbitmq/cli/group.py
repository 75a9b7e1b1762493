"""Consumer groups: ``orbitmq group list``, ``orbitmq group describe G``,
``orbitmq group reset-offset G --topic T --to-earliest|--to-latest|--to-timestamp X``,
``orbitmq group config show|set|delete G`` (retry policy and DLQ limit).

Everything goes through :class:`orbitmq.client.AsyncAdminClient`: the brokers are the source of
truth for who is in a group (its members' heartbeats) and how far it got (committed offsets).
"""

from __future__ import annotations

import datetime
from typing import Annotated

import msgspec
import typer
from rich import box
from rich.markup import escape
from rich.table import Column, Table

from orbitmq.cli.common import (
    DEFAULT_NAMESRV,
    NamesrvOpt,
    TopicOpt,
    admin_config,
    fail,
    out,
    run,
    timestamp,
)
from orbitmq.client import AsyncAdminClient
from orbitmq.client.admin.types import GroupDescription
from orbitmq.protocol.consumer import is_system_group_topic
from orbitmq.protocol.group_config import SubscriptionGroupConfig

group_app = typer.Typer(
    no_args_is_help=True,
    help="Consumer groups: list them, see members and lag, move their offsets.",
)

GroupArg = Annotated[
    str, typer.Argument(metavar="GROUP", help="Consumer group name.", show_default=False)
]


def parse_time(value: str) -> int:
    """``--to-timestamp``: milliseconds since the epoch (digits), or an ISO 8601 date/time
    (``2026-11-22T10:00:00+01:00``, ``2026-11-22 10:00``, ``...Z``); without a UTC offset it is
    local time."""
    text = value.strip()
    if text.isdigit():
        return int(text)
    try:
        dt = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(
            f"{value!r}: milliseconds since the epoch or an ISO 8601 time "
            "like 2026-11-22T10:00:00+01:00",
            param_hint="--to-timestamp",
        ) from None
    if dt.tzinfo is None:
        dt = dt.astimezone()  # local time
    ms = int(dt.timestamp() * 1000)
    if ms < 0:
        raise typer.BadParameter(f"{value!r} is before 1970", param_hint="--to-timestamp")
    return ms


@group_app.command("list")
def group_list(
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Names only, one a line.")] = False,
    namesrv: NamesrvOpt = DEFAULT_NAMESRV,
) -> None:
    """List the consumer groups the brokers know (online, or with committed offsets).

    Example: orbitmq group list
    """

    async def go() -> None:
        async with AsyncAdminClient(namesrv, admin_config()) as admin:
            groups = await admin.list_groups()
        if quiet:
            for g in groups:
                print(g.group)
            return
        table = Table(
            Column("group", no_wrap=True),
            "type",
            "model",
            Column("members", justify="right"),
            "topics",
        )
        for g in groups:
            topics = [t for t in g.topics if not is_system_group_topic(t)]
            table.add_row(
                escape(g.group),
                g.consume_type or "-",
                g.message_model or "-",
                str(g.members),
                escape(", ".join(topics) or "-"),
            )
        console = out()
        console.print(table)
        console.print(f"{len(groups)} group{'s' if len(groups) != 1 else ''}")

    run(go())


@group_app.command("describe")
def group_describe(group: GroupArg, namesrv: NamesrvOpt = DEFAULT_NAMESRV) -> None:
    """Show a group's members and, per queue, the broker offset, the group's committed offset,
    the lag and the last consume time; then the total lag.

    Example: orbitmq group describe OrderProcessors
    """

    async def go() -> GroupDescription:
        async with AsyncAdminClient(namesrv, admin_config()) as admin:
            return await admin.describe_group(group)

    desc = run(go())
    print_group(desc)


def _subscription(topic: str, expression_type: str, expression: str) -> str:
    if expression_type == "TAG":
        return f"{topic} {expression}"
    return f"{topic} {expression_type} {expression}"


def print_group(desc: GroupDescription) -> None:
    console = out()
    kind = ", ".join(
        x for x in (desc.consume_type, desc.message_model, desc.consume_from_where) if x
    )
    console.print(
        f"[bold]group[/] {escape(desc.group)}" + (f"  ({kind})" if kind else ""), soft_wrap=True
    )
    if desc.members:
        members = Table(
            Column("client id", no_wrap=True),
            Column("address", no_wrap=True),
            "version",
            Column("last heartbeat", no_wrap=True),
            "subscriptions",
            title=f"members ({len(desc.members)})",
            box=box.SIMPLE_HEAD,
        )
        for m in desc.members:
            subs = "; ".join(
                _subscription(s.topic, s.expression_type, s.expression)
                for s in m.subscriptions
                if not is_system_group_topic(s.topic)
            )
            members.add_row(
                escape(m.client_id),
                escape(m.addr),
                escape(f"{m.language} {m.version}".strip()),
                timestamp(m.last_heartbeat_ms, zone=False),
                escape(subs or "-"),
            )
        console.print(members)
    else:
        console.print("no member online")
    queues = Table(
        Column("topic", no_wrap=True),
        Column("broker", no_wrap=True),
        Column("queue", justify="right"),
        Column("broker offset", justify="right"),
        Column("consumer offset", justify="right"),
        Column("lag", justify="right"),
        Column("inflight", justify="right"),
        Column("last consume time", no_wrap=True),
        title="queues",
        box=box.SIMPLE_HEAD,
    )
    for q in desc.queues:
        queues.add_row(
            escape(q.topic),
            escape(q.broker_name),
            str(q.queue_id),
            str(q.broker_offset),
            str(q.consumer_offset) if q.consumer_offset >= 0 else "-",
            str(q.lag),
            str(q.inflight),
            timestamp(q.last_consume_timestamp_ms, zone=False),
        )
    queues.add_section()
    queues.add_row("total", "", "", "", "", str(desc.total_lag), str(desc.total_inflight), "")
    console.print(queues)
    console.print(f"total lag {desc.total_lag}")
    for name, why in desc.errors.items():
        console.print(f"[red]broker {escape(name)}: {escape(why)}[/]", soft_wrap=True)


@group_app.command("reset-offset")
def group_reset_offset(
    group: GroupArg,
    topic: TopicOpt,
    to_earliest: Annotated[
        bool, typer.Option("--to-earliest", help="Each queue's oldest kept message.")
    ] = False,
    to_latest: Annotated[
        bool, typer.Option("--to-latest", help="Each queue's end: skip everything kept.")
    ] = False,
    to_timestamp: Annotated[
        str | None,
        typer.Option(
            "--to-timestamp",
            help="The first message stored at or after this time: ms since the epoch or "
            "ISO 8601 (local time without an offset).",
        ),
    ] = None,
    namesrv: NamesrvOpt = DEFAULT_NAMESRV,
) -> None:
    """Move a group's committed offsets in every queue of a topic; online members are told
    at once (they continue from there).

    Example: orbitmq group reset-offset OrderProcessors -t Orders --to-timestamp 2026-11-22T10:00
    """
    chosen = [to_earliest, to_latest, to_timestamp is not None]
    if sum(chosen) != 1:
        raise typer.BadParameter(
            "give exactly one of --to-earliest, --to-latest, --to-timestamp",
            param_hint="--to-*",
        )
    ts_ms: int | None = None
    if to_timestamp is not None:
        position = "timestamp"
        ts_ms = parse_time(to_timestamp)
        where = f"{timestamp(ts_ms)} ({ts_ms})"
    else:
        position = "earliest" if to_earliest else "latest"
        where = position

    async def go() -> dict[str, list[tuple[int, int]]]:
        async with AsyncAdminClient(namesrv, admin_config()) as admin:
            result = await admin.reset_offset(group, topic, position, ts_ms)
        return {b: [(o.queue_id, o.offset) for o in offs] for b, offs in result.items()}

    result = run(go())
    console = out()
    table = Table(
        Column("broker", no_wrap=True),
        Column("queue", justify="right"),
        Column("new offset", justify="right"),
        box=box.SIMPLE_HEAD,
    )
    queues = 0
    for broker, offsets in result.items():
        if not offsets:
            table.add_row(escape(broker), "-", "[dim]group unknown there[/]")
        for queue_id, offset in offsets:
            table.add_row(escape(broker), str(queue_id), str(offset))
            queues += 1
    if not queues:
        fail(f"no queue of topic {topic!r} was reset for group {group!r}")
    console.print(table)
    console.print(
        f"reset group [bold]{escape(group)}[/] on topic [bold]{escape(topic)}[/] to {where}: "
        f"{queues} queue{'s' if queues != 1 else ''} on {len(result)} "
        f"broker{'s' if len(result) != 1 else ''}",
        soft_wrap=True,
    )


# ---------------------------------------------------------------------- group configs

config_app = typer.Typer(
    no_args_is_help=True,
    help="A group's retry policy and dead-letter limit, kept by every broker (docs/retry-dlq.md).",
)
group_app.add_typer(config_app, name="config")

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(value: str, option: str) -> int:
    """``250ms``, ``10s``, ``1m``, ``2h``, ``1d``, or plain milliseconds."""
    text = value.strip().lower()
    number, unit = text, "ms"
    for suffix in ("ms", "s", "m", "h", "d"):
        if text.endswith(suffix):
            number, unit = text[: -len(suffix)], suffix
            break
    try:
        amount = float(number)
    except ValueError:
        raise typer.BadParameter(
            f"{value!r}: a duration like 500ms, 10s, 1m, 2h (or milliseconds)", param_hint=option
        ) from None
    if amount < 0:
        raise typer.BadParameter(f"{value!r} is negative", param_hint=option)
    return round(amount * _UNITS_MS[unit])


def parse_delays(value: str, option: str) -> list[int]:
    """A comma- or space-separated list of durations: ``10s,30s,1m,2m``."""
    return [parse_duration_ms(item, option) for item in value.replace(",", " ").split()]


def duration_text(ms: int) -> str:
    for unit in ("d", "h", "m", "s"):
        size = _UNITS_MS[unit]
        if ms >= size and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def print_group_config(config: SubscriptionGroupConfig) -> None:
    pop = config.pop_retry_delays_ms
    rows = [
        ("group", config.group_name),
        ("retry max times", str(config.retry_max_times)),
        ("retry delays", " ".join(map(duration_text, config.retry_delays_ms))),
        (
            "pop retry delays",
            "same as retry delays"
            if pop is None
            else (" ".join(map(duration_text, pop)) or "none (the invisible time alone)"),
        ),
        ("orderly retry interval", duration_text(config.orderly_retry_interval_ms)),
        ("consume enabled", "yes" if config.consume_enable else "no"),
        ("fifo", "yes" if config.fifo else "no"),
    ]
    table = Table(Column("setting", no_wrap=True), Column("value"), box=box.SIMPLE_HEAD)
    for name, value in rows:
        table.add_row(name, escape(value))
    out().print(table)


@config_app.command("show")
def group_config_show(group: GroupArg, namesrv: NamesrvOpt = DEFAULT_NAMESRV) -> None:
    """Show a group's retry policy (RocketMQ's defaults when it was never configured).

    Example: orbitmq group config show OrderProcessors
    """

    async def go() -> SubscriptionGroupConfig:
        async with AsyncAdminClient(namesrv, admin_config()) as admin:
            return await admin.get_group_config(group)

    print_group_config(run(go()))


@config_app.command("set")
def group_config_set(
    group: GroupArg,
    retry_max_times: Annotated[
        int | None,
        typer.Option(
            "--retry-max-times",
            min=0,
            help="Redeliveries before a message goes to %DLQ%<group> (RocketMQ: 16).",
        ),
    ] = None,
    retry_delays: Annotated[
        str | None,
        typer.Option(
            "--retry-delays",
            help="Push backoff per attempt, e.g. '10s,30s,1m,2m' (the last repeats).",
        ),
    ] = None,
    pop_retry_delays: Annotated[
        str | None,
        typer.Option(
            "--pop-retry-delays",
            help="Pop backoff beyond the invisible time; 'same' (the push list) or 'none'.",
        ),
    ] = None,
    orderly_retry_interval: Annotated[
        str | None,
        typer.Option("--orderly-retry-interval", help="Orderly in-place retry interval (3s)."),
    ] = None,
    fifo: Annotated[
        bool | None, typer.Option("--fifo/--no-fifo", help="Pop FIFO consumption.")
    ] = None,
    namesrv: NamesrvOpt = DEFAULT_NAMESRV,
) -> None:
    """Change a group's retry policy on every broker; settings not given keep their values.

    Example: orbitmq group config set OrderProcessors --retry-max-times 3 --retry-delays 5s,30s
    """
    changes: dict[str, object] = {}
    if retry_max_times is not None:
        changes["retry_max_times"] = retry_max_times
    if retry_delays is not None:
        changes["retry_delays_ms"] = parse_delays(retry_delays, "--retry-delays")
    if pop_retry_delays is not None:
        word = pop_retry_delays.strip().lower()
        changes["pop_retry_delays_ms"] = (
            None
            if word == "same"
            else []
            if word == "none"
            else parse_delays(pop_retry_delays, "--pop-retry-delays")
        )
    if orderly_retry_interval is not None:
        changes["orderly_retry_interval_ms"] = parse_duration_ms(
            orderly_retry_interval, "--orderly-retry-interval"
        )
    if fifo is not None:
        changes["fifo"] = fifo
    if not changes:
        raise typer.BadParameter("give at least one setting to change", param_hint="options")

    async def go() -> tuple[SubscriptionGroupConfig, list[str]]:
        async with AsyncAdminClient(namesrv, admin_config()) as admin:
            current = await admin.get_group_config(group)
            updated = msgspec.structs.replace(current, **changes)
            return updated, await admin.update_group_config(updated)

    updated, brokers = run(go())
    print_group_config(updated)
    out().print(f"updated on {len(brokers)} broker{'s' if len(brokers) != 1 else ''}")


@config_app.command("delete")
def group_config_delete(group: GroupArg, namesrv: NamesrvOpt = DEFAULT_NAMESRV) -> None:
    """Forget a group's config on every broker: it is back to RocketMQ's defaults."""

    async def go() -> list[str]:
        async with AsyncAdminClient(namesrv, admin_config()) as admin:
            return await admin.delete_group_config(group)

    brokers = run(go())
    where = ", ".join(brokers) if brokers else "no broker had one"
    out().print(f"config of group {escape(group)} deleted ({where})")

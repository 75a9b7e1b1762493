"""``orbitmq message get|query|trace``: look a message up by its id or by a key, and show it
whole (system properties apart, a body preview as ``orbitmq tail`` prints it); show the trace
timeline the brokers wrote for it (RMQ_SYS_TRACE_TOPIC).
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from orbitmq.cli.common import (
    DEFAULT_NAMESRV,
    NamesrvOpt,
    TopicOpt,
    admin_config,
    body_preview,
    fail,
    out,
    run,
    timestamp,
)
from orbitmq.client import AsyncAdminClient
from orbitmq.common.record import StoredMessage
from orbitmq.common.trace import (
    TRACE_TOPIC,
    decode_records,
    timeline,
    trace_details,
    trace_label,
)

message_app = typer.Typer(no_args_is_help=True, help="Look messages up by id or key.")

_HIDDEN_PROPERTIES = ("UNIQ_CLIENT_MESSAGE_ID_KEYIDX", "TAGS", "KEYS")
"""Shown in rows of their own (tags, keys, msg id), not among the properties."""


PreviewOpt = Annotated[
    int, typer.Option("--preview", help="Body characters (or bytes as hex) to show; 0: all.")
]


def _host(host: tuple[str, int]) -> str:
    return f"{host[0]}:{host[1]}" if host[1] else "-"


def _describe_message(console: Console, msg: StoredMessage, limit: int) -> None:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    user_props = {k: v for k, v in msg.properties.items() if k not in _HIDDEN_PROPERTIES}
    rows = [
        ("msg id", msg.msg_id or "-"),
        ("topic", msg.topic),
        ("tags", msg.tags or "-"),
        ("keys", " ".join(msg.keys) or "-"),
        ("queue id", str(msg.queue_id)),
        ("queue offset", str(msg.queue_offset)),
        ("commit log offset", str(msg.physical_offset)),
        ("store time", timestamp(msg.store_timestamp_ms)),
        ("born time", timestamp(msg.born_timestamp_ms)),
        ("born host", _host(msg.born_host)),
        ("store host", _host(msg.store_host)),
        ("reconsume times", str(msg.reconsume_times)),
        ("properties", ", ".join(f"{k}={v}" for k, v in sorted(user_props.items())) or "-"),
        ("body", f"{len(msg.body)} bytes"),
    ]
    for key, value in rows:
        table.add_row(key, escape(value))
    console.print(table)
    console.print(escape(body_preview(msg.body, limit)), soft_wrap=True)


@message_app.command("get")
def message_get(
    topic: TopicOpt,
    msg_id: Annotated[str, typer.Option("--id", help="The message id (as send prints it).")],
    preview: PreviewOpt = 512,
    namesrv: NamesrvOpt = DEFAULT_NAMESRV,
) -> None:
    """Show one message by its id.

    Example: orbitmq message get -t Orders --id 7F0000011A2B18B4AAC2...
    """

    async def go() -> None:
        async with AsyncAdminClient(namesrv, admin_config()) as admin:
            msg = await admin.get_message_by_id(topic, msg_id)
        if msg is None:
            fail(f"no message {msg_id} in topic {topic!r}")
        _describe_message(out(), msg, preview)

    run(go())


@message_app.command("query")
def message_query(
    topic: TopicOpt,
    key: Annotated[str, typer.Option("--key", "-k", help="A message key (or unique id).")],
    max_num: Annotated[int, typer.Option("--max", min=1, help="At most this many.")] = 32,
    preview: PreviewOpt = 80,
    namesrv: NamesrvOpt = DEFAULT_NAMESRV,
) -> None:
    """Find messages by key, oldest first.

    Example: orbitmq message query -t Orders --key order-42
    """

    async def go() -> None:
        async with AsyncAdminClient(namesrv, admin_config()) as admin:
            found = await admin.query_by_key(topic, key, max_num=max_num)
        if not found:
            fail(f"no message with key {key!r} in topic {topic!r}")
        console = out()
        for i, msg in enumerate(found):
            if i:
                console.print()
            _describe_message(console, msg, preview)
        console.print(f"\n{len(found)} message{'s' if len(found) != 1 else ''}")

    run(go())


@message_app.command("trace")
def message_trace(
    msg_id: Annotated[str, typer.Option("--msg-id", "--id", help="The traced message's id.")],
    topic: Annotated[
        str | None, typer.Option("--topic", "-t", help="Its topic (checked against Pub).")
    ] = None,
    namesrv: NamesrvOpt = DEFAULT_NAMESRV,
) -> None:
    """Show a message's trace: when it was stored (Pub), handed to each group (SubBefore) and
    consumed or acked (SubAfter), dead-lettered (DLQ), recalled (Recall) and its transaction's
    end, oldest first. Brokers write these
    records with trace_enable (docs/console.md#message-trace).

    Example: orbitmq message trace --msg-id 7F0000011A2B18B4AAC2... --topic Orders
    """

    async def go() -> None:
        async with AsyncAdminClient(namesrv, admin_config()) as admin:
            found = await admin.query_by_key(TRACE_TOPIC, msg_id, max_num=64)
        records = timeline([r for m in found for r in decode_records(m.body)], msg_id)
        if topic is not None:
            pub_topics = {r.topic for r in records if r.topic}
            if pub_topics and topic not in pub_topics:
                fail(f"message {msg_id} was sent to {', '.join(sorted(pub_topics))}, not {topic}")
        if not records:
            fail(f"no trace for message {msg_id} (is trace_enable on for its topic?)")
        table = Table(box=None, pad_edge=False)
        for name in ("time", "type", "group", "cost ms", "ok", "details"):
            table.add_column(name)
        for r in records:
            table.add_row(
                escape(timestamp(r.ts)), trace_label(r), escape(r.group or "-"), str(r.cost_ms),
                "yes" if r.success else "no", escape(trace_details(r)),
            )  # fmt: skip
        out().print(table)

    run(go())

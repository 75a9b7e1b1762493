"""Dead-letter queues: ``orbitmq dlq list --group G`` and
``orbitmq dlq resend --group G (--msg-id ID | --all)``.

A group's DLQ (``%DLQ%<group>``) holds the messages it failed ``retry_max_times`` times over.
Consumers cannot pull it (it is write-only), so ``list`` reads it with the admin request
GET_DLQ_MESSAGES on every master. ``resend`` sends each chosen message to its original topic
through a producer (same body, tags, keys, user properties and id); the DLQ keeps its copy
(retention removes it), so resending twice sends twice. docs/retry-dlq.md.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich import box
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column, Table

from orbitmq.cli.common import (
    DEFAULT_NAMESRV,
    NamesrvOpt,
    StatusLines,
    admin_config,
    body_preview,
    err,
    fail,
    out,
    producer_config,
    run,
    timestamp,
)
from orbitmq.client import AsyncAdminClient, AsyncProducer
from orbitmq.client.dlq import DlqMessage
from orbitmq.common.errors import MQError

dlq_app = typer.Typer(
    no_args_is_help=True,
    help="Dead-letter queues: the messages a consumer group gave up on; see and resend them.",
)

GroupOpt = Annotated[str, typer.Option("--group", "-g", help="Consumer group.", show_default=False)]
MaxOpt = Annotated[
    int, typer.Option("--max", min=1, max=100_000, help="Read at most this many messages.")
]


async def _read(namesrv: str, group: str, limit: int) -> list[DlqMessage]:
    async with AsyncAdminClient(namesrv, admin_config()) as admin:
        return await admin.dlq_messages(group, max_messages=limit)


@dlq_app.command("list")
def dlq_list(
    group: GroupOpt,
    limit: MaxOpt = 1000,
    preview: Annotated[int, typer.Option("--preview", min=0, help="Body characters shown.")] = 40,
    namesrv: NamesrvOpt = DEFAULT_NAMESRV,
) -> None:
    """List the group's dead-lettered messages: where each was first sent, its id, how often it
    was reconsumed, why it is there, when it was dead-lettered.

    Example: orbitmq dlq list --group OrderProcessors
    """
    msgs = run(_read(namesrv, group, limit))
    console = out()
    if not msgs:
        console.print(f"no dead-lettered message for group {escape(group)}")
        return
    table = Table(
        Column("broker", no_wrap=True),
        Column("offset", justify="right"),
        Column("msg id", no_wrap=True),
        Column("original topic", no_wrap=True),
        Column("reconsumes", justify="right"),
        "reason",
        Column("dead-lettered at", no_wrap=True),
        "body",
        box=box.SIMPLE_HEAD,
    )
    for m in msgs:
        table.add_row(
            escape(m.broker_name),
            str(m.queue_offset),
            escape(m.origin_msg_id or "-"),
            escape(m.origin_topic or "-"),
            str(m.reconsume_times),
            escape(m.reason or "-"),
            timestamp(m.message.store_timestamp_ms, zone=False),
            escape(body_preview(m.message.body, preview)),
        )
    console.print(table)
    console.print(f"{len(msgs)} message{'s' if len(msgs) != 1 else ''}")


def _choose(msgs: list[DlqMessage], msg_id: str | None) -> list[DlqMessage]:
    """The copies to resend: each message id once (a message can be dead-lettered twice when
    a send-back answer was lost), oldest copy first; only ``msg_id``'s when given."""
    seen: set[str] = set()
    chosen: list[DlqMessage] = []
    for m in msgs:
        key = m.origin_msg_id or f"{m.broker_name}/{m.queue_offset}"
        if msg_id is not None and msg_id not in (m.origin_msg_id, m.message.msg_id):
            continue
        if key in seen:
            continue
        seen.add(key)
        chosen.append(m)
    return chosen


@dlq_app.command("resend")
def dlq_resend(
    group: GroupOpt,
    msg_id: Annotated[
        str | None, typer.Option("--msg-id", help="Resend the message with this id.")
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="Resend every message of the DLQ.")] = False,
    limit: MaxOpt = 1000,
    namesrv: NamesrvOpt = DEFAULT_NAMESRV,
) -> None:
    """Send dead-lettered messages back to their original topics (one of --msg-id, --all).

    Example: orbitmq dlq resend --group OrderProcessors --msg-id 7F0000010001...
    """
    if (msg_id is None) == (not all_):
        raise typer.BadParameter("give exactly one of --msg-id ID and --all")

    async def go() -> tuple[list[str], list[str]]:
        msgs = await _read(namesrv, group, limit)
        chosen = _choose(msgs, msg_id)
        if not chosen:
            what = f"message {msg_id}" if msg_id is not None else "message"
            fail(f"no dead-lettered {what} for group {group}")
        done: list[str] = []
        failed: list[str] = []
        console = err()  # more than one message: a bar on a terminal, else status lines
        many = len(chosen) >= 2
        bar = Progress(
            TextColumn("resending"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console, transient=True, disable=not console.is_terminal or not many,
        )  # fmt: skip
        lines = StatusLines(console, "resending", len(chosen)) if many and bar.disable else None
        async with AsyncProducer(namesrv, producer_config()) as producer:
            with bar:
                task = bar.add_task("resend", total=len(chosen))
                for i, m in enumerate(chosen):
                    bar.advance(task)
                    if lines is not None:
                        lines.advance(i)
                    try:
                        result = await producer.send(m.resend_message())
                    except MQError as exc:
                        failed.append(f"{m.origin_msg_id or '-'}: {exc}")
                        continue
                    done.append(
                        f"resent {m.origin_msg_id or '-'} to {m.origin_topic} "
                        f"({result.message_queue.broker_name}/{result.message_queue.queue_id} "
                        f"offset {result.queue_offset})"
                    )
        return done, failed

    done, failed = run(go())
    console = out()
    for line in done:
        console.print(escape(line), soft_wrap=True)
    console.print(f"{len(done)} resent, {len(failed)} failed")
    if failed:
        fail("; ".join(failed))

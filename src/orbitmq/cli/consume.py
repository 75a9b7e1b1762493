"""``orbitmq consume``: join a consumer group with a PushConsumer and print what it gets.

Unlike ``orbitmq tail`` (a reader that commits nothing) this is a real member of a group: the
brokers balance the topic's queues over it and the group's other members, its messages are
acked (the listener returns SUCCESS) and its offsets committed, on the auto-commit interval
and when it stops. Lines look like tail's (:func:`orbitmq.cli.common.message_line`).

The listener is an ``async def`` on the consumer's loop, one call at a time (one message per
call), so each queue's lines come in order and ``--count`` is exact: once N messages
are printed the next call is never answered; at shutdown the consumer waits
``HOLD_RELEASE_S`` for it, then commits what was printed and cancels it. Its messages are
neither acked nor sent back: they stay for the group's next member (RocketMQ's rule for a call
still running when its queue is dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from orbitmq.cli.common import (
    DEFAULT_NAMESRV,
    NamesrvOpt,
    TopicOpt,
    admin_config,
    credentials,
    err,
    expected_errors,
    fail,
    message_line,
    out,
    quiet_library_logs,
    split_list,
)
from orbitmq.client import AsyncAdminClient
from orbitmq.client.consumer.config import PushConfig
from orbitmq.client.consumer_types import ConsumedMessage, ConsumeFromWhere, ConsumeResult
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import FilterExpressionError, RemoteError

if TYPE_CHECKING:
    from orbitmq.client.consumer.push import PushConsumer

HOLD_RELEASE_S = 0.5
"""removal_timeout_s of the consumer: how long shutdown waits for the call held past --count."""


@dataclass(slots=True)
class _Counter:
    limit: int | None
    printed: int = 0
    last_at: float = 0.0

    @property
    def full(self) -> bool:
        return self.limit is not None and self.printed >= self.limit


class _Printer:
    """The listener: prints a line per message and answers SUCCESS, up to ``limit`` messages.

    A call that would go past the limit (a batch is all or nothing) never answers: shutdown
    cancels it after HOLD_RELEASE_S, which leaves its messages unacked and uncommitted.
    """

    def __init__(self, limit: int | None, preview: int) -> None:
        self.counter = _Counter(limit, last_at=time.monotonic())
        self.preview = preview
        self.console = out()
        self.lock = threading.Lock()
        self.reached = threading.Event()

    async def __call__(self, msgs: Sequence[ConsumedMessage]) -> ConsumeResult:
        with self.lock:
            fits = self.counter.limit is None or (
                self.counter.printed + len(msgs) <= self.counter.limit
            )
            if fits:
                for m in msgs:
                    self.console.print(
                        escape(message_line(m.queue, m.message, self.preview)), soft_wrap=True
                    )
                self.counter.printed += len(msgs)
                self.counter.last_at = time.monotonic()
        if fits:
            if self.counter.full:
                self.reached.set()
            return ConsumeResult.SUCCESS
        self.reached.set()
        await asyncio.Event().wait()  # until shutdown cancels it
        raise AssertionError("unreachable")


def consume(
    topic: TopicOpt,
    group: Annotated[
        str, typer.Option("--group", "-g", help="Consumer group to join.", show_default=False)
    ],
    from_beginning: Annotated[
        bool,
        typer.Option(
            "--from-beginning",
            help="A new group starts at each queue's oldest message (FIRST_OFFSET); a group "
            "with committed offsets always continues from them.",
        ),
    ] = False,
    count: Annotated[
        int | None, typer.Option("--count", min=1, help="Stop after this many messages.")
    ] = None,
    tag: Annotated[
        str | None,
        typer.Option("--tag", help="Tag expression: 'TagA || TagB' (or ';'/','); '*' is all."),
    ] = None,
    sql: Annotated[
        str | None,
        typer.Option("--sql", help="SQL92 filter on properties, evaluated by the broker."),
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option("--timeout", min=0.1, help="Stop when no message came for this many seconds."),
    ] = None,
    preview: Annotated[
        int, typer.Option("--preview", help="Body characters (or bytes as hex) to show; 0: all.")
    ] = 80,
    namesrv: NamesrvOpt = DEFAULT_NAMESRV,
) -> None:
    """Consume a topic as a member of a consumer group, printing one line per message (as
    tail does) and acking it; offsets are committed when it stops.

    Stops after --count messages, after --timeout seconds without a message, or on Ctrl-C.
    Example: orbitmq consume -t Orders -g OrderAudit --from-beginning --count 10
    """
    if tag is not None and sql is not None:
        raise typer.BadParameter("give --tag or --sql, not both", param_hint="--tag/--sql")
    if sql is not None:
        expression_type, expression = "SQL92", sql
    else:
        expression_type, expression = "TAG", _tag_expression(tag)
    printer = _Printer(count, preview)
    interrupted = False
    idle = False
    with expected_errors(), quiet_library_logs():
        try:
            consumer = _start(
                namesrv, group, topic, expression_type, expression, from_beginning, printer
            )
        except FilterExpressionError as exc:
            if isinstance(exc, RemoteError):
                raise  # the broker's answer names its code already
            # Refused by the client before any broker saw it: same code, same shape.
            fail(f"{ResponseCode.SUBSCRIPTION_PARSE_FAILED.name}: topic {topic}: {exc}")
        try:
            idle = _wait(printer, timeout)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            with contextlib.suppress(KeyboardInterrupt):
                consumer.shutdown()
    n = printer.counter.printed
    if count is None or n < count or interrupted:
        note = f"no message for {timeout:g} s; " if idle and timeout is not None else ""
        err().print(f"[dim]{note}{n} message{'s' if n != 1 else ''}[/]")


def _tag_expression(tag: str | None) -> str:
    """``a;b``, ``a,b`` and ``a || b`` all mean "tag a or tag b"; none or ``*``: every tag."""
    if tag is None or tag.strip() in ("", "*"):
        return "*"
    return " || ".join(split_list(tag.replace("||", ";")))


def _start(
    namesrv: str,
    group: str,
    topic: str,
    expression_type: str,
    expression: str,
    from_beginning: bool,
    printer: _Printer,
) -> PushConsumer:
    from orbitmq.client.consumer.push import PushConsumer
    from orbitmq.net.loop import run as run_loop

    run_loop(_check_topic(namesrv, topic))
    consumer = PushConsumer(
        namesrv,
        group,
        PushConfig(
            consume_from_where=ConsumeFromWhere.FIRST_OFFSET
            if from_beginning
            else ConsumeFromWhere.LAST_OFFSET,
            consume_threads=1,
            consume_batch_size=1,
            removal_timeout_s=HOLD_RELEASE_S,
            **credentials(),
        ),
    )

    async def listener(msgs: list[ConsumedMessage]) -> ConsumeResult:
        return await printer(msgs)

    try:
        consumer.subscribe(topic, expression, expression_type)
        consumer.register_listener(listener)
        consumer.start()
    except BaseException:
        with contextlib.suppress(Exception):
            consumer.shutdown()
        raise
    return consumer


async def _check_topic(namesrv: str, topic: str) -> None:
    """A topic no NameServer routes is an error here (a consumer would wait for it quietly)."""
    async with AsyncAdminClient(namesrv, admin_config()) as admin:
        await admin.queues(topic)


def _wait(printer: _Printer, timeout: float | None) -> bool:
    """Block until --count is reached (False) or nothing came for ``timeout`` s (True)."""
    while True:
        if printer.reached.wait(0.1 if timeout is None else min(0.1, timeout)):
            return False
        if timeout is not None:
            with printer.lock:
                quiet_for = time.monotonic() - printer.counter.last_at
            if quiet_for >= timeout:
                return True

"""``orbitmq tail``: follow a topic by offset, one line per message.

Reads every readable queue of the topic with :meth:`AsyncAdminClient.pull` (long polling), one pull
in flight per queue so a busy queue cannot starve a quiet one; queues take turns on the output
a pull (up to ``--batch`` messages) at a time. Starts at each queue's max offset (only what
comes next) or, with ``--from-beginning``, at its min offset. Queues added to the topic while it
runs are picked up (from their start). Nothing is committed anywhere: tail is a reader, not a
consumer group.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from orbitmq.cli.common import (
    DEFAULT_NAMESRV,
    NamesrvOpt,
    TopicOpt,
    admin_config,
    err,
    message_line,
    out,
    run,
    split_list,
)
from orbitmq.client import AsyncAdminClient, MessageQueue, PullStatus
from orbitmq.common.errors import MQError

LONG_POLL_MS = 5_000
ROUTE_REFRESH_S = 10.0
RETRY_S = 1.0


@dataclass(slots=True)
class _State:
    printed: int = 0
    limit: int | None = None
    failing: set[str] = field(default_factory=set)
    """Brokers whose pulls fail: reported once until one succeeds again."""

    @property
    def full(self) -> bool:
        return self.limit is not None and self.printed >= self.limit


def tail(
    topic: TopicOpt,
    from_beginning: Annotated[
        bool, typer.Option("--from-beginning", help="Start at the oldest message kept.")
    ] = False,
    count: Annotated[
        int | None, typer.Option("--count", min=1, help="Stop after this many messages.")
    ] = None,
    tag: Annotated[
        str | None, typer.Option("--tag", help="Only these tags, ';' or ',' separated.")
    ] = None,
    preview: Annotated[
        int, typer.Option("--preview", help="Body characters (or bytes as hex) to show; 0: all.")
    ] = 80,
    batch: Annotated[int, typer.Option("--batch", min=1, help="Messages per pull.")] = 32,
    namesrv: NamesrvOpt = DEFAULT_NAMESRV,
) -> None:
    """Print a topic's messages as they arrive: queue, offset, msg id, tags, keys, body.

    Stops after --count messages or on Ctrl-C. Example: orbitmq tail -t Orders --from-beginning
    """
    tags = split_list(tag.replace("||", ";")) if tag else None
    state = _State(limit=count)
    with contextlib.suppress(KeyboardInterrupt):
        run(_tail(namesrv, topic, from_beginning, tags, preview, batch, state))
    if count is None or state.printed < count:
        err().print(f"[dim]{state.printed} message{'s' if state.printed != 1 else ''}[/]")


async def _tail(
    namesrv: str,
    topic: str,
    from_beginning: bool,
    tags: list[str] | None,
    preview: int,
    batch: int,
    state: _State,
) -> None:
    console = out()
    warn = err()
    turn = asyncio.Lock()  # one queue prints at a time: lines of a pull stay together
    done = asyncio.Event()
    async with AsyncAdminClient(namesrv, admin_config()) as admin:
        queues = await admin.queues(topic)
        starts = await asyncio.gather(
            *(admin.min_offset(mq) if from_beginning else admin.max_offset(mq) for mq in queues)
        )
        tasks: dict[MessageQueue, asyncio.Task[None]] = {}

        def follow(mq: MessageQueue, offset: int) -> None:
            tasks[mq] = asyncio.create_task(
                _follow(admin, mq, offset, tags, batch, preview, console, warn, turn, state, done)
            )

        for mq, start in zip(queues, starts, strict=True):
            follow(mq, start)
        if not queues:
            warn.print(f"[yellow]topic {escape(topic)} has no readable queue yet[/]")
        try:
            while not done.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), ROUTE_REFRESH_S)
                if done.is_set():
                    break
                try:
                    current = await admin.queues(topic)
                except MQError:
                    continue  # the followers report trouble; keep what we have
                for mq in current:
                    if mq not in tasks:
                        follow(mq, 0)  # new since we started: all of it is new
        finally:
            for task in tasks.values():
                task.cancel()
            await asyncio.gather(*tasks.values(), return_exceptions=True)


async def _follow(
    admin: AsyncAdminClient,
    mq: MessageQueue,
    offset: int,
    tags: list[str] | None,
    batch: int,
    preview: int,
    console: Console,
    warn: Console,
    turn: asyncio.Lock,
    state: _State,
    done: asyncio.Event,
) -> None:
    broker = mq.broker_name
    while not done.is_set():
        try:
            result = await admin.pull(
                mq, offset, max_nums=batch, tags=tags, suspend_timeout_ms=LONG_POLL_MS
            )
        except MQError as exc:
            if broker not in state.failing:
                state.failing.add(broker)
                warn.print(
                    f"[yellow]{escape(broker)}: {escape(str(exc))}; retrying[/]", soft_wrap=True
                )
            await asyncio.sleep(RETRY_S)
            continue
        if broker in state.failing:
            state.failing.discard(broker)
            warn.print(f"[green]{escape(broker)}: reading again[/]", soft_wrap=True)
        if result.status is PullStatus.FOUND:
            async with turn:
                for msg in result.messages:
                    if state.full:
                        break
                    console.print(escape(message_line(mq, msg, preview)), soft_wrap=True)
                    state.printed += 1
                if state.full:
                    done.set()
                    return
        elif result.status is PullStatus.OFFSET_ILLEGAL and result.next_begin_offset == offset:
            # Ahead of the queue (it was deleted and re-created?): restart where it ends.
            offset = max(result.min_offset, min(offset, result.max_offset))
            await asyncio.sleep(RETRY_S)
            continue
        offset = result.next_begin_offset

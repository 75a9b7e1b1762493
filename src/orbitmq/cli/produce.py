"""``orbitmq send``: send one message, or ``--count`` of them with a progress bar."""

from __future__ import annotations

import asyncio
import functools
import sys
import time
from collections.abc import Callable
from typing import Annotated

import typer
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)

from orbitmq.cli.common import (
    DEFAULT_NAMESRV,
    NamesrvOpt,
    TopicOpt,
    err,
    human_bytes,
    out,
    producer_config,
    run,
    split_list,
)
from orbitmq.client import AsyncProducer, Message, SendResult
from orbitmq.common.errors import ClientError, MQError

WINDOW = 8192
"""--async: messages handed to the producer and not answered yet, at most."""


def _properties(values: list[str] | None) -> dict[str, str]:
    props: dict[str, str] = {}
    for item in values or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--property")
        props[name] = value
    return props


def _body(text: str) -> bytes:
    if text == "-":
        return sys.stdin.buffer.read()
    return text.encode()


def _numbered_body(i: int, size: int) -> bytes:
    """Printable, unique per message, exactly ``size`` bytes (cut if size is small)."""
    head = f"message {i} "
    return (head + "x" * max(0, size - len(head))).encode()[:size]


def send(
    topic: TopicOpt,
    body: Annotated[
        str | None, typer.Option("--body", help="Message body text ('-' reads stdin).")
    ] = None,
    tag: Annotated[str | None, typer.Option("--tag", help="The message tag.")] = None,
    key: Annotated[
        str | None, typer.Option("--key", "-k", help="Message keys, ';' or ',' separated.")
    ] = None,
    prop: Annotated[
        list[str] | None, typer.Option("--property", "-p", help="User property NAME=VALUE.")
    ] = None,
    count: Annotated[
        int | None, typer.Option("--count", min=1, help="Send this many messages.")
    ] = None,
    size: Annotated[
        int, typer.Option("--size", min=1, help="Body size with --count and no --body.")
    ] = 128,
    sync: Annotated[
        bool,
        typer.Option(
            "--sync/--async",
            help="Wait for each answer, or let the producer batch (many in flight).",
        ),
    ] = True,
    namesrv: NamesrvOpt = DEFAULT_NAMESRV,
) -> None:
    """Send messages and print their ids (one message) or a summary (--count).

    Examples: orbitmq send -t Orders --tag paid --key order-42 --body '{"id": 42}';
    orbitmq send -t Orders --count 10000 --size 1024 --async
    """
    props = _properties(prop)
    keys = split_list(key)
    if body is None and count is None:
        raise typer.BadParameter("give --body TEXT (or '-' for stdin) or --count N")
    fixed = _body(body) if body is not None else None

    def message(i: int) -> Message:
        data = fixed if fixed is not None else _numbered_body(i, size)
        return Message(topic, data, tags=tag, keys=keys, properties=dict(props))

    if count is None:
        run(_send_one(namesrv, message(0), sync))
        return
    run(_send_many(namesrv, count, message, sync))


async def _send_one(namesrv: str, msg: Message, sync: bool) -> None:
    async with AsyncProducer(namesrv, producer_config()) as producer:
        result = await (producer.send(msg) if sync else producer.send_async(msg))
    _print_result(result)


def _print_result(result: SendResult) -> None:
    mq = result.message_queue
    out().print(
        f"{result.msg_id}  {result.status.value}  queue {escape(mq.broker_name)}/{mq.queue_id}"
        f"  offset {result.queue_offset}",
        soft_wrap=True,
    )


async def _send_many(
    namesrv: str, count: int, message: Callable[[int], Message], sync: bool
) -> None:
    sent = 0
    nbytes = 0
    errors = 0
    first_error: BaseException | None = None
    last: SendResult | None = None
    bar_console = err()
    progress = Progress(
        TextColumn("sending"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        console=bar_console,
        transient=True,
        disable=not bar_console.is_terminal,
    )
    task = progress.add_task("send", total=count)
    started = time.perf_counter()
    async with AsyncProducer(namesrv, producer_config()) as producer:
        with progress:
            if sync:
                for i in range(count):
                    msg = message(i)
                    try:
                        last = await producer.send(msg)
                        sent += 1
                        nbytes += len(msg.body)
                    except MQError as exc:
                        if sent == 0:
                            raise  # nothing got through: no point trying the rest
                        errors += 1
                        first_error = first_error or exc
                    progress.advance(task)
            else:
                window = asyncio.Semaphore(WINDOW)
                failing = asyncio.Event()  # the first answer was an error: stop sending

                def done(fut: asyncio.Future[SendResult], size: int) -> None:
                    nonlocal sent, nbytes, errors, first_error, last
                    window.release()
                    progress.advance(task)
                    if fut.cancelled():
                        errors += 1
                        return
                    exc = fut.exception()
                    if exc is not None:
                        errors += 1
                        first_error = first_error or exc
                        if sent == 0:
                            failing.set()
                    else:
                        sent += 1
                        nbytes += size
                        last = fut.result()

                for i in range(count):
                    await window.acquire()
                    if failing.is_set():
                        break
                    msg = message(i)
                    fut = producer.send_async(msg)
                    fut.add_done_callback(functools.partial(done, size=len(msg.body)))
                    if i % 64 == 63:
                        await asyncio.sleep(0)  # let full batches go out
                await producer.flush()
    seconds = max(time.perf_counter() - started, 1e-9)
    if sent == 0 and isinstance(first_error, MQError):
        raise first_error  # nothing got through: the reason is all there is to say
    console = out()
    console.print(
        f"sent {sent} message{'s' if sent != 1 else ''} ({human_bytes(nbytes)} of bodies) in "
        f"{seconds:.2f} s: {sent / seconds:,.0f} msgs/s, "
        f"{nbytes / seconds / 1024 / 1024:.2f} MiB/s ({'sync' if sync else 'async'})",
        soft_wrap=True,
    )
    if last is not None:
        console.print(f"last message id {last.msg_id}", soft_wrap=True)
    if errors:
        raise ClientError(f"{count - sent} of {count} sends failed; first: {first_error}")

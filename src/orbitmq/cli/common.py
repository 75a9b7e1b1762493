"""What the client-side commands share: the NameServer option, error reporting, formatting.

Every client command takes ``--namesrv/-n`` (env ``ORBITMQ_NAMESRV``, default
``127.0.0.1:9876``; several NameServers separated by ';' or ','). Expected failures (an
:class:`~orbitmq.common.errors.MQError`: no route, connection refused, a broker's error answer)
print one red line on stderr and exit with status 1, never a traceback.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import re
import time
from collections.abc import Coroutine, Iterator
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from orbitmq.client.route import MessageQueue
from orbitmq.common.errors import MQError
from orbitmq.common.record import StoredMessage
from orbitmq.protocol.bodies import PERM_INHERIT, PERM_READ, PERM_READ_WRITE, PERM_WRITE

T = TypeVar("T")

DEFAULT_NAMESRV = "127.0.0.1:9876"

NamesrvOpt = Annotated[
    str,
    typer.Option(
        "--namesrv",
        "-n",
        envvar="ORBITMQ_NAMESRV",
        help="NameServer addresses, host:port separated by ';' or ','.",
        show_envvar=True,
    ),
]
TopicOpt = Annotated[str, typer.Option("--topic", "-t", help="Topic name.")]

ACCESS_KEY_ENV = "ORBITMQ_ACCESS_KEY"
SECRET_KEY_ENV = "ORBITMQ_SECRET_KEY"
_credentials: dict[str, str] = {}


def set_credentials(access_key: str | None, secret_key: str | None) -> None:
    """The root options ``--access-key``/``--secret-key`` (or their environment variables)."""
    _credentials.clear()
    if access_key:
        if not secret_key:
            fail(f"--access-key needs --secret-key (or {SECRET_KEY_ENV})")
        _credentials.update(access_key=access_key, secret_key=secret_key)


def credentials() -> dict[str, Any]:
    """Keyword arguments every client config of a command takes: who signs its requests."""
    return dict(_credentials)


def admin_config() -> Any:
    from orbitmq.client import AdminConfig

    return AdminConfig(**credentials())


def producer_config() -> Any:
    from orbitmq.client import ProducerConfig

    return ProducerConfig(**credentials())


def out() -> Console:
    """Console on stdout. Made per command so it sees the current stdout and COLUMNS."""
    return Console(highlight=False)


def err() -> Console:
    return Console(stderr=True, highlight=False)


def fail(message: str, code: int = 1) -> NoReturn:
    """One red line on stderr, then exit with ``code``."""
    err().print(f"[red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)


def _one_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())


def _hint(exc: MQError) -> str:
    if type(exc).__name__ == "NameServerUnavailableError":
        return " (is a NameServer running there? set --namesrv or ORBITMQ_NAMESRV)"
    return ""


@contextlib.contextmanager
def expected_errors() -> Iterator[None]:
    """Turn an MQError into a one-line message and exit status 1."""
    try:
        yield
    except MQError as exc:
        fail(_one_line(exc) + _hint(exc))


@contextlib.contextmanager
def quiet_library_logs(level: int = logging.ERROR) -> Iterator[None]:
    """Keep the client library's warnings (route fallbacks, retries) off the terminal while a
    command runs: the command reports what matters itself. Restored afterwards."""
    logger = logging.getLogger("orbitmq")
    before = logger.level
    if logger.getEffectiveLevel() < level:
        logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine on a fresh event loop; MQError -> one red line, exit 1."""
    from orbitmq.net.loop import run as run_loop

    with expected_errors(), quiet_library_logs():
        return run_loop(coro)


def split_list(value: str | None) -> list[str]:
    """``"a;b, c"`` -> ``["a", "b", "c"]`` (';' or ',' separated, blanks dropped)."""
    if not value:
        return []
    return [p.strip() for p in re.split(r"[;,]", value) if p.strip()]


_PERM_NAMES = {"RW": PERM_READ_WRITE, "WR": PERM_READ_WRITE, "R": PERM_READ, "W": PERM_WRITE}


def parse_perm(value: str) -> int:
    """``RW``, ``R``, ``W`` (any case) or RocketMQ's number (6, 4, 2; +1 for inherit)."""
    text = value.strip().upper()
    if text in _PERM_NAMES:
        return _PERM_NAMES[text]
    if text.isdigit() and 0 <= int(text) <= 7:
        return int(text)
    raise typer.BadParameter(f"{value!r}: use RW, R, W or a number 0-7", param_hint="--perm")


def perm_text(perm: int) -> str:
    text = ("R" if perm & PERM_READ else "-") + ("W" if perm & PERM_WRITE else "-")
    return text + ("+inherit" if perm & PERM_INHERIT else "")


def timestamp(ms: int, *, zone: bool = True) -> str:
    """Milliseconds since the epoch as local time (with its UTC offset if ``zone``), ``-`` for
    0 (never)."""
    if ms <= 0:
        return "-"
    dt = datetime.datetime.fromtimestamp(ms / 1000).astimezone()
    text = dt.isoformat(sep=" ", timespec="milliseconds")
    return text if zone else text[:23]


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def body_preview(body: bytes, limit: int = 80) -> str:
    """Text if the body is printable UTF-8 (newlines and tabs escaped), else ``hex:...``.

    At most ``limit`` characters of text or bytes of hex (0: all of it); ``…`` marks a cut.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and all(c.isprintable() or c in "\t\n\r" for c in text):
        cut = limit > 0 and len(text) > limit
        shown = text[:limit] if cut else text
        shown = shown.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
        return shown.replace("\t", "\\t") + ("…" if cut else "")
    cut = limit > 0 and len(body) > limit
    return "hex:" + (body[:limit] if cut else body).hex() + ("…" if cut else "")


def message_line(mq: MessageQueue, msg: StoredMessage, preview: int) -> str:
    """One message as ``orbitmq tail`` and ``orbitmq consume`` print it: ``broker/queue``,
    queue offset, message id, tags, keys and a body preview (:func:`body_preview`), separated
    by two spaces. Plain text: callers escape it for rich."""
    return (
        f"{mq.broker_name}/{mq.queue_id}  {msg.queue_offset}  {msg.msg_id or '-'}"
        f"  tags={msg.tags or '-'}  keys={','.join(msg.keys) or '-'}"
        f"  {body_preview(msg.body, preview)}"
    )


class StatusLines:
    """Progress of a long loop where no bar can be drawn (stderr is a log, a pipe, CI): a line
    ``<what> <done>/<total> (<elapsed> s)`` when it starts and then at most every ``every_s``,
    so a slow run shows where it is. On a terminal the caller draws a rich bar instead."""

    def __init__(self, console: Console, what: str, total: int, every_s: float = 2.0) -> None:
        self.console, self.what, self.total, self.every_s = console, what, total, every_s
        self.started = self._last = time.monotonic()
        self._say(0)

    def _say(self, done: int) -> None:
        elapsed = time.monotonic() - self.started
        self.console.print(f"{self.what} {done}/{self.total} ({elapsed:.1f} s)", highlight=False)

    def advance(self, done: int) -> None:
        if time.monotonic() - self._last >= self.every_s:
            self._last = time.monotonic()
            self._say(done)

"""How every server command runs: one logging setup, one ready line, one run-until-signal loop.

``orbitmq up|namesrv|broker|proxy|controller`` (the same as ``python -m orbitmq ...``) are the only ways
to run a server; each goes through here, so they log, announce and stop alike:

- :func:`load_or_exit`: the settings (defaults < ``--config`` TOML < ``ORBITMQ_*`` env <
  flags, see :mod:`orbitmq.cli.settings`); a bad one exits with status 2 before anything starts.
- :func:`configure_logging`: the log goes to stderr, one line per record, so stdout holds only
  what scripts read.
- The ready line, ``orbitmq <role> ready key=value ...``, one line on stdout, flushed once
  every listener of the process is bound. The first key names the role's own address
  (``broker=127.0.0.1:10911``, ``up`` starts with ``namesrv=``): with port 0 it is how a
  script or a test learns the port without polling. :func:`parse_ready_line` reads it back.
- :func:`until_signal`: serve until SIGINT or SIGTERM, then return so the caller closes the
  servers cleanly (exit status 0).
- :func:`run_server`: the event loop (uvloop when installed); a failure to start (an
  :class:`~orbitmq.common.errors.MQError`, a port already taken) prints one red line and exits
  with status 1, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from orbitmq.cli.settings import Settings, load_settings
from orbitmq.common.errors import MQError

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help="TOML file with \\[namesrv], \\[broker], \\[store], \\[proxy], \\[controller] tables.",
        envvar="ORBITMQ_CONFIG",
    ),
]
LogLevel = Annotated[str, typer.Option("--log-level", help="DEBUG, INFO, WARNING, ERROR.")]

Announce = Callable[[dict[str, str]], None]
"""Called once with the process's endpoints when every server in it listens."""


def load_or_exit(
    config: Path | None, flags: Mapping[str, Mapping[str, Any]], *, controller: bool = False
) -> Settings:
    """:func:`~orbitmq.cli.settings.load_settings`; a bad setting -> one red line, exit 2.
    ``controller``: a controller node runs, so its peer list must also name it."""
    try:
        settings = load_settings(config, flags)
        if controller:
            settings.controller.check()
        return settings
    except MQError as exc:
        Console(stderr=True).print(
            f"[red]configuration error:[/] {escape(str(exc))}", soft_wrap=True
        )
        raise typer.Exit(2) from exc


def configure_logging(level: str) -> None:
    """The servers' log: ``level`` (DEBUG, INFO, WARNING, ERROR) and up, on stderr."""
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, stream=sys.stderr)


def ready_line(role: str, endpoints: Mapping[str, str]) -> str:
    """``orbitmq <role> ready key=value ...`` (see the module docstring)."""
    return f"orbitmq {role} ready " + " ".join(f"{k}={v}" for k, v in endpoints.items())


def parse_ready_line(line: str, role: str) -> dict[str, str] | None:
    """The endpoints of a ready line of ``role``, or None if ``line`` is not one."""
    prefix = f"orbitmq {role} ready "
    if not line.startswith(prefix):
        return None
    pairs = (item.partition("=") for item in line[len(prefix) :].split())
    return {k: v for k, sep, v in pairs if sep}


def announcer(title: str, role: str) -> Announce:
    """On a terminal a table of the endpoints for people; then, always, the ready line. A
    script reading stdout gets the ready line as its first line."""

    def show(endpoints: dict[str, str]) -> None:
        if sys.stdout.isatty():
            console = Console()
            table = Table(title=title, show_header=False, box=None)
            for k, v in endpoints.items():
                table.add_row(f"[bold]{k}[/]", escape(v))
            console.print(table)
            console.print("Ctrl-C stops it cleanly.")
        print(ready_line(role, endpoints), flush=True)

    return show


async def until_signal(on_ready: Callable[[], None]) -> None:
    """Call ``on_ready``, then wait for SIGINT or SIGTERM (SIGHUP reloads certificates)."""
    from orbitmq.broker.heap import settle_heap
    from orbitmq.net.tls import reload_all

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    with contextlib.suppress(NotImplementedError):  # SIGHUP: reload TLS certificates now
        loop.add_signal_handler(signal.SIGHUP, reload_all)
    settle_heap()
    on_ready()
    await stop.wait()


def run_server(coro: Coroutine[Any, Any, None]) -> None:
    """Run a server coroutine to its end; a failure to start -> one red line, exit status 1."""
    from orbitmq.net.loop import run

    try:
        run(coro)
    except KeyboardInterrupt:
        pass
    except (MQError, OSError) as exc:  # OSError: the port is taken, the host is not ours
        Console(stderr=True).print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(1) from exc

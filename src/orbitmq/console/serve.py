"""Serving the console on the caller's event loop (`orbitmq console`, and `orbitmq up`).

uvicorn runs as a task of the running loop; its own signal handling is switched off because
the process that embeds it (the CLI runner) owns SIGINT/SIGTERM and stops it in order.
HTTPS: uvicorn is given one SSL context at start (``loop.create_server(ssl=...)``), so, as on
the broker's HA port, that context's SNI callback (OpenSSL calls it on every ClientHello) puts
the current context of ``ConsoleConfig.tls_source`` on each new handshake: a replaced
certificate, key or CA file is served within 0.5 s (or at once on SIGHUP), established
connections keep theirs, and no restart is needed. The URL yielded says ``https`` then.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Generator

import uvicorn

from orbitmq.console.app import create_app
from orbitmq.console.config import ConsoleConfig


class _EmbeddedServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # the host process handles signals


@contextlib.asynccontextmanager
async def serve_console(config: ConsoleConfig) -> AsyncIterator[str]:
    """Serve for the body of the ``with``; yields the console's URL."""
    sock = socket.socket(socket.AF_INET6 if ":" in config.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((config.host, config.port))
    port = sock.getsockname()[1]
    source = config.tls_source()
    uv_config = uvicorn.Config(create_app(config), log_level="warning", lifespan="on")
    uv_config.load()
    uv_config.ssl = None if source is None else source.handshake_context()
    server = _EmbeddedServer(uv_config)
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]), name="console")
    try:
        for _ in range(400):  # bounded: 20 s
            if server.started or task.done():
                break
            await asyncio.sleep(0.05)
        if task.done():
            task.result()  # raises why it could not start
        scheme = "https" if source is not None else "http"
        host = f"[{config.host}]" if ":" in config.host else config.host
        yield f"{scheme}://{host}:{port}"
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(task, 10)
        sock.close()

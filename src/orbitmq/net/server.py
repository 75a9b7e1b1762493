"""A framed request/response server on asyncio (uvloop when installed)."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable

from orbitmq.net.connection import Connection, Handler
from orbitmq.protocol.frame import DEFAULT_MAX_FRAME_SIZE

log = logging.getLogger(__name__)


class RemotingServer:
    """Accepts connections and hands each request to ``handler``.

    ``port=0`` picks a free port; read it back from ``port`` after ``start()``.
    """

    def __init__(
        self,
        handler: Handler,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_in_flight: int = 256,
        ssl_context: ssl.SSLContext | None = None,
        name: str = "server",
        on_disconnect: Callable[[Connection], None] | None = None,
    ) -> None:
        self.handler = handler
        self.host = host
        self.port = port
        self.max_frame_size = max_frame_size
        self.max_in_flight = max_in_flight
        self.ssl_context = ssl_context
        self.name = name
        self.on_disconnect = on_disconnect
        self.connections: set[Connection] = set()
        self._server: asyncio.Server | None = None

    def _make(self) -> Connection:
        conn = Connection(
            self.handler,
            max_frame_size=self.max_frame_size,
            max_in_flight=self.max_in_flight,
            on_close=self._closed,
            name=self.name,
        )
        return conn

    def _closed(self, conn: Connection) -> None:
        self.connections.discard(conn)
        if self.on_disconnect is not None:
            try:
                self.on_disconnect(conn)
            except Exception:
                log.exception("%s: disconnect callback failed", self.name)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()

        def factory() -> Connection:
            conn = self._make()
            self.connections.add(conn)
            return conn

        self._server = await loop.create_server(
            factory, self.host, self.port, ssl=self.ssl_context, reuse_address=True, backlog=1024
        )
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        log.info("%s listening on %s:%d", self.name, self.host, self.port)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for conn in list(self.connections):
            conn.close("server stopping")
        await self._server.wait_closed()
        self._server = None

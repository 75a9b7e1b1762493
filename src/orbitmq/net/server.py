"""A framed request/response server on asyncio (uvloop when installed).

Contract: :class:`RemotingServer` listens through a :class:`~orbitmq.net.listener.Listener`
(admission caps, TLS ``off`` / ``permissive`` / ``required`` with certificate reload) and runs
one :class:`~orbitmq.net.connection.Connection` per admitted peer. A sweeper closes, once a
second, connections idle for ``idle_timeout_s`` and connections that started a frame and did
not finish it within ``frame_timeout_s`` (slowloris). Every refusal and timeout close is
counted in ``refusals`` by reason (:mod:`orbitmq.net.limits`).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable

from orbitmq.net.connection import Connection, Handler
from orbitmq.net.limits import REASON_FRAME_TIMEOUT, REASON_IDLE, Limits, Refusals
from orbitmq.net.listener import Listener
from orbitmq.net.quota import ByteQuotas
from orbitmq.net.tls import ContextSource
from orbitmq.protocol.frame import DEFAULT_MAX_FRAME_SIZE

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 1.0


class RemotingServer:
    """Accepts connections and hands each request to ``handler``.

    ``port=0`` picks a free port; read it back from ``port`` after ``start()``. ``ssl_context``
    (a fixed context) or ``tls`` (a reloading one) with ``tls_mode``; ``ssl_context`` alone
    means ``required``.
    """

    def __init__(
        self,
        handler: Handler,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_in_flight: int | None = None,
        ssl_context: ssl.SSLContext | None = None,
        tls: ContextSource | None = None,
        tls_mode: str | None = None,
        limits: Limits | None = None,
        quotas: ByteQuotas | None = None,
        name: str = "server",
        on_disconnect: Callable[[Connection], None] | None = None,
        eager_codes: frozenset[int] = frozenset(),
    ) -> None:
        self.handler = handler
        self.eager_codes = eager_codes
        """Request codes started without a task (see :class:`Connection`)."""
        self.host = host
        self.port = port
        self.max_frame_size = max_frame_size
        self.limits = limits or Limits()
        self.quotas = quotas
        self.max_in_flight = max_in_flight or self.limits.max_pending_requests
        if tls is None and ssl_context is not None:
            tls = ContextSource.fixed(ssl_context)
        self.tls = tls
        self.tls_mode = tls_mode or ("required" if tls is not None else "off")
        self.name = name
        self.on_disconnect = on_disconnect
        self.connections: set[Connection] = set()
        self.refusals = Refusals()
        self._listener: Listener | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._interval = SWEEP_INTERVAL_S

    def _open(self, ip: str) -> Connection:
        """A connection the listener admitted (``ip``), or, with TLS off, one it hands over
        unchecked ("") that admits itself when made (:meth:`_admit`)."""
        conn = Connection(
            self.handler,
            max_frame_size=self.max_frame_size,
            max_in_flight=self.max_in_flight,
            max_pending_bytes=self.limits.max_pending_bytes,
            on_close=self._closed,
            name=self.name,
            refusals=self.refusals,
            quotas=self.quotas,
            admit=None if ip else self._admit,
            eager_codes=self.eager_codes,
        )
        if ip:
            conn.attributes["ip"] = ip
            self.connections.add(conn)
        return conn

    def _admit(self, conn: Connection, ip: str) -> bool:
        if self._listener is None or not self._listener.admission.admit(ip):
            return False
        conn.attributes["ip"] = ip
        self.connections.add(conn)
        return True

    def _closed(self, conn: Connection) -> None:
        if conn not in self.connections:
            return  # refused at accept: never served
        self.connections.discard(conn)
        if self._listener is not None:
            self._listener.release(conn.attributes["ip"])
        if self.on_disconnect is not None:
            try:
                self.on_disconnect(conn)
            except Exception:
                log.exception("%s: disconnect callback failed", self.name)

    async def start(self) -> None:
        self._listener = Listener(
            self._open,
            host=self.host,
            port=self.port,
            tls_mode=self.tls_mode,
            tls=self.tls,
            limits=self.limits,
            refusals=self.refusals,
            name=self.name,
        )
        self.port = await self._listener.start()
        lim = self.limits
        # Short timeouts (tests) are swept often enough to be enforced within about 1.5x.
        self._interval = min(SWEEP_INTERVAL_S, lim.frame_timeout_s / 2, lim.idle_timeout_s / 2 or 1)
        self._sweeper = asyncio.get_running_loop().call_later(self._interval, self._sweep)
        log.info("%s listening on %s:%d (TLS %s)", self.name, self.host, self.port, self.tls_mode)

    def _sweep(self) -> None:
        """Close slow and idle connections; re-arms itself (a timer, not a task: a server
        leaves no task behind)."""
        lim = self.limits
        now = time.monotonic()
        for conn in list(self.connections):
            if conn.frame_started and now - conn.frame_started > lim.frame_timeout_s:
                self.refusals.count(REASON_FRAME_TIMEOUT, conn.peer)
                conn.abort(f"frame not completed within {lim.frame_timeout_s:.0f}s")
            elif (
                lim.idle_timeout_s
                and now - conn.last_activity > lim.idle_timeout_s
                and conn.is_idle
            ):
                self.refusals.count(REASON_IDLE, conn.peer)
                conn.close(f"idle for {lim.idle_timeout_s:.0f}s")
        if self._listener is not None:
            self._sweeper = asyncio.get_running_loop().call_later(self._interval, self._sweep)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is None:
            return
        if self._sweeper is not None:
            self._sweeper.cancel()
        for conn in list(self.connections):
            conn.close("server stopping")  # each leaves self.connections as it closes
        await listener.stop()

"""The client side of Remoting: one connection per server address, made on demand.

Requests are pipelined on the connection (many in flight, matched by opaque); a connection that
drops fails its pending requests with ConnectionClosedError and is re-made by the next request.

A request that times out while *nothing at all* came in on its connection closes that
connection (its other pending requests fail with ConnectionClosedError), so the next request
connects afresh. A network partition or a hung peer ends no TCP connection: without this, every
later request would queue behind the unacknowledged bytes and, after the network heals, wait
for TCP's next retransmission, which backs off exponentially. That kept a new master's
registrations away from the NameServer that had been cut off with the old one: it routed the
group with no master for 5.6 s after an 8 s partition healed (0.5 s with this rule), and a
client asking it read nothing. RocketMQ's clients close the channel of any timed-out request
(``clientCloseSocketIfTimeout``), Kafka's too (``request.timeout.ms``); a connection that
answered something meanwhile is alive and slow, and is kept here.

TLS: a client given ``ssl_context`` connects with it (build one with
:func:`orbitmq.net.tls.client_context`, which verifies the server by default). A client given
none uses the process default set by :func:`set_default_ssl_context` (the ``orbitmq`` command's
``--tls*`` options set it for every client connection the command makes), else plaintext.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable

from orbitmq.common.errors import ClientError, RequestTimeoutError
from orbitmq.net.connection import Connection, ConnectionClosedError, Handler
from orbitmq.protocol.frame import DEFAULT_MAX_FRAME_SIZE, Frame

log = logging.getLogger(__name__)


_default_ssl: ssl.SSLContext | None = None


def set_default_ssl_context(ctx: ssl.SSLContext | None) -> None:
    """The context of clients made from now on without one of their own (None: plaintext)."""
    global _default_ssl
    _default_ssl = ctx


def split_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ClientError(f"address {addr!r} is not host:port")
    return host.strip("[]"), int(port)


class RemotingClient:
    def __init__(
        self,
        *,
        connect_timeout: float = 3.0,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        ssl_context: ssl.SSLContext | None = None,
        handler: Handler | None = None,
        name: str = "client",
        signer: Callable[[Frame], None] | None = None,
    ) -> None:
        """``signer``: signs every request sent (orbitmq.protocol.signature.Signer; None: the
        requests go unsigned, for servers with authentication off)."""
        self.connect_timeout = connect_timeout
        self.signer = signer
        self.max_frame_size = max_frame_size
        self.ssl_context = ssl_context if ssl_context is not None else _default_ssl
        self.handler = handler
        self.name = name
        self._conns: dict[str, Connection] = {}
        self._connecting: dict[str, asyncio.Future[Connection]] = {}
        self._closed = False

    async def connection(self, addr: str) -> Connection:
        conn = self._conns.get(addr)
        if conn is not None and conn.is_open:
            return conn
        if self._closed:
            raise ClientError("client is closed")
        waiting = self._connecting.get(addr)
        if waiting is not None:
            return await asyncio.shield(waiting)
        fut: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()
        self._connecting[addr] = fut
        try:
            conn = await self._connect(addr)
            fut.set_result(conn)
            return conn
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved
            raise
        finally:
            self._connecting.pop(addr, None)

    async def _connect(self, addr: str) -> Connection:
        host, port = split_addr(addr)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _t, conn = await loop.create_connection(
                    lambda: Connection(
                        self.handler,
                        max_frame_size=self.max_frame_size,
                        name=self.name,
                        signer=self.signer,
                    ),
                    host,
                    port,
                    ssl=self.ssl_context,
                )
        except (OSError, TimeoutError) as exc:
            raise ConnectionClosedError(f"cannot connect to {addr}: {exc}") from exc
        self._conns[addr] = conn
        return conn

    async def invoke(
        self, addr: str, frame: Frame, timeout: float = 3.0, *, alive_until: float | None = None
    ) -> Frame:
        """``alive_until``: see :meth:`Connection.request` (wait on for a peer that answers)."""
        conn = await self.connection(addr)
        reads, silent = conn.reads, conn.silent_expiries
        try:
            if alive_until is not None:
                return await conn.request(frame, timeout, alive_until=alive_until)
            return await conn.request(frame, timeout)
        except RequestTimeoutError:
            # Not a byte back in ``timeout`` (from the start, or after a slow peer went quiet):
            # dead, not slow.
            if conn.reads == reads or conn.silent_expiries != silent:
                if self._conns.get(addr) is conn:
                    del self._conns[addr]
                # INFO: during an outage this repeats every try; the caller reports the outage.
                conn.abort(
                    f"nothing received for {timeout:.1f}s while a request waited",
                    level=logging.INFO,
                )
            raise

    async def invoke_oneway(self, addr: str, frame: Frame) -> None:
        """Send without waiting for an answer; waits only while the peer is not reading, so a
        burst of oneway sends cannot grow the write buffer without bound."""
        conn = await self.connection(addr)
        conn.send_oneway(frame)
        await conn.drain()

    def drop(self, addr: str) -> None:
        conn = self._conns.pop(addr, None)
        if conn is not None:
            conn.close("dropped")

    async def close(self, timeout: float = 10.0) -> None:
        """Close every connection. A transport closes only after writing what it buffered
        (oneway sends included); connections that cannot finish within ``timeout`` are cut."""
        self._closed = True
        conns = list(self._conns.values())
        self._conns.clear()
        for conn in conns:
            conn.close("client closing")
        try:
            async with asyncio.timeout(timeout):
                for conn in conns:
                    if conn.transport is not None:
                        await conn.closed.wait()
        except TimeoutError:
            for conn in conns:
                if not conn.closed.is_set():
                    conn.abort(f"close did not finish writing within {timeout:.0f}s")

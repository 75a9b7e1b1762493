"""A TLS front for a plain-HTTP S3 endpoint in tests: an asyncio relay on 127.0.0.1 that
terminates TLS with a given certificate and copies bytes both ways to the upstream host:port.

The S3 request passes through unchanged (the Host header the client signed included), so the
server behind it (Swift's s3api) answers as if reached directly, and the client sees a real
https endpoint whose certificate it must verify. The relay runs on its own thread and event
loop (the S3 backend's calls are blocking); it counts the handshakes that worked and those the
client broke off (an untrusted certificate), so a test can tell a TLS refusal from any other
failure. It stops, closing every connection, when its context ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class RelayStats:
    handshakes: int = 0
    refused: int = 0
    errors: list[str] = field(default_factory=list)


class TlsRelay:
    def __init__(self, upstream: tuple[str, int], cert: Path, key: Path) -> None:
        self.upstream = upstream
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(cert, key)
        self.stats = RelayStats()
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tls-relay")
        self._listener: socket.socket
        self._acceptor: asyncio.Future[None]
        self._conns: set[asyncio.Future[None]] = set()
        self._socks: list[socket.socket] = []  # closed at stop, whatever state TLS is in

    def start(self) -> int:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        self.port = future.result(timeout=10)
        return self.port

    def wait_refused(self, count: int, timeout_s: float = 5.0) -> bool:
        """Whether ``count`` handshakes were refused within ``timeout_s`` (the client may report
        its failure before the relay's thread has counted it)."""
        deadline = time.monotonic() + timeout_s
        while self.stats.refused < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.stats.refused >= count

    def stop(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        for sock in self._socks:
            sock.close()  # a TLS transport's close waits for its shutdown; the loop has not
        self._loop.close()

    async def _listen(self) -> int:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self._acceptor = asyncio.ensure_future(self._accept_loop())
        return int(self._listener.getsockname()[1])

    async def _close(self) -> None:
        self._acceptor.cancel()
        for task in list(self._conns):
            task.cancel()
        await asyncio.gather(self._acceptor, *self._conns, return_exceptions=True)
        self._listener.close()
        for _ in range(3):  # aborted transports close on the loop's next turns
            await asyncio.sleep(0)

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(self._listener)
            self._socks.append(conn)
            task = asyncio.ensure_future(self._serve(conn))
            self._conns.add(task)
            task.add_done_callback(self._conns.discard)

    async def _serve(self, conn: socket.socket) -> None:
        # TLS from the first byte: the socket is handed over before anything reads it (a
        # StreamWriter.start_tls after accepting could lose a ClientHello already buffered).
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        protocol = asyncio.StreamReaderProtocol(reader)
        try:
            transport, _ = await loop.connect_accepted_socket(
                lambda: protocol, conn, ssl=self.context, ssl_handshake_timeout=10
            )
        except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
            self.stats.refused += 1  # the client did not accept our certificate
            self.stats.errors.append(f"{type(exc).__name__}: {exc}")
            conn.close()
            return
        self.stats.handshakes += 1
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            try:
                await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))
            finally:
                up_writer.transport.abort()
        finally:
            # abort, not close: a TLS close waits for the peer's close_notify, which a pooled
            # client connection never sends before the relay stops.
            transport.abort()


async def _copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    except OSError:  # a reset or a TLS error (ssl.SSLError is an OSError)
        pass
    with contextlib.suppress(OSError, RuntimeError):
        if dst.can_write_eof():
            dst.write_eof()  # a half-close, passed on
        else:
            dst.close()  # TLS has no half-close: end the connection


@contextlib.contextmanager
def tls_relay(upstream: tuple[str, int], cert: Path, key: Path) -> Iterator[TlsRelay]:
    """A running relay to ``upstream`` serving ``cert``; stopped when the context ends."""
    relay = TlsRelay(upstream, cert, key)
    relay.start()
    try:
        yield relay
    finally:
        relay.stop()

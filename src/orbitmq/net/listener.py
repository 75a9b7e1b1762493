"""A TCP listener that admits connections before reading them and picks TLS or plaintext.

Contract: ``Listener(open_protocol, ...)`` accepts on ``host:port``; for each connection it

1. asks :class:`~orbitmq.net.limits.Admission` (total, per-IP and per-IP rate caps) and closes
   a refused one at once, before reading a byte;
2. waits, at most ``handshake_timeout_s``, for the first byte and peeks at it (``MSG_PEEK``:
   nothing is consumed). 0x16 starts a TLS handshake record. In ``permissive`` mode that picks
   TLS or plaintext; in ``required`` mode anything else is closed as plaintext; in ``off`` mode
   a connection is plaintext: the event loop's own server accepts it (no peek, no task, no
   added latency) and the protocol, made with address "", runs the admission itself when it
   is connected (``Connection.admit``);
3. hands the socket to the event loop (``connect_accepted_socket``), with the context the
   :class:`~orbitmq.net.tls.ContextSource` holds *now* (so a reloaded certificate applies to
   new connections only) and ``handshake_timeout_s`` for the TLS handshake. A failed handshake
   (no or wrong client certificate, TLS < 1.2) is closed before the protocol sees any byte.

The protocol's ``connection_made`` runs only for admitted, handshaken connections; the owner
calls :meth:`release` with the address when such a connection closes. Every refusal is counted
in ``refusals`` by reason. This is RocketMQ's ``TlsModeHandler``, on asyncio.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable

from orbitmq.common.errors import ConfigError
from orbitmq.common.tasks import TaskSet
from orbitmq.net.limits import (
    REASON_HANDSHAKE_TIMEOUT,
    REASON_PLAINTEXT,
    REASON_TLS,
    Admission,
    Limits,
    Refusals,
)
from orbitmq.net.tls import TLS_MODES, TLS_RECORD_HANDSHAKE, ContextSource

log = logging.getLogger(__name__)


class Listener:
    def __init__(
        self,
        open_protocol: Callable[[str], asyncio.Protocol],
        *,
        host: str,
        port: int,
        tls_mode: str = "off",
        tls: ContextSource | None = None,
        limits: Limits | None = None,
        refusals: Refusals | None = None,
        name: str = "listener",
        backlog: int = 1024,
    ) -> None:
        if tls_mode not in TLS_MODES:
            raise ConfigError(f"{name}: tls_mode {tls_mode!r} is not one of {TLS_MODES}")
        if tls_mode != "off" and tls is None:
            raise ConfigError(f"{name}: tls_mode={tls_mode} needs a certificate")
        self.open_protocol = open_protocol
        self.host = host
        self.port = port
        self.tls_mode = tls_mode
        self.tls = tls
        self.limits = limits or Limits()
        self.refusals = refusals or Refusals()
        self.admission = Admission(self.limits, self.refusals)
        self.name = name
        self.backlog = backlog
        self._sock: socket.socket | None = None
        self._server: asyncio.Server | None = None
        self._tasks = TaskSet(f"{name} accept", logger=log)
        self._pending: set[socket.socket] = set()

    async def start(self) -> int:
        """Bind and start accepting; returns the bound port."""
        sock = self._bind()
        if self.tls_mode == "off":
            loop = asyncio.get_running_loop()
            try:
                self._server = await loop.create_server(
                    lambda: self.open_protocol(""), sock=sock, backlog=self.backlog
                )
            except OSError as exc:
                sock.close()
                raise ConfigError(
                    f"{self.name} cannot listen on {self.host}:{self.port}: {exc}"
                ) from exc
            self.port = sock.getsockname()[1]
            return self.port
        sock.setblocking(False)
        self._sock = sock
        self.port = sock.getsockname()[1]
        self._tasks.spawn(self._accept_loop(sock), name=f"{self.name}-accept")
        if self.tls is not None and self.tls.files:
            self._tasks.spawn(self.tls.watch(), name=f"{self.name}-tls-reload")
        return self.port

    def _bind(self) -> socket.socket:
        """Bind and listen here, so a listen that fails raises. Two processes may both bind a
        port with SO_REUSEADDR while neither listens; the second listen then fails. Inside the
        event loop's own create_server that failure only closed the server (uvloop reports it
        to the loop, not the caller): a broker started beside two others died reading the port
        of the MQTT listener it was meant to skip as taken."""
        try:
            family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
            return socket.create_server((self.host, self.port), family=family, backlog=self.backlog)
        except OSError as exc:
            raise ConfigError(
                f"{self.name} cannot listen on {self.host}:{self.port}: {exc}"
            ) from exc

    async def _accept_loop(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, addr = await loop.sock_accept(sock)
            except OSError as exc:  # EMFILE and the like: back off rather than spin
                log.warning("%s: accept failed: %s", self.name, exc)
                await asyncio.sleep(0.1)
                continue
            ip = str(addr[0])
            if not self.admission.admit(ip):
                _hard_close(conn)
                continue
            conn.setblocking(False)
            self._pending.add(conn)
            self._tasks.spawn(self._setup(conn, ip))

    async def _setup(self, sock: socket.socket, ip: str) -> None:
        loop = asyncio.get_running_loop()
        handed = False
        try:
            use_tls = False
            if self.tls_mode != "off":
                first = await self._first_byte(sock)
                if first is None:
                    self.refusals.count(REASON_HANDSHAKE_TIMEOUT, ip, "no first byte")
                    return
                use_tls = first == TLS_RECORD_HANDSHAKE
                if not use_tls and self.tls_mode == "required":
                    self.refusals.count(REASON_PLAINTEXT, ip, f"{self.name} requires TLS")
                    return
            proto = self.open_protocol(ip)
            ctx = self.tls.current if use_tls and self.tls is not None else None
            self._pending.discard(sock)
            handed = True
            try:
                await loop.connect_accepted_socket(
                    lambda: proto,
                    sock,
                    ssl=ctx,
                    ssl_handshake_timeout=self.limits.handshake_timeout_s if ctx else None,
                )
            except (OSError, ssl.SSLError, TimeoutError, ConnectionError) as exc:
                self.refusals.count(REASON_TLS, ip, str(exc) or type(exc).__name__)
                _hard_close(sock)
                self.admission.release(ip)
        finally:
            if not handed:
                self._pending.discard(sock)
                _hard_close(sock)
                self.admission.release(ip)

    async def _first_byte(self, sock: socket.socket) -> int | None:
        """The first byte, peeked; None on EOF or after the handshake timeout."""
        loop = asyncio.get_running_loop()
        fd = sock.fileno()
        try:
            async with asyncio.timeout(self.limits.handshake_timeout_s):
                for _ in range(1000):  # bounded: each spurious wake-up reads nothing
                    ready: asyncio.Future[None] = loop.create_future()
                    loop.add_reader(fd, _wake, ready)
                    try:
                        await ready
                    finally:
                        loop.remove_reader(fd)
                    try:
                        data = sock.recv(1, socket.MSG_PEEK)
                    except BlockingIOError:
                        continue
                    except OSError:
                        return None
                    return data[0] if data else None
        except TimeoutError:
            return None
        return None

    def release(self, ip: str) -> None:
        """An admitted connection closed."""
        self.admission.release(ip)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()
        sock, self._sock = self._sock, None
        await self._tasks.close()
        for pending in list(self._pending):
            _hard_close(pending)
        self._pending.clear()
        if sock is not None:
            sock.close()


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _hard_close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()

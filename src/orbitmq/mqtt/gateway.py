"""MqttGateway: the MQTT 3.1.1 / 5.0 listener of a broker process (docs/mqtt.md).

It runs on the broker's event loop and store: :class:`StoreAccess` is the only broker object
it touches. ``start`` loads the sessions, shared groups and retained messages from the
journals under ``<store>/mqtt/``, hooks the store's arrival reports, then listens; ``stop``
closes every connection (5.0: DISCONNECT 0x8B; wills are not published, sessions are kept)
and the journals. The CLI composes it with the broker (``orbitmq broker``, ``orbitmq up``);
tests build it directly, ``listen_port=0`` picking a free port.

Listeners (each an :class:`orbitmq.net.listener.Listener`, so TLS works as on every other
port: ``off`` / ``permissive`` / ``required``, certificates reloaded on change or SIGHUP):
MQTT on ``port``, MQTT over TLS only on ``tls_port`` (when TLS is on), MQTT over WebSocket on
``ws_port`` (:mod:`orbitmq.mqtt.websocket`). All three end in the same :class:`ClientHandler`;
a verified client certificate's principal goes with the connection to authentication.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
from collections.abc import Callable

from orbitmq.auth.guard import cert_principal
from orbitmq.common.clock import SYSTEM_CLOCK, Clock
from orbitmq.common.tasks import TaskSet
from orbitmq.mqtt.auth import Authenticator
from orbitmq.mqtt.config import MqttConfig
from orbitmq.mqtt.context import GatewayContext
from orbitmq.mqtt.handler import ClientHandler, Peer
from orbitmq.mqtt.journal import Journal
from orbitmq.mqtt.registry import Registry
from orbitmq.mqtt.retained import RetainedStore
from orbitmq.mqtt.store_access import StoreAccess
from orbitmq.mqtt.websocket import WebSocketStream
from orbitmq.net.limits import Limits
from orbitmq.net.listener import Listener

log = logging.getLogger(__name__)

LIMITS = Limits(
    max_connections=1_000_000, max_connections_per_ip=1_000_000,
    new_connections_per_ip_per_s=1e9, exempt_loopback=True,
)  # fmt: skip
"""No admission caps on the MQTT ports (devices behind one NAT address are the normal case);
the listener's TLS handshake timeout (10 s) applies, CONNECT_TIMEOUT_S after it."""


def raise_nofile_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (every MQTT device holds a
    connection open: 10,000 of them need as many descriptors); returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 20)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft


class MqttGateway:
    def __init__(
        self, config: MqttConfig, access: StoreAccess, *, listen_port: int | None = None,
        tls_port: int | None = None, ws_port: int | None = None, clock: Clock = SYSTEM_CLOCK,
    ) -> None:  # fmt: skip
        """``listen_port`` / ``tls_port`` / ``ws_port`` replace the configured ports (0: a free
        port); ``ws_port`` negative, or 0 in the config and None here, turns WebSocket off."""
        self.config = config
        self.listen_port = config.port if listen_port is None else listen_port
        self.tls_listen_port = config.tls_port if tls_port is None else tls_port
        ws = (config.ws_port or -1) if ws_port is None else ws_port
        self.ws_listen_port = ws if ws >= 0 else None
        folder = access.store_path / "mqtt"
        self.ctx = GatewayContext(
            config, access, clock,
            RetainedStore(folder / "retained.journal"), Journal(folder / "sessions.journal"),
        )  # fmt: skip
        self.tasks = TaskSet("mqtt", logger=log)
        self.registry = Registry(self.ctx, self.tasks)
        self.auth = Authenticator.build(config, access.server_auth())
        self.handlers: set[ClientHandler] = set()
        self.tls = config.tls_source()
        self._listeners: list[Listener] = []
        self.port = 0
        self.tls_port = 0
        """0 while TLS is off."""
        self.ws_port = 0
        """0 while WebSocket is off."""

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    def endpoints(self) -> dict[str, str]:
        """The open listeners, e.g. {"mqtt": "127.0.0.1:1883", "mqtts": ..., "mqtt-ws": ...}."""
        host = self.config.host
        out = {"mqtt": f"{host}:{self.port}"}
        if self.tls_port:
            out["mqtts"] = f"{host}:{self.tls_port}"
        if self.ws_port:
            out["mqtt-ws"] = f"{host}:{self.ws_port}"
        return out

    async def _listen(self, port: int, mode: str, websocket: bool) -> int:
        name = "mqtt-ws" if websocket else ("mqtts" if mode == "required" else "mqtt")
        listener = Listener(
            lambda _ip: asyncio.Protocol(), host=self.config.host, port=port, tls_mode=mode,
            tls=self.tls, limits=LIMITS, name=name,
        )  # fmt: skip
        listener.open_protocol = self._opener(websocket, listener)
        self._listeners.append(listener)
        return await listener.start()

    def _opener(self, websocket: bool, listener: Listener) -> Callable[[str], asyncio.Protocol]:
        def open_protocol(ip: str) -> asyncio.Protocol:
            reader = asyncio.StreamReader(limit=self.config.max_packet_size)

            async def connected(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
                try:
                    await self._serve(r, w, websocket)
                finally:
                    if ip:  # admitted by a TLS-sniffing listener: give the slot back
                        listener.release(ip)

            return asyncio.StreamReaderProtocol(reader, connected)

        return open_protocol

    async def start(self) -> None:
        self.ctx.hub.bind(asyncio.get_running_loop())
        raise_nofile_limit()
        self.ctx.journal.load()
        retained = self.ctx.retained.load()
        self.registry.load()
        self.ctx.access.add_arrival_listener(self.ctx.hub.on_arrival)
        mode = self.config.tls_mode
        self.port = await self._listen(self.listen_port, mode, websocket=False)
        if mode != "off":
            self.tls_port = await self._listen(self.tls_listen_port, "required", websocket=False)
        if self.ws_listen_port is not None:
            self.ws_port = await self._listen(self.ws_listen_port, mode, websocket=True)
        log.info(
            "MQTT gateway on %s (TLS %s): %d sessions, %d retained messages",
            ", ".join(f"{k}={v}" for k, v in self.endpoints().items()), mode,
            len(self.registry.sessions), retained,
        )  # fmt: skip

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, websocket: bool
    ) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = Peer.of(writer, cert_principal(writer), websocket)
        try:
            if websocket:
                ws = WebSocketStream(reader, writer, self.config.max_packet_size)
                if not await ws.handshake():
                    return
                handler = ClientHandler(self.ctx, self.registry, self.auth, ws.reader, ws, peer)
            else:
                handler = ClientHandler(self.ctx, self.registry, self.auth, reader, writer, peer)
            self.handlers.add(handler)
            try:
                await handler.run()
            finally:
                self.handlers.discard(handler)
        finally:
            writer.close()

    async def stop(self) -> None:
        listeners, self._listeners = self._listeners, []
        for listener in listeners:  # no new connections from here on
            with contextlib.suppress(Exception):
                await asyncio.wait_for(listener.stop(), 2)
        for handler in list(self.handlers):
            handler.shutdown()
        for _ in range(100):  # the handlers finish as their sockets close
            if not self.handlers:
                break
            await asyncio.sleep(0.02)
        self.registry.close()
        await self.tasks.close(timeout=2)
        self.ctx.access.remove_arrival_listener(self.ctx.hub.on_arrival)
        self.ctx.hub.bind(None)
        self.ctx.journal.close()
        self.ctx.retained.close()

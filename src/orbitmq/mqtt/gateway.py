"""MqttGateway: the MQTT 3.1.1 / 5.0 listener of a broker process (docs/mqtt.md).

It runs on the broker's event loop and store: :class:`StoreAccess` is the only broker object
it touches. ``start`` loads the sessions, shared groups and retained messages from the
journals under ``<store>/mqtt/``, hooks the store's arrival reports, then listens; ``stop``
closes every connection (5.0: DISCONNECT 0x8B; wills are not published, sessions are kept)
and the journals. The CLI composes it with the broker (``orbitmq broker``, ``orbitmq up``);
tests build it directly, ``listen_port=0`` picking a free port.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

from orbitmq.common.clock import SYSTEM_CLOCK, Clock
from orbitmq.common.errors import ConfigError
from orbitmq.common.tasks import TaskSet
from orbitmq.mqtt.auth import Authenticator
from orbitmq.mqtt.config import MqttConfig
from orbitmq.mqtt.context import GatewayContext
from orbitmq.mqtt.handler import ClientHandler
from orbitmq.mqtt.journal import Journal
from orbitmq.mqtt.registry import Registry
from orbitmq.mqtt.retained import RetainedStore
from orbitmq.mqtt.store_access import StoreAccess

log = logging.getLogger(__name__)


class MqttGateway:
    def __init__(
        self, config: MqttConfig, access: StoreAccess, *, listen_port: int | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:  # fmt: skip
        self.config = config
        self.listen_port = config.port if listen_port is None else listen_port
        folder = access.store_path / "mqtt"
        self.ctx = GatewayContext(
            config, access, clock,
            RetainedStore(folder / "retained.journal"), Journal(folder / "sessions.journal"),
        )  # fmt: skip
        self.tasks = TaskSet("mqtt", logger=log)
        self.registry = Registry(self.ctx, self.tasks)
        self.auth = Authenticator(config.auth_enabled, config.password_file)
        if config.auth_enabled and not config.password_file:
            raise ConfigError("mqtt.auth_enabled needs mqtt.password_file")
        self.handlers: set[ClientHandler] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    async def start(self) -> None:
        self.ctx.hub.loop = asyncio.get_running_loop()
        self.ctx.journal.load()
        retained = self.ctx.retained.load()
        self.registry.load()
        self.ctx.access.add_arrival_listener(self.ctx.hub.on_arrival)
        self._server = await asyncio.start_server(
            self._serve, self.config.host, self.listen_port, reuse_address=True,
            limit=self.config.max_packet_size,
        )  # fmt: skip
        self.port = self._server.sockets[0].getsockname()[1]
        log.info(
            "MQTT gateway on %s: %d sessions, %d retained messages",
            self.address, len(self.registry.sessions), retained,
        )  # fmt: skip

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        handler = ClientHandler(self.ctx, self.registry, self.auth, reader, writer)
        self.handlers.add(handler)
        try:
            await handler.run()
        finally:
            self.handlers.discard(handler)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for handler in list(self.handlers):
            handler.shutdown()
        for _ in range(100):  # the handlers finish as their sockets close
            if not self.handlers:
                break
            await asyncio.sleep(0.02)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
            self._server = None
        self.registry.close()
        await self.tasks.close(timeout=2)
        self.ctx.access.remove_arrival_listener(self.ctx.hub.on_arrival)
        self.ctx.hub.loop = None
        self.ctx.journal.close()
        self.ctx.retained.close()

"""An in-process OrbitMQ with its MQTT gateway for paho-mqtt tests.

NameServer, broker and gateway run on one uvloop event loop in a thread of the test process
(paho's clients are blocking and threaded; the test body stays synchronous). ``restart()`` stops
the gateway and the broker and starts them again on the same store folder and ports, as a
broker process restart would; ``kill()`` drops them without a clean stop (no checkpoint, no
journal close), which is what survives of a SIGKILL inside one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from orbitmq.broker.controller import BrokerController
from orbitmq.mqtt.config import MqttConfig
from orbitmq.mqtt.gateway import MqttGateway
from orbitmq.mqtt.store_access import StoreAccess
from orbitmq.namesrv.config import NamesrvConfig
from orbitmq.namesrv.controller import NamesrvController
from orbitmq.net.loop import new_event_loop
from orbitmq.testing import small_broker_config

mqtt = pytest.importorskip("paho.mqtt.client")

T = TypeVar("T")
_ids = itertools.count()


class MqttServer:
    def __init__(
        self, folder: Path, broker_settings: dict[str, Any] | None = None, **mqtt_settings: Any
    ) -> None:
        self.folder = folder
        self.broker_settings = broker_settings or {}
        self.mqtt_settings = mqtt_settings
        self.loop = new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.namesrv = NamesrvController(NamesrvConfig(port=0))
        self.call(self.namesrv.start())
        self.broker: BrokerController | None = None
        self.gateway: MqttGateway | None = None
        self.port = 0
        self.tls_port = 0
        self.ws_port = 0
        self.call(self._start())

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def run(self, fn: Callable[[], T]) -> T:
        async def wrap() -> T:
            return fn()

        return self.call(wrap())

    async def _start(self) -> None:
        cfg = small_broker_config(
            self.folder / "store",
            namesrv_addrs=(self.namesrv.address,),
            store={"max_message_size": 4 * 1024 * 1024},
            **self.broker_settings,
        )
        self.broker = BrokerController(cfg)
        await self.broker.start()
        self.gateway = MqttGateway(
            MqttConfig(**self.mqtt_settings), StoreAccess(self.broker), listen_port=self.port,
            tls_port=self.tls_port, ws_port=self.ws_port,
        )  # fmt: skip
        await self.gateway.start()
        self.port = self.gateway.port
        self.tls_port = self.gateway.tls_port
        self.ws_port = self.gateway.ws_port

    async def _stop(self) -> None:
        if self.gateway is not None:
            await self.gateway.stop()
        if self.broker is not None:
            await self.broker.stop()
        self.gateway = self.broker = None

    def restart(self) -> None:
        self.call(self._stop())
        self.call(self._start())

    def close(self) -> None:
        try:
            self.call(self._stop())
            self.call(self.namesrv.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[MqttServer]:
    s = MqttServer(tmp_path)
    try:
        yield s
    finally:
        s.close()


class Client:
    """A paho-mqtt 2.x client that records what it receives."""

    def __init__(
        self, port: int, version: int = 5, client_id: str | None = None, transport: str = "tcp",
        **connect: Any,
    ) -> None:  # fmt: skip
        proto = mqtt.MQTTv5 if version == 5 else mqtt.MQTTv311
        self.client_id = client_id or f"c{next(_ids)}"
        kwargs: dict[str, Any] = {
            "protocol": proto, "client_id": self.client_id, "transport": transport
        }  # fmt: skip
        if version != 5:
            kwargs["clean_session"] = connect.pop("clean_session", True)
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, **kwargs)
        self.messages: list[Any] = []
        self.lock = threading.Lock()
        self.connected = threading.Event()
        self.connack: Any = None
        self.disconnected = threading.Event()

        def on_connect(_c: Any, _u: Any, flags: Any, rc: Any, props: Any) -> None:
            self.connack = (flags, rc, props)
            self.connected.set()

        def on_message(_c: Any, _u: Any, msg: Any) -> None:
            with self.lock:
                self.messages.append(msg)

        def on_disconnect(*_a: Any) -> None:
            self.disconnected.set()

        self.c.on_connect = on_connect
        self.c.on_message = on_message
        self.c.on_disconnect = on_disconnect
        self.port = port
        self.connect_args = connect

    def connect(self, **extra: Any) -> Client:
        self.connected.clear()
        self.c.connect("127.0.0.1", self.port, **{**self.connect_args, **extra})
        self.c.loop_start()
        assert self.connected.wait(10), "no CONNACK"
        return self

    def wait_for(self, n: int, timeout: float = 15) -> list[Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.messages) >= n:
                    return list(self.messages)
            time.sleep(0.01)
        with self.lock:
            return list(self.messages)

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


@pytest.fixture
def clients() -> Iterator[list[Client]]:
    made: list[Client] = []
    try:
        yield made
    finally:
        for c in made:  # disconnect first: it wakes paho's loop thread, so the join is quick
            with contextlib.suppress(Exception):
                c.c.disconnect()
        for c in made:
            with contextlib.suppress(Exception):
                c.c.loop_stop()

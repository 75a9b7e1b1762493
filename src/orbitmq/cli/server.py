"""Running servers from the command line: `orbitmq up`, `orbitmq namesrv`, `orbitmq broker`,
`orbitmq proxy`, `orbitmq controller`.

Each takes its :class:`~orbitmq.cli.settings.Settings` (defaults < TOML < env < flags), waits in
:func:`orbitmq.cli.runner.until_signal` and announces its endpoints with the one ready line.

The gRPC proxy (RocketMQ 5 clients) runs in local mode inside `orbitmq up` (port 8081 unless told
otherwise) and, when asked for with a proxy port, inside a broker process; on the same event loop
as the servers, as a client of them. It is imported only when it runs, so a plain broker never
loads gRPC.

A controller node (:class:`orbitmq.controller.server.ControllerNode`, docs/ha.md) runs alone
(`orbitmq controller`) or beside a NameServer (`orbitmq namesrv --controller`, RocketMQ's
``enableControllerInNamesrv``) on the same loop: it starts after the NameServer and stops before
it, so a controller never outlives the process's announced NameServer. Its Raft thread is
pysyncobj's own.

The MQTT gateway (docs/mqtt.md) runs beside the broker in ``orbitmq broker`` and ``orbitmq
up`` (port 1883; ``[mqtt] port = 0``: none) on the broker's loop and store.

Heavy optional imports (the Spark connector) never happen here: starting a broker loads only
what a broker needs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

from orbitmq.broker.controller import BrokerController
from orbitmq.cli.runner import Announce, until_signal
from orbitmq.cli.settings import Settings
from orbitmq.namesrv.controller import NamesrvController

if TYPE_CHECKING:
    from orbitmq.controller.config import ControllerConfig
    from orbitmq.proxy.config import ProxyConfig

log = logging.getLogger(__name__)

DEFAULT_PROXY_PORT = 8081


def up_proxy_port(settings: Settings, proxy_port: int | None) -> int | None:
    """`orbitmq up`'s proxy port: as asked by ``--proxy-port`` (negative: none), else the
    ``[proxy]`` table's, else 8081, else a free port when the NameServer itself takes a free
    one (a throwaway instance must not claim 8081)."""
    if proxy_port is not None:
        return None if proxy_port < 0 else proxy_port
    if "proxy.port" in settings.sources:
        return settings.proxy.port
    return 0 if settings.namesrv.port == 0 else DEFAULT_PROXY_PORT


def broker_proxy_port(settings: Settings, proxy_port: int | None) -> int | None:
    """`orbitmq broker` runs a proxy beside it only when asked: ``--proxy-port`` or a port in
    the ``[proxy]`` table (None: no proxy)."""
    if proxy_port is not None:
        return None if proxy_port < 0 else proxy_port
    return settings.proxy.port if "proxy.port" in settings.sources else None


def local_proxy_config(
    settings: Settings, namesrv_addrs: tuple[str, ...], port: int
) -> ProxyConfig:
    """The proxy beside a broker: the ``[proxy]`` table, with what it does not set taken from
    the broker: its NameServers, its host and its body limit (so clients are told the size the
    broker really accepts)."""
    given = {key.partition(".")[2] for key in settings.sources if key.startswith("proxy.")}
    proxy = dataclasses.replace(settings.proxy, port=port)
    if "namesrv_addrs" not in given:
        proxy = dataclasses.replace(proxy, namesrv_addrs=namesrv_addrs)
    if "host" not in given:
        proxy = dataclasses.replace(proxy, host=settings.broker.host)
    if "max_message_size" not in given:
        proxy = dataclasses.replace(proxy, max_message_size=settings.broker.store.max_message_size)
    return proxy


@contextlib.asynccontextmanager
async def local_proxy(
    config: ProxyConfig | None, endpoints: dict[str, str], *, required: bool
) -> AsyncIterator[None]:
    """Run the gRPC proxy for the body of the ``with`` (``config`` None: no proxy). When it
    cannot start and is not ``required`` (the dev profile's default port is taken), the
    servers run without it and say so."""
    if config is None:
        yield
        return
    from orbitmq.common.errors import MQError
    from orbitmq.proxy.server import ProxyServer

    server = ProxyServer(config)
    try:
        await server.start()
    except MQError as exc:
        if required:
            raise
        log.warning("gRPC proxy not started: %s", exc)
        endpoints["proxy"] = f"off ({exc})"
        yield
        return
    endpoints["proxy"] = server.address
    try:
        yield
    finally:
        await server.stop()


@contextlib.asynccontextmanager
async def local_mqtt(
    settings: Settings, broker: BrokerController, endpoints: dict[str, str], *, free: bool
) -> AsyncIterator[None]:
    """Run the MQTT gateway on ``broker`` for the body of the ``with`` (docs/mqtt.md).
    ``[mqtt] port`` 0: none. Unless the port was set, a throwaway broker (``free``: it took a
    free port itself) takes a free one, and a taken default port only leaves MQTT off."""
    explicit = "mqtt.port" in settings.sources
    if settings.mqtt.port == 0:
        yield
        return
    from orbitmq.mqtt.gateway import MqttGateway
    from orbitmq.mqtt.store_access import StoreAccess

    port = 0 if free and not explicit else settings.mqtt.port
    gateway = MqttGateway(settings.mqtt, StoreAccess(broker), listen_port=port)
    try:
        await gateway.start()
    except OSError as exc:
        await gateway.stop()
        if explicit:
            raise
        log.warning("MQTT gateway not started: %s", exc)
        endpoints["mqtt"] = f"off ({exc.strerror or exc})"
        yield
        return
    endpoints["mqtt"] = gateway.address
    try:
        yield
    finally:
        await gateway.stop()


def dev_settings(settings: Settings, data_dir: Path) -> Settings:
    """`orbitmq up`'s profile: everything under one folder, topics created on first use."""
    store = settings.broker.store
    if "store.store_path" not in settings.sources:
        store = dataclasses.replace(store, store_path=data_dir / "store")
    broker = settings.broker
    if "broker.auto_create_topic" not in settings.sources:
        broker = dataclasses.replace(broker, auto_create_topic=True)
    return dataclasses.replace(settings, broker=dataclasses.replace(broker, store=store))


async def run_all_in_one(
    settings: Settings, announce: Announce, proxy_port: int | None = None
) -> None:
    """NameServer, Broker and gRPC proxy in one process and one event loop; Ctrl-C stops them
    cleanly. ``proxy_port``: see :func:`up_proxy_port` (negative: no proxy)."""
    namesrv = NamesrvController(settings.namesrv)
    await namesrv.start()
    broker_cfg = settings.broker
    if "broker.namesrv_addrs" not in settings.sources:
        broker_cfg = dataclasses.replace(broker_cfg, namesrv_addrs=(namesrv.address,))
    broker = BrokerController(broker_cfg)
    try:
        await broker.start()
    except BaseException:
        await namesrv.stop()
        raise
    try:
        endpoints = {
            "namesrv": namesrv.address,
            "broker": broker.address,
            "store": str(broker_cfg.store.store_path),
            "flush": broker_cfg.store.flush_disk_type.value,
        }
        if broker.metrics_port is not None:
            endpoints["metrics"] = f"http://{broker_cfg.host}:{broker.metrics_port}/metrics"
        port = up_proxy_port(settings, proxy_port)
        config = None if port is None else local_proxy_config(settings, (namesrv.address,), port)
        required = proxy_port is not None or "proxy.port" in settings.sources
        free = settings.namesrv.port == 0
        async with (
            local_mqtt(settings, broker, endpoints, free=free),
            local_proxy(config, endpoints, required=required),
        ):
            await until_signal(lambda: announce(endpoints))
    finally:
        await broker.stop()
        await namesrv.stop()


@contextlib.asynccontextmanager
async def controller_node(
    config: ControllerConfig | None, endpoints: dict[str, str], prefix: str = ""
) -> AsyncIterator[None]:
    """Run a controller node for the body of the ``with`` (None: none), adding its endpoints
    (``controller``, ``raft``, ``metrics`` with ``prefix``) to ``endpoints``."""
    if config is None:
        yield
        return
    from orbitmq.controller.server import ControllerNode

    node = ControllerNode(config)
    await node.start()
    try:
        endpoints["controller"] = node.address
        endpoints["raft"] = config.raft_address
        if node.metrics_port is not None:
            endpoints[f"{prefix}metrics"] = f"http://{config.host}:{node.metrics_port}/metrics"
        yield
    finally:
        await node.stop()


async def run_namesrv(
    settings: Settings, announce: Announce, controller: ControllerConfig | None = None
) -> None:
    """A NameServer; with ``controller`` also a controller node in this process (started
    after the NameServer, stopped before it)."""
    namesrv = NamesrvController(settings.namesrv)
    await namesrv.start()
    try:
        endpoints = {"namesrv": namesrv.address}
        if namesrv.metrics_port is not None:
            endpoints["metrics"] = f"http://{settings.namesrv.host}:{namesrv.metrics_port}/metrics"
        async with controller_node(controller, endpoints, prefix="controller_"):
            await until_signal(lambda: announce(endpoints))
    finally:
        await namesrv.stop()


async def run_controller(settings: Settings, announce: Announce) -> None:
    """A controller node alone: ``controller=<host:port> raft=<host:port> [metrics=...]``."""
    endpoints: dict[str, str] = {}
    async with controller_node(settings.controller, endpoints):
        endpoints["data"] = settings.controller.data_dir
        endpoints["peers"] = ",".join(settings.controller.peers) or "-"
        await until_signal(lambda: announce(endpoints))


async def run_broker(settings: Settings, announce: Announce, proxy_port: int | None = None) -> None:
    """A Broker; with a proxy port (:func:`broker_proxy_port`) also a gRPC proxy in the same
    process (local mode), which routes by the broker's NameServers like any proxy."""
    broker = BrokerController(settings.broker)
    await broker.start()
    try:
        endpoints = {
            "broker": broker.address,
            "cluster": settings.broker.cluster,
            "namesrv": ";".join(settings.broker.namesrv_addrs) or "-",
            "store": str(settings.broker.store.store_path),
        }
        if broker.metrics_port is not None:
            endpoints["metrics"] = f"http://{settings.broker.host}:{broker.metrics_port}/metrics"
        port = broker_proxy_port(settings, proxy_port)
        config = (
            None
            if port is None
            else local_proxy_config(settings, settings.broker.namesrv_addrs, port)
        )
        async with (
            local_mqtt(settings, broker, endpoints, free=settings.broker.port == 0),
            local_proxy(config, endpoints, required=True),
        ):
            await until_signal(lambda: announce(endpoints))
    finally:
        await broker.stop()


async def run_proxy(settings: Settings, announce: Announce) -> None:
    """Cluster mode: a stateless proxy in front of the brokers the NameServers know."""
    endpoints = {"namesrv": ";".join(settings.proxy.namesrv_addrs)}
    async with local_proxy(settings.proxy, endpoints, required=True):
        await until_signal(lambda: announce({"proxy": endpoints["proxy"], **endpoints}))

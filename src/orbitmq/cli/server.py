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
what a broker needs, and each server's own package is imported by the function that runs it (a
NameServer or a controller never loads the broker and its store).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

from orbitmq.cli.runner import Announce, until_signal
from orbitmq.cli.settings import Settings

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from orbitmq.broker.controller import BrokerController
    from orbitmq.console.config import ConsoleConfig
    from orbitmq.controller.config import ControllerConfig
    from orbitmq.kafka.config import KafkaConfig
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
    broker really accepts), and, with the broker's authentication on, its users (ACL on, the
    same auth file) and its credentials for the proxy's own requests."""
    given = {key.partition(".")[2] for key in settings.sources if key.startswith("proxy.")}
    proxy = dataclasses.replace(settings.proxy, port=port)
    if "namesrv_addrs" not in given:
        proxy = dataclasses.replace(proxy, namesrv_addrs=namesrv_addrs)
    if "host" not in given:
        proxy = dataclasses.replace(proxy, host=settings.broker.host)
    if "max_message_size" not in given:
        proxy = dataclasses.replace(proxy, max_message_size=settings.broker.store.max_message_size)
    broker = settings.broker
    if broker.auth_enabled and "acl_enabled" not in given:
        # the broker's users, and the broker's own credentials toward the brokers
        proxy = dataclasses.replace(
            proxy, acl_enabled=True, auth_file=proxy.auth_file or broker.auth_path
        )
        if proxy.access_key is None and broker.access_key:
            proxy = dataclasses.replace(
                proxy, access_key=broker.access_key, secret_key=broker.secret_key
            )
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
    if server.metrics_port is not None:
        endpoints["proxy_metrics"] = f"http://{config.host}:{server.metrics_port}/metrics"
    try:
        yield
    finally:
        await server.stop()


def local_kafka_config(
    settings: Settings, namesrv_addrs: tuple[str, ...], port: int
) -> KafkaConfig:
    """The Kafka gateway beside a broker: the ``[kafka]`` table, with the broker's NameServers
    and host for what it does not set, and, with the broker's authentication on, its users
    (SASL and ACLs on, the same auth file: no open Kafka port beside an authenticating broker)
    and its credentials for the gateway's own requests."""
    given = {key.partition(".")[2] for key in settings.sources if key.startswith("kafka.")}
    kafka = dataclasses.replace(settings.kafka, port=port)
    if "namesrv_addrs" not in given:
        kafka = dataclasses.replace(kafka, namesrv_addrs=namesrv_addrs)
    if "host" not in given:
        kafka = dataclasses.replace(kafka, host=settings.broker.host)
    broker = settings.broker
    if broker.auth_enabled and "auth_enabled" not in given:
        kafka = dataclasses.replace(
            kafka, auth_enabled=True, auth_file=kafka.auth_file or broker.auth_path
        )
        if kafka.access_key is None and broker.access_key:
            kafka = dataclasses.replace(
                kafka, access_key=broker.access_key, secret_key=broker.secret_key
            )
    return kafka


def kafka_port(settings: Settings, flag: int | None, default: int | None) -> int | None:
    """The gateway's port: ``--kafka-port`` (negative: none), else the ``[kafka]`` table's
    when it sets one, else ``default`` (None: no gateway)."""
    if flag is not None:
        return None if flag < 0 else flag
    if "kafka.port" in settings.sources:
        return settings.kafka.port
    return default


@contextlib.asynccontextmanager
async def local_kafka(
    config: KafkaConfig | None,
    endpoints: dict[str, str],
    *,
    required: bool,
    registry: CollectorRegistry | None = None,
) -> AsyncIterator[None]:
    """Run the Kafka gateway for the body of the ``with`` (None: none); like the proxy, a
    default port already taken is reported, not fatal. ``registry``: the broker's metrics, to
    which the gateway's refusals are added (``orbitmq_net_refused_total{listener="kafka"}``)."""
    if config is None:
        yield
        return
    from orbitmq.common.errors import MQError
    from orbitmq.kafka.server import KafkaGateway

    gateway = KafkaGateway(config)
    try:
        await gateway.start()
    except (OSError, MQError) as exc:  # a taken port is a ConfigError from the listener
        await gateway.stop()
        if required:
            raise
        log.warning("Kafka gateway not started: %s", exc)
        endpoints["kafka"] = f"off ({exc})"
        yield
        return
    endpoints["kafka"] = f"{config.host}:{gateway.port}"
    collector = None
    if registry is not None:
        from orbitmq.net.metrics import RefusalCollector

        collector = RefusalCollector("kafka", gateway.refusals)
        registry.register(collector)
    try:
        yield
    finally:
        if collector is not None and registry is not None:
            registry.unregister(collector)
        await gateway.stop()


def console_available() -> bool:
    """The console's optional dependencies (extra ``orbitmq[console]``) are installed."""
    import importlib.util

    return all(importlib.util.find_spec(m) for m in ("starlette", "jinja2", "uvicorn"))


def up_console_config(
    settings: Settings, namesrv_addrs: tuple[str, ...], port_flag: int | None
) -> ConsoleConfig | None:
    """`orbitmq up`'s console: 8088 (``--console-port``, the ``[console]`` table), on the up's
    NameServer unless the table names one; None when switched off (a negative port), not
    installed, or when up is a throwaway instance (its NameServer on a free port: tests and
    benchmarks) and nobody asked for a console."""
    if port_flag is not None:
        port = port_flag
    elif "console.port" in settings.sources:
        port = settings.console.port
    else:
        port = -1 if settings.namesrv.port == 0 else settings.console.port
    if port < 0 or not console_available():
        return None
    given = {key.partition(".")[2] for key in settings.sources if key.startswith("console.")}
    console = dataclasses.replace(settings.console, port=port)
    if "namesrv_addrs" not in given:
        console = dataclasses.replace(console, namesrv_addrs=namesrv_addrs)
    return console


@contextlib.asynccontextmanager
async def local_console(
    config: ConsoleConfig | None, endpoints: dict[str, str], *, required: bool
) -> AsyncIterator[None]:
    """Run the web console for the body of the ``with`` (None: none); a default port already
    taken is reported, not fatal."""
    if config is None:
        yield
        return
    from orbitmq.console.serve import serve_console

    try:
        cm = serve_console(config)
        url = await cm.__aenter__()
    except OSError as exc:
        if required:
            raise
        log.warning("console not started: %s", exc)
        endpoints["console"] = f"off ({exc})"
        yield
        return
    endpoints["console"] = url
    try:
        yield
    finally:
        await cm.__aexit__(None, None, None)


@contextlib.asynccontextmanager
async def local_mqtt(
    settings: Settings, broker: BrokerController, endpoints: dict[str, str], *, free: bool
) -> AsyncIterator[None]:
    """Run the MQTT gateway on ``broker`` for the body of the ``with`` (docs/mqtt.md).
    ``[mqtt] port`` 0: none. Each port (MQTT, TLS, WebSocket) not set explicitly is a free one
    for a throwaway broker (``free``); a taken default WebSocket port only leaves WebSocket off,
    a taken default MQTT port leaves MQTT off."""
    if settings.mqtt.port == 0:
        yield
        return
    from orbitmq.common.errors import ConfigError
    from orbitmq.mqtt.gateway import MqttGateway
    from orbitmq.mqtt.store_access import StoreAccess

    cfg = settings.mqtt
    explicit = {k for k in ("port", "tls_port", "ws_port") if f"mqtt.{k}" in settings.sources}

    def chosen(key: str, value: int) -> int:
        return 0 if free and key not in explicit else value

    ws = chosen("ws_port", cfg.ws_port) if cfg.ws_port else -1
    for _attempt in range(2):  # the second one without WebSocket, if its default port is taken
        gateway = MqttGateway(
            cfg, StoreAccess(broker), listen_port=chosen("port", cfg.port),
            tls_port=chosen("tls_port", cfg.tls_port), ws_port=ws,
        )  # fmt: skip
        try:
            await gateway.start()
            break
        except (OSError, ConfigError) as exc:
            await gateway.stop()
            if not isinstance(exc.__cause__ or exc, OSError):
                raise  # a configuration error (a missing certificate, ...), not a taken port
            if not gateway.port:
                failed = "port"
            elif cfg.tls_mode != "off" and not gateway.tls_port:
                failed = "tls_port"
            else:
                failed = "ws_port"
            if failed in explicit:
                raise
            if failed == "ws_port" and ws >= 0:
                log.warning("MQTT over WebSocket not started: %s", exc)
                ws = -1  # the default WebSocket port is taken: go on without it
                continue
            log.warning("MQTT gateway not started: %s", exc)
            endpoints["mqtt"] = f"off ({exc})"
            yield
            return
    endpoints.update(gateway.endpoints())
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


def auth_notice(role: str, enabled: bool, host: str) -> None:
    """Say at start whether anyone who reaches the port may do anything (docs/security.md)."""
    if enabled:
        log.info("%s: authentication and authorization are on", role)
    elif host in ("127.0.0.1", "::1", "localhost"):
        log.warning(
            "%s: authentication is OFF (development mode): anyone on this host may do anything, "
            "admin requests included; only loopback (%s) is listened on (docs/security.md)",
            role,
            host,
        )
    else:
        log.warning(
            "%s: authentication is OFF on %s: anyone who can reach the port may do anything, "
            "admin requests included; set auth_enabled (docs/security.md)",
            role,
            host,
        )


def shared_auth(settings: Settings) -> Settings:
    """`up` with the broker's auth on: the NameServer shares its auth file, and the broker
    signs its registrations as an inner Super user made for it with a fresh secret (kept in
    memory only; RocketMQ's innerClientAuthenticationCredentials)."""
    broker = settings.broker
    if not broker.auth_enabled:
        return settings
    import secrets

    from orbitmq.auth.model import UserType
    from orbitmq.auth.server import bootstrap_admin
    from orbitmq.auth.store import AuthStore, ExistsError

    auth_file = broker.auth_path
    namesrv = dataclasses.replace(settings.namesrv, auth_enabled=True, auth_file=auth_file)
    if broker.access_key is None:
        store = AuthStore(auth_file)
        bootstrap_admin(store)
        inner, secret = f"inner-{broker.broker_name}", secrets.token_urlsafe(24)
        try:
            store.create_user(inner, secret, UserType.SUPER, inner="loopback")
        except ExistsError:
            store.update_user(
                inner, secret=secret, utype=UserType.SUPER, enabled=True, inner="loopback"
            )
        broker = dataclasses.replace(
            broker, auth_file=auth_file, access_key=inner, secret_key=secret
        )
    return dataclasses.replace(settings, namesrv=namesrv, broker=broker)


async def run_all_in_one(
    settings: Settings,
    announce: Announce,
    proxy_port: int | None = None,
    kafka_port_flag: int | None = None,
    console_port: int | None = None,
) -> None:
    """NameServer, Broker and gRPC proxy in one process and one event loop; Ctrl-C stops them
    cleanly. ``proxy_port``: see :func:`up_proxy_port` (negative: no proxy)."""
    from orbitmq.broker.controller import BrokerController
    from orbitmq.namesrv.controller import NamesrvController

    auth_notice("up", settings.broker.auth_enabled, settings.broker.host)
    settings = shared_auth(settings)
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
        # a throwaway up (NameServer on a free port) must not claim 9092 either
        kport = kafka_port(settings, kafka_port_flag, 0 if settings.namesrv.port == 0 else 9092)
        kconfig = None if kport is None else local_kafka_config(settings, (namesrv.address,), kport)
        krequired = kafka_port_flag is not None or "kafka.port" in settings.sources
        cconfig = up_console_config(settings, (namesrv.address,), console_port)
        crequired = console_port is not None or "console.port" in settings.sources
        free = settings.namesrv.port == 0
        async with (
            local_mqtt(settings, broker, endpoints, free=free),
            local_proxy(config, endpoints, required=required),
            local_kafka(kconfig, endpoints, required=krequired, registry=broker.metrics.registry),
            local_console(cconfig, endpoints, required=crequired),
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


def embedded_controller_auth(
    settings: Settings, controller: ControllerConfig | None
) -> ControllerConfig | None:
    """A controller beside a NameServer with auth on checks requests as the NameServer does
    (same auth file, audit log and cluster), unless its own [controller] auth settings say
    otherwise: an embedded controller is never the one open door of an authenticated node."""
    ns = settings.namesrv
    if controller is None or not ns.auth_enabled or controller.auth_enabled:
        return controller
    if "controller.auth_enabled" in settings.sources:
        return controller  # explicitly off: the operator's choice, said at start by auth_notice
    return dataclasses.replace(
        controller,
        auth_enabled=True,
        auth_file=controller.auth_file or ns.auth_file,
        audit_file=controller.audit_file or ns.audit_file,
        cluster=ns.cluster if "controller.cluster" not in settings.sources else controller.cluster,
    )


async def run_namesrv(
    settings: Settings, announce: Announce, controller: ControllerConfig | None = None
) -> None:
    """A NameServer; with ``controller`` also a controller node in this process (started
    after the NameServer, stopped before it)."""
    from orbitmq.namesrv.controller import NamesrvController

    auth_notice("namesrv", settings.namesrv.auth_enabled, settings.namesrv.host)
    controller = embedded_controller_auth(settings, controller)
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
    auth_notice("controller", settings.controller.auth_enabled, settings.controller.host)
    endpoints: dict[str, str] = {}
    async with controller_node(settings.controller, endpoints):
        endpoints["data"] = settings.controller.data_dir
        endpoints["peers"] = ",".join(settings.controller.peers) or "-"
        await until_signal(lambda: announce(endpoints))


async def run_broker(
    settings: Settings,
    announce: Announce,
    proxy_port: int | None = None,
    kafka_port_flag: int | None = None,
) -> None:
    """A Broker; with a proxy port (:func:`broker_proxy_port`) also a gRPC proxy in the same
    process (local mode), which routes by the broker's NameServers like any proxy."""
    from orbitmq.broker.controller import BrokerController

    auth_notice("broker", settings.broker.auth_enabled, settings.broker.host)
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
        kport = kafka_port(settings, kafka_port_flag, None)
        kconfig = (
            None
            if kport is None
            else local_kafka_config(settings, settings.broker.namesrv_addrs, kport)
        )
        async with (
            local_mqtt(settings, broker, endpoints, free=settings.broker.port == 0),
            local_proxy(config, endpoints, required=True),
            local_kafka(kconfig, endpoints, required=True, registry=broker.metrics.registry),
        ):
            await until_signal(lambda: announce(endpoints))
    finally:
        await broker.stop()


async def run_proxy(settings: Settings, announce: Announce) -> None:
    """Cluster mode: a stateless proxy in front of the brokers the NameServers know."""
    endpoints = {"namesrv": ";".join(settings.proxy.namesrv_addrs)}
    async with local_proxy(settings.proxy, endpoints, required=True):
        await until_signal(lambda: announce({"proxy": endpoints["proxy"], **endpoints}))


async def run_kafka(settings: Settings, announce: Announce) -> None:
    """A Kafka gateway alone, in front of the brokers the NameServers know."""
    endpoints = {"namesrv": ";".join(settings.kafka.namesrv_addrs)}
    async with local_kafka(settings.kafka, endpoints, required=True):
        await until_signal(lambda: announce({"kafka": endpoints["kafka"], **endpoints}))


async def run_console(settings: Settings, announce: Announce) -> None:
    """The web console alone, in front of the cluster its NameServers know."""
    endpoints = {"namesrv": ";".join(settings.console.namesrv_addrs)}
    async with local_console(settings.console, endpoints, required=True):
        await until_signal(lambda: announce({"console": endpoints["console"], **endpoints}))

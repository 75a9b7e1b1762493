"""Running servers from the command line: `orbitmq up`, `orbitmq namesrv`, `orbitmq broker`,
`orbitmq proxy`.

The gRPC proxy (RocketMQ 5 clients) runs in local mode inside `orbitmq up` (port 8081 unless told
otherwise) and, when asked for with a proxy port, inside a broker process; on the same event loop
as the servers, as a client of them. It is imported only when it runs, so a plain broker never
loads gRPC.

Heavy optional imports (the Spark connector) never happen here: starting a broker loads only
what a broker needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from orbitmq.broker.controller import BrokerController, settle_heap
from orbitmq.cli.settings import Settings
from orbitmq.namesrv.controller import NamesrvController

if TYPE_CHECKING:
    from orbitmq.proxy.config import ProxyConfig

log = logging.getLogger(__name__)

DEFAULT_PROXY_PORT = 8081


def up_proxy_port(settings: Settings, proxy_port: int | None) -> int | None:
    """`orbitmq up`'s proxy port: as asked (negative: none), else 8081, else a free port when
    the NameServer itself takes a free one (a throwaway instance must not claim 8081)."""
    if proxy_port is not None:
        return None if proxy_port < 0 else proxy_port
    return 0 if settings.namesrv.port == 0 else DEFAULT_PROXY_PORT


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


@dataclasses.dataclass(frozen=True, slots=True)
class ProxyTls:
    """The proxy's TLS options on ``orbitmq up`` / ``orbitmq broker`` (see ProxyConfig)."""

    mode: str = "permissive"
    cert_file: str | None = None
    key_file: str | None = None
    client_ca_file: str | None = None


def proxy_config(
    namesrv_addrs: tuple[str, ...],
    host: str,
    port: int,
    max_message_size: int,
    tls: ProxyTls | None = None,
) -> ProxyConfig:
    """A proxy in the broker's process takes the broker's body limit, so clients are told the
    size the broker really accepts."""
    from orbitmq.proxy.config import ProxyConfig

    tls = tls or ProxyTls()
    return ProxyConfig(
        namesrv_addrs=namesrv_addrs,
        host=host,
        port=port,
        max_message_size=max_message_size,
        tls_mode=tls.mode,
        tls_cert_file=tls.cert_file,
        tls_key_file=tls.key_file,
        tls_client_ca_file=tls.client_ca_file,
    )


async def _until_signal(on_ready: Callable[[], None]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    settle_heap()
    on_ready()
    await stop.wait()


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
    settings: Settings,
    announce: Callable[[dict[str, str]], None],
    proxy_port: int | None = None,
    proxy_tls: ProxyTls | None = None,
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
        config = (
            None
            if port is None
            else proxy_config(
                (namesrv.address,),
                broker_cfg.host,
                port,
                broker_cfg.store.max_message_size,
                proxy_tls,
            )
        )
        async with local_proxy(config, endpoints, required=proxy_port is not None):
            await _until_signal(lambda: announce(endpoints))
    finally:
        await broker.stop()
        await namesrv.stop()


async def run_namesrv(settings: Settings, announce: Callable[[dict[str, str]], None]) -> None:
    namesrv = NamesrvController(settings.namesrv)
    await namesrv.start()
    try:
        await _until_signal(lambda: announce({"namesrv": namesrv.address}))
    finally:
        await namesrv.stop()


async def run_broker(
    settings: Settings,
    announce: Callable[[dict[str, str]], None],
    proxy_port: int | None = None,
    proxy_tls: ProxyTls | None = None,
) -> None:
    """A Broker; with ``proxy_port`` also a gRPC proxy in the same process (local mode), which
    routes by the broker's NameServers like any proxy."""
    broker = BrokerController(settings.broker)
    await broker.start()
    try:
        endpoints = {
            "broker": broker.address,
            "cluster": settings.broker.cluster,
            "namesrv": ";".join(settings.broker.namesrv_addrs),
            "store": str(settings.broker.store.store_path),
        }
        config = None
        if proxy_port is not None and proxy_port >= 0:
            config = proxy_config(
                settings.broker.namesrv_addrs,
                settings.broker.host,
                proxy_port,
                settings.broker.store.max_message_size,
                proxy_tls,
            )
        async with local_proxy(config, endpoints, required=True):
            await _until_signal(lambda: announce(endpoints))
    finally:
        await broker.stop()


async def run_proxy(config: ProxyConfig, announce: Callable[[dict[str, str]], None]) -> None:
    """Cluster mode: a stateless proxy in front of the brokers the NameServers know."""
    endpoints = {"namesrv": ";".join(config.namesrv_addrs)}
    async with local_proxy(config, endpoints, required=True):
        await _until_signal(lambda: announce({"proxy": endpoints["proxy"], **endpoints}))


Runner = Callable[[Settings, Callable[[dict[str, str]], None]], Awaitable[None]]

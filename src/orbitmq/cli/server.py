"""Running servers from the command line: `orbitmq up`, `orbitmq namesrv`, `orbitmq broker`.

Heavy optional imports (the Spark connector) never happen here: starting a broker loads only
what a broker needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

from orbitmq.broker.controller import BrokerController, settle_heap
from orbitmq.cli.settings import Settings
from orbitmq.namesrv.controller import NamesrvController

log = logging.getLogger(__name__)


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


async def run_all_in_one(settings: Settings, announce: Callable[[dict[str, str]], None]) -> None:
    """NameServer and Broker in one process and one event loop; Ctrl-C stops both cleanly."""
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


async def run_broker(settings: Settings, announce: Callable[[dict[str, str]], None]) -> None:
    broker = BrokerController(settings.broker)
    await broker.start()
    try:
        await _until_signal(
            lambda: announce(
                {
                    "broker": broker.address,
                    "cluster": settings.broker.cluster,
                    "namesrv": ";".join(settings.broker.namesrv_addrs),
                    "store": str(settings.broker.store.store_path),
                }
            )
        )
    finally:
        await broker.stop()


Runner = Callable[[Settings, Callable[[dict[str, str]], None]], Awaitable[None]]

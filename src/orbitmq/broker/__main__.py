"""``python -m orbitmq.broker``: run one broker until SIGINT/SIGTERM.

The ``orbitmq broker`` command is the documented way (TOML config, env vars); this entry point
takes the handful of flags tests and scripts need.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import signal
import sys
from pathlib import Path

from orbitmq.broker.config import BrokerConfig
from orbitmq.broker.controller import BrokerController, settle_heap
from orbitmq.net.loop import run
from orbitmq.store.config import FlushDiskType, StoreConfig


def parse(argv: list[str]) -> BrokerConfig:
    p = argparse.ArgumentParser(prog="python -m orbitmq.broker")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=10911)
    p.add_argument("--namesrv", default="127.0.0.1:9876", help="';'-separated host:port list")
    p.add_argument("--cluster", default="DefaultCluster")
    p.add_argument("--name", default="broker-a")
    p.add_argument("--store-path", default="orbitmq-data/store")
    p.add_argument("--flush", choices=["ASYNC_FLUSH", "SYNC_FLUSH"], default="ASYNC_FLUSH")
    p.add_argument("--segment-bytes", type=int, default=None)
    p.add_argument("--auto-create-topic", action="store_true")
    p.add_argument("--register-interval", type=float, default=30.0)
    p.add_argument("--metrics-port", type=int, default=None)
    p.add_argument(
        "--store-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="Any numeric StoreConfig field, e.g. max_index_num=4096 (repeatable)",
    )
    a = p.parse_args(argv)
    store_opts: dict[str, object] = {
        "store_path": Path(a.store_path),
        "flush_disk_type": FlushDiskType(a.flush),
    }
    if a.segment_bytes:
        store_opts["mapped_file_size_commit_log"] = a.segment_bytes
    store_opts.update(_store_options(p, a.store_option))
    return BrokerConfig(
        cluster=a.cluster,
        broker_name=a.name,
        host=a.host,
        port=a.port,
        namesrv_addrs=tuple(x for x in a.namesrv.split(";") if x),
        auto_create_topic=a.auto_create_topic,
        register_interval_s=a.register_interval,
        metrics_port=a.metrics_port,
        store=StoreConfig(**store_opts),  # type: ignore[arg-type]
    )


def _store_options(p: argparse.ArgumentParser, items: list[str]) -> dict[str, object]:
    """``NAME=VALUE`` pairs for the numeric StoreConfig fields (tests shrink the files with
    them: an IndexFile of RocketMQ's size is 400 MiB on disk the moment it is created)."""
    numeric = {
        f.name: f.type for f in dataclasses.fields(StoreConfig) if f.type in ("int", "float")
    }
    out: dict[str, object] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name not in numeric:
            p.error(f"--store-option {item!r}: expected NAME=VALUE, NAME one of {sorted(numeric)}")
        try:
            out[name] = int(value) if numeric[name] == "int" else float(value)
        except ValueError:
            p.error(f"--store-option {item!r}: {value!r} is not a number")
    return out


async def serve(config: BrokerConfig) -> None:
    broker = BrokerController(config)
    await broker.start()
    settle_heap()
    print(f"orbitmq broker ready {broker.address}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await broker.stop()


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    run(serve(parse(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    main()

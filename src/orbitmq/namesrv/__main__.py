"""``python -m orbitmq.namesrv``: run one NameServer until SIGINT or SIGTERM.

Prints ``orbitmq namesrv ready <host:port>`` once listening, so scripts and tests that start it
with ``--port 0`` learn the port without polling.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from orbitmq.namesrv.config import NamesrvConfig
from orbitmq.namesrv.controller import NamesrvController
from orbitmq.net.loop import run


def parse_args(argv: Sequence[str] | None = None) -> NamesrvConfig:
    defaults = NamesrvConfig()
    p = argparse.ArgumentParser(prog="python -m orbitmq.namesrv", description=__doc__)
    p.add_argument("--host", default=defaults.host, help="address to listen on")
    p.add_argument("--port", type=int, default=defaults.port, help="0 picks a free port")
    p.add_argument(
        "--metrics-port", type=int, default=None, help="Prometheus endpoint port (0: a free one)"
    )
    p.add_argument(
        "--broker-expired-s",
        type=float,
        default=defaults.broker_channel_expired_s,
        help="drop a broker that has not registered for this long",
    )
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return NamesrvConfig(
        host=args.host,
        port=args.port,
        metrics_port=args.metrics_port,
        broker_channel_expired_s=args.broker_expired_s,
    )


async def serve(config: NamesrvConfig) -> None:
    controller = NamesrvController(config)
    await controller.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        print(f"orbitmq namesrv ready {controller.address}", flush=True)
        if controller.metrics_port is not None:
            print(f"orbitmq namesrv metrics {config.host}:{controller.metrics_port}", flush=True)
        await stop.wait()
    finally:
        await controller.stop()


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    try:
        run(serve(config))
    except OSError as exc:  # the port is taken, the host is not ours, ...
        print(f"orbitmq namesrv: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

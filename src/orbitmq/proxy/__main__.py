"""``python -m orbitmq.proxy --namesrv HOST:PORT [--port 8081]``: a stateless cluster-mode proxy.

Prints ``orbitmq proxy ready <host:port>`` once it listens (what scripts and tests wait for) and
stops cleanly on SIGTERM/SIGINT. ``orbitmq proxy`` is the same with the CLI's help and logging.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import signal
import sys

from orbitmq.common.errors import MQError
from orbitmq.net.loop import run
from orbitmq.proxy.config import ProxyConfig
from orbitmq.proxy.server import ProxyServer


def parse_access_keys(items: list[str]) -> dict[str, str]:
    """``AK:SK`` pairs (the secret may itself contain ':')."""
    keys: dict[str, str] = {}
    for item in items:
        ak, sep, sk = item.partition(":")
        if not sep or not ak or not sk:
            raise ValueError(f"access key {item!r} is not AK:SK")
        keys[ak] = sk
    return keys


def build_config(
    namesrv: str,
    host: str,
    port: int,
    *,
    acl: bool = False,
    access_keys: list[str] | None = None,
    max_message_size: int | None = None,
    tls: str = "permissive",
    tls_cert: str | None = None,
    tls_key: str | None = None,
    tls_client_ca: str | None = None,
) -> ProxyConfig:
    addrs = tuple(a.strip() for a in namesrv.replace(",", ";").split(";") if a.strip())
    config = ProxyConfig(
        namesrv_addrs=addrs,
        host=host,
        port=port,
        acl_enabled=acl,
        access_keys=parse_access_keys(access_keys or []),
        tls_mode=tls,
        tls_cert_file=tls_cert,
        tls_key_file=tls_key,
        tls_client_ca_file=tls_client_ca,
    )
    if max_message_size is not None:
        config = dataclasses.replace(config, max_message_size=max_message_size)
    return config


async def serve(config: ProxyConfig) -> None:
    """Run the proxy until SIGINT/SIGTERM."""
    server = await ProxyServer(config).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        print(f"orbitmq proxy ready {server.address}", flush=True)
        await stop.wait()
    finally:
        await server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orbitmq.proxy", description=__doc__)
    parser.add_argument("--namesrv", "-n", default="127.0.0.1:9876", help="';'-separated host:port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081, help="0 picks a free port")
    parser.add_argument("--acl", action="store_true", help="verify MQv2-HMAC-SHA1 signatures")
    parser.add_argument("--access-key", action="append", default=[], metavar="AK:SK")
    parser.add_argument("--max-message-size", type=int, default=None)
    parser.add_argument(
        "--tls", default="permissive", choices=["off", "permissive", "required"],
        help="TLS and plaintext on one port (permissive), TLS only, or plaintext only",
    )  # fmt: skip
    parser.add_argument("--tls-cert", default=None, help="PEM certificate (default: self-signed)")
    parser.add_argument("--tls-key", default=None, help="PEM key of --tls-cert")
    parser.add_argument(
        "--tls-client-ca", default=None,
        help="mutual TLS: clients must present a certificate signed by this PEM CA "
        "(needs --tls required)",
    )  # fmt: skip
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        config = build_config(
            args.namesrv,
            args.host,
            args.port,
            acl=args.acl,
            access_keys=args.access_key,
            max_message_size=args.max_message_size,
            tls=args.tls,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            tls_client_ca=args.tls_client_ca,
        )
    except (MQError, ValueError) as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    try:
        run(serve(config))  # uvloop when installed
    except KeyboardInterrupt:
        pass
    except MQError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

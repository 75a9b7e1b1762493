"""`python -m orbitmq.bench security`: what TLS and encryption at rest cost, side by side.

Two pairs of runs on this machine, each the same work with the feature off and on:

- **store**: append ``--count`` 1 KiB messages in batches of 32 (ASYNC_FLUSH) and read them all
  back, into a plaintext store and into an encrypted one (AES-256-GCM, ``encrypt_at_rest``);
- **remoting**: ``--count`` 1 KiB request/response round trips, 64 in flight, between a client
  and a server on loopback, plaintext and TLS 1.3.

It prints messages per second for each and the ratio (the issue's targets: encrypted store >=
80 % of plaintext, TLS >= 70 %). Figures belong in docs/benchmarks.md, measured on an idle
machine; a small ``--count`` only checks that it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from orbitmq.common.codes import ResponseCode
from orbitmq.common.message import Message, MessageBatch
from orbitmq.net.client import RemotingClient
from orbitmq.net.connection import Connection, Reply
from orbitmq.net.server import RemotingServer
from orbitmq.net.tls import client_context
from orbitmq.protocol.frame import Frame
from orbitmq.proxy.tls import self_signed
from orbitmq.store.config import FlushDiskType, StoreConfig
from orbitmq.store.message_store import MessageStore

BODY = 1024
BATCH = 32


def _store_rate(root: Path, count: int, **crypto: object) -> float:
    config = StoreConfig(
        store_path=root,
        flush_disk_type=FlushDiskType.ASYNC_FLUSH,
        mapped_file_size_commit_log=64 * 1024 * 1024,
        **crypto,  # type: ignore[arg-type]  # encrypt_at_rest and its key file
    )
    body = os.urandom(BODY)
    batch = MessageBatch.of("Bench", 0, [Message("Bench", body, tags="t")] * BATCH)
    store = MessageStore(config)
    store.open()
    try:
        start = time.perf_counter()
        for _ in range(max(1, count // BATCH)):
            store.put(batch)
        store.wait_for_dispatch()
        offset = 0
        while True:
            res = store.get_messages("Bench", 0, offset, max_count=256, max_bytes=1 << 22)
            if not res.count:
                break
            offset = res.next_begin_offset
        return offset / (time.perf_counter() - start)
    finally:
        store.close()


async def _echo(frame: Frame, conn: Connection) -> Reply:
    return frame.reply(ResponseCode.SUCCESS, body=frame.body)


async def _remoting_rate(count: int, tls: bool, folder: Path) -> float:
    server_ctx = client_ctx = None
    if tls:
        ident = self_signed(["localhost", "127.0.0.1"])
        cert = folder / "bench.pem"
        cert.write_bytes(ident.cert_pem + ident.key_pem)
        from orbitmq.net.tls import server_context

        server_ctx = server_context(str(cert))
        client_ctx = client_context(ca_file=str(cert))
    server = RemotingServer(_echo, ssl_context=server_ctx)
    await server.start()
    client = RemotingClient(ssl_context=client_ctx)
    body = os.urandom(BODY)
    try:
        await client.invoke(server.address, Frame(1, body=body), timeout=10)
        start = time.perf_counter()
        done = 0

        async def worker(n: int) -> None:
            nonlocal done
            for _ in range(n):
                await client.invoke(server.address, Frame(1, body=body), timeout=30)
                done += 1

        await asyncio.gather(*(worker(count // 64 + 1) for _ in range(64)))
        return done / (time.perf_counter() - start)
    finally:
        await client.close()
        await server.stop()


def run(count: int, out: Callable[[str], None] = print) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="orbitmq-bench-security-") as tmp:
        folder = Path(tmp)
        key = folder / "master.key"
        key.write_bytes(os.urandom(32))
        key.chmod(0o600)
        plain = _store_rate(folder / "plain", count)
        sealed = _store_rate(
            folder / "sealed", count, encrypt_at_rest=True, encryption_key_file=str(key)
        )
        tcp = asyncio.run(_remoting_rate(count, False, folder))
        tls = asyncio.run(_remoting_rate(count, True, folder))
    results = {
        "store_plain_msg_s": plain,
        "store_encrypted_msg_s": sealed,
        "store_ratio": sealed / plain,
        "remoting_plain_msg_s": tcp,
        "remoting_tls_msg_s": tls,
        "remoting_ratio": tls / tcp,
    }
    out(f"store, 1 KiB append+read:  plaintext {plain:,.0f} msg/s, encrypted {sealed:,.0f} "
        f"msg/s ({sealed / plain:.0%})")  # fmt: skip
    out(f"remoting, 1 KiB round trips: plaintext {tcp:,.0f} msg/s, TLS {tls:,.0f} msg/s "
        f"({tls / tcp:.0%})")  # fmt: skip
    return results


def main(argv: list[str], command: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=command or "python -m orbitmq.bench security")
    parser.add_argument("--count", type=int, default=100_000, help="messages per run")
    ns = parser.parse_args(argv)
    run(ns.count)
    return 0

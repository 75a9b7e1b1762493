"""`python -m orbitmq.bench security`: what TLS and encryption at rest cost, side by side.

Pairs of runs on this machine, each the same work with the feature off and on:

- **store**: append ``--count`` 1 KiB messages in batches of 32 (ASYNC_FLUSH) until dispatched,
  then read them all back (hot: an encrypted store serves the plaintexts its appends cached;
  ``store.encryption_cache_bytes`` is raised for the run to hold them all, see
  :func:`cache_bytes`),
  then restart the store and read them again (cold: every group decrypted once), into a
  plaintext store and into an encrypted one (AES-256-GCM, ``encrypt_at_rest``): append, hot
  read, append + hot read, and cold read;
- **remoting**: ``--count`` 1 KiB request/response round trips, 64 in flight, between a client
  and a server on loopback, plaintext and TLS 1.3;
- **clients** (:mod:`orbitmq.bench.tls_clients`): produce ``--count`` 1 KiB messages through a
  NameServer and a broker, then consume them, plaintext and TLS on every client connection.

- **acl**: the same produce with the broker authenticating (RocketMQ's v1 signature) and
  authorizing every request of a normal user, against the plaintext produce above.

``--acl-pairs N`` runs the ACL row alone, N interleaved off/on pairs, and prints medians (the
way to read a few-percent cost on a shared machine). With ``--acl-mtls`` both sides of each
pair run over TLS and the producer's client certificate names its user, so "on" pays the ACL
check of every request without a per-request signature (what authorization costs once the
connection is authenticated), against TLS without auth. The ACL check's cost per request alone
is ``orbitmq bench auth``. It prints messages per
second for each and the ratios (the issue's targets: encrypted store >= 80 % of plaintext, TLS
>= 70 %, ACL checks < 5 % of produce throughput). Figures belong in docs/benchmarks.md, measured on an idle machine; a small
``--count`` only checks that it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from orbitmq.bench.tls_clients import produce_consume
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


def cache_bytes(count: int) -> int:
    """The encrypted store's cache of opened groups for a run: the default, or enough for
    every message of the run (so the hot read is hot at any ``--count``, as the plaintext
    store's read is served from the page cache); the cold read shows the other extreme."""
    return max(StoreConfig().encryption_cache_bytes, count * (BODY + 256))


def _read_all(store: MessageStore) -> int:
    offset = 0
    while True:
        res = store.get_messages("Bench", 0, offset, max_count=256, max_bytes=1 << 22)
        if not res.count:
            return offset
        offset = res.next_begin_offset


def _store_rate(root: Path, count: int, **crypto: object) -> tuple[float, float, float]:
    """(append msg/s until dispatched, hot read msg/s right after, cold read msg/s after a
    restart: an encrypted store's cache of opened groups is empty then)."""
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
        appended = time.perf_counter()
        done = _read_all(store)
        hot = done / (time.perf_counter() - appended)
    finally:
        store.close()
    store = MessageStore(config)
    store.open()
    try:
        store.wait_for_dispatch()
        start_cold = time.perf_counter()
        cold = _read_all(store) / (time.perf_counter() - start_cold)
    finally:
        store.close()
    return done / (appended - start), hot, cold


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


def _rate_pair(first: float, second: float) -> float:
    """Messages per second of the two phases together, from their rates."""
    return 1.0 / (1.0 / first + 1.0 / second)


def run(count: int, out: Callable[[str], None] = print) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="orbitmq-bench-security-") as tmp:
        folder = Path(tmp)
        key = folder / "master.key"
        key.write_bytes(os.urandom(32))
        key.chmod(0o600)
        plain_append, plain_read, plain_cold = _store_rate(folder / "plain", count)
        cache = cache_bytes(count)
        sealed_append, sealed_read, sealed_cold = _store_rate(
            folder / "sealed",
            count,
            encrypt_at_rest=True,
            encryption_key_file=str(key),
            encryption_cache_bytes=cache,
        )
        tcp = asyncio.run(_remoting_rate(count, False, folder))
        tls = asyncio.run(_remoting_rate(count, True, folder))
        produce, consume = asyncio.run(produce_consume(folder / "clients-plain", count, False))
        tls_produce, tls_consume = asyncio.run(produce_consume(folder / "clients-tls", count, True))
        acl_produce, _ = asyncio.run(
            produce_consume(folder / "clients-acl", count, False, acl=True, consume=False)
        )
    plain = _rate_pair(plain_append, plain_read)
    sealed = _rate_pair(sealed_append, sealed_read)
    results = {
        "store_plain_msg_s": plain,
        "store_encrypted_msg_s": sealed,
        "store_ratio": sealed / plain,
        "store_append_ratio": sealed_append / plain_append,
        "store_read_ratio": sealed_read / plain_read,
        "store_cold_read_ratio": sealed_cold / plain_cold,
        "remoting_plain_msg_s": tcp,
        "remoting_tls_msg_s": tls,
        "remoting_ratio": tls / tcp,
        "produce_plain_msg_s": produce,
        "produce_tls_msg_s": tls_produce,
        "produce_ratio": tls_produce / produce,
        "consume_plain_msg_s": consume,
        "consume_tls_msg_s": tls_consume,
        "consume_ratio": tls_consume / consume,
        "acl_produce_msg_s": acl_produce,
        "acl_produce_ratio": acl_produce / produce,
    }
    for name, a, b in (
        ("store, 1 KiB append (until dispatched)", plain_append, sealed_append),
        (f"store, 1 KiB read back (hot, cache {cache >> 20} MiB)", plain_read, sealed_read),
        ("store, 1 KiB read after a restart (cold)", plain_cold, sealed_cold),
        ("store, append + read", plain, sealed),
    ):
        out(f"{name}: plaintext {a:,.0f} msg/s, encrypted {b:,.0f} msg/s ({b / a:.0%})")
    for name, a, b in (
        ("remoting, 1 KiB round trips", tcp, tls),
        ("produce, 1 KiB, batches of 32", produce, tls_produce),
        ("consume, 1 KiB, lite pull", consume, tls_consume),
    ):
        out(f"{name}: plaintext {a:,.0f} msg/s, TLS {b:,.0f} msg/s ({b / a:.0%})")
    cost = 1 - acl_produce / produce
    out(
        f"produce, 1 KiB, batches of 32: ACL off {produce:,.0f} msg/s, ACL on {acl_produce:,.0f}"
        f" msg/s (signed v1, checked on every request: costs {cost:.1%}, target < 5%)"
    )
    return results


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def run_acl(
    count: int, pairs: int, out: Callable[[str], None] = print, *, mtls: bool = False
) -> dict[str, float]:
    """The ACL row alone, as ``pairs`` interleaved A/B pairs (ACL off, then on, each with a
    fresh NameServer and broker): on a loaded machine a single pair swings by more than the
    cost measured, so the cost is read from medians, of msg/s and of this process's CPU time
    per message (client and broker share the process: the CPU figure counts both sides'
    work and little of other processes' load, so it is the steadier of the two there)."""
    offs: list[float] = []
    ons: list[float] = []
    cpu_offs: list[float] = []
    cpu_ons: list[float] = []
    with tempfile.TemporaryDirectory(prefix="orbitmq-bench-acl-") as tmp:
        for i in range(pairs):
            off, _ = asyncio.run(
                produce_consume(Path(tmp) / f"off-{i}", count, mtls, consume=False, cpu=cpu_offs)
            )
            on, _ = asyncio.run(
                produce_consume(
                    Path(tmp) / f"on-{i}",
                    count,
                    mtls,
                    acl=True,
                    mtls=mtls,
                    consume=False,
                    cpu=cpu_ons,
                )
            )
            offs.append(off)
            ons.append(on)
            out(
                f"pair {i + 1}: ACL off {off:,.0f} msg/s {cpu_offs[-1] * 1e6:.1f} us CPU/msg,"
                f" ACL on {on:,.0f} msg/s {cpu_ons[-1] * 1e6:.1f} us CPU/msg"
                f" (costs {1 - on / off:.1%} msg/s, {1 - cpu_offs[-1] / cpu_ons[-1]:.1%} CPU)"
            )
    off, on = _median(offs), _median(ons)
    cpu_off, cpu_on = _median(cpu_offs), _median(cpu_ons)
    pair_cost = _median([1 - b / a for a, b in zip(offs, ons, strict=True)])
    cpu_cost = 1 - cpu_off / cpu_on
    how = "over TLS, ACL on: mTLS user, no signature; " if mtls else ""
    out(
        f"produce, 1 KiB, batches of 32, {how}medians of {pairs}: ACL off {off:,.0f} msg/s, ACL on"
        f" {on:,.0f} msg/s (costs {1 - on / off:.1%}; median of the pairs' costs"
        f" {pair_cost:.1%}); CPU per message {cpu_off * 1e6:.1f} us off, {cpu_on * 1e6:.1f} us"
        f" on (costs {cpu_cost:.1%} of throughput at equal CPU); target < 5%"
    )
    return {
        "acl_off_msg_s": off,
        "acl_on_msg_s": on,
        "acl_cost": 1 - on / off,
        "acl_pair_cost": pair_cost,
        "acl_cpu_off_us": cpu_off * 1e6,
        "acl_cpu_on_us": cpu_on * 1e6,
        "acl_cpu_cost": cpu_cost,
    }


def main(argv: list[str], command: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=command or "python -m orbitmq.bench security")
    parser.add_argument("--count", type=int, default=100_000, help="messages per run")
    parser.add_argument(
        "--acl-pairs",
        type=int,
        default=0,
        help="run only the ACL row, as this many interleaved off/on pairs (medians)",
    )
    parser.add_argument(
        "--acl-mtls",
        action="store_true",
        help="with --acl-pairs: both sides over TLS, the producer named by its client "
        "certificate (the ACL check without a per-request signature)",
    )
    ns = parser.parse_args(argv)
    if ns.acl_pairs > 0:
        run_acl(ns.count, ns.acl_pairs, mtls=ns.acl_mtls)
    else:
        run(ns.count)
    return 0

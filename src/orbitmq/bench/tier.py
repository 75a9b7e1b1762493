"""Cold-read benchmark: `python -m orbitmq.bench tier [--count N] [--size B] [--queues Q]
[--runs R] [--no-spark] [--no-broker]`: everything issue #19's benchmark asks for, in one run.

1. Store reads, one process: N messages of B bytes on Q queues go into a store whose tier is a
   directory; every queue is read sequentially by queue offset while the data is local (hot),
   then the tier uploads it, retention deletes the local segments, and the same reads are
   served from the tier (cold, the chunk cache cleared first). Reads are
   ``MessageStore.get_messages`` calls of 256 messages, what a pull serves; uploading and
   deleting are outside the timed windows.
2. Pull and a Spark batch read through a broker process, hot and then from the directory tier
   (:mod:`orbitmq.bench.tier_broker`), with the broker's CPU per pulled message.

The report gives every rate, the ratios and whether the issue's targets are met (cold pull
>= 0.5x hot and >= 50,000 msgs/s; the Spark read from the tier >= 0.5x the hot one).
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import tempfile
import time
from pathlib import Path

from orbitmq.bench.machine import cpu_model, loadavg
from orbitmq.bench.tier_broker import PULL_BATCH, BrokerTierResult, run_broker_tier_bench
from orbitmq.common.message import MessageBatch
from orbitmq.store.config import StoreConfig
from orbitmq.store.message_store import MessageStore

TOPIC = "BenchTier"
EVERY_HOUR = ";".join(str(h) for h in range(24))
MiB = 1024 * 1024


def _read_all(store: MessageStore, queues: int, batch: int) -> int:
    n = 0
    for q in range(queues):
        offset = store.min_offset(TOPIC, q)
        hi = store.max_offset(TOPIC, q)
        while offset < hi:
            res = store.get_messages(TOPIC, q, offset, batch, 64 * 1024 * 1024)
            n += res.count
            if res.next_begin_offset <= offset:
                raise RuntimeError(f"read stuck at {TOPIC}/{q}@{offset}: {res.status}")
            offset = res.next_begin_offset
    return n


def run_tier_bench(
    root: Path, count: int, size: int, queues: int, batch: int = 256, segment: int = 64 * MiB
) -> dict[str, float]:
    """Returns hot and cold msgs/s and their ratio (raises if a read misses a message)."""
    config = StoreConfig(
        store_path=root / "store",
        mapped_file_size_commit_log=segment,
        max_message_size=min(4 * MiB, segment // 4),
        clean_resource_interval_ms=3_600_000,
        tier_backend="directory",
        tier_path=str(root / "tier"),
        tier_upload_interval_ms=3_600_000,
        tier_local_retention_ms=0,
        delete_when=EVERY_HOUR,
        delete_commit_log_files_max_per_run=1_000_000,
    )
    store = MessageStore(config)
    store.open()
    try:
        body = os.urandom(size)
        per_queue = -(-count // queues)
        for q in range(queues):
            left = per_queue
            while left > 0:
                n = min(256, left)
                store.put(MessageBatch(TOPIC, q, [body] * n, [b""] * n))
                left -= n
        if not store.wait_for_dispatch(timeout=600):
            raise RuntimeError("dispatch did not catch up")
        total = per_queue * queues
        t0 = time.perf_counter()
        if _read_all(store, queues, batch) != total:
            raise RuntimeError("hot read missed messages")
        hot = total / (time.perf_counter() - t0)
        store.commit_log.flush()
        assert store.tier is not None
        store.tier.run_once()
        # Roll to a new segment so every segment holding the data can go.
        pad, n = config.max_message_size // 2, segment // (config.max_message_size // 2) + 1
        for _ in range(n):
            store.put(MessageBatch("BenchTierPad", 0, [bytes(pad)], [b""]))
        store.wait_for_dispatch()
        store.commit_log.flush()
        store.tier.run_once()
        store.retention.run()
        local = store.queues.get(TOPIC, 0)
        cold_share = (local.min_offset if local else 0) / per_queue
        store.tier.cache.forget_all()
        t0 = time.perf_counter()
        if _read_all(store, queues, batch) != total:
            raise RuntimeError("cold read missed messages")
        cold = total / (time.perf_counter() - t0)
    finally:
        store.close()
    return {"hot": hot, "cold": cold, "ratio": cold / hot, "cold_share": cold_share}


def main(argv: list[str], command: str) -> int:
    p = argparse.ArgumentParser(prog="python -m orbitmq.bench tier", description=__doc__)
    p.add_argument("--count", type=int, default=200_000, help="messages (default 200,000)")
    p.add_argument("--size", type=int, default=1024, help="body bytes (default 1 KiB)")
    p.add_argument("--queues", type=int, default=4, help="queues (default 4)")
    p.add_argument("--runs", type=int, default=3, help="runs of each broker read (median)")
    p.add_argument("--no-broker", action="store_true", help="store reads only")
    p.add_argument("--no-spark", action="store_true", help="no Spark batch reads")
    p.add_argument("--upload-ms", type=int, default=1000, help="tier_upload_interval_ms")
    p.add_argument("--dir", type=Path, default=None, help="where the store and tier go")
    args = p.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="orbitmq-bench-tier-", dir=args.dir))
    try:
        r = run_tier_bench(root / "store-bench", args.count, args.size, args.queues)
        b = None
        if not args.no_broker:
            say = functools.partial(print, "  ..", flush=True)
            b = run_broker_tier_bench(
                root / "broker-bench", args.count, args.size, args.queues, args.runs,
                spark=not args.no_spark, say=say, upload_ms=args.upload_ms,
            )  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"$ {command}")
    print(f"{args.count:,} x {args.size} B on {args.queues} queues, directory tier; {machine()}")
    print(f"store read {r['hot']:>12,.0f} msgs/s hot")
    print(f"store read {r['cold']:>12,.0f} msgs/s cold ({r['ratio']:.2f}x hot; "
          f"{r['cold_share']:.0%} of each queue read from the tier)")  # fmt: skip
    if b is not None:
        print(format_broker_result(b, args.runs))
    return 0


def machine() -> str:
    return f"{cpu_model()}, load {loadavg()}"


def format_broker_result(b: BrokerTierResult, runs: int) -> str:
    """The issue's figures: pull hot/cold (>= 0.5x and >= 50,000 msgs/s), Spark hot/tier."""
    hot, cold = b.rate(b.pull_hot_s), b.rate(b.pull_cold_s)
    hc, cc = b.cpu_us(b.pull_hot_cpu_s), b.cpu_us(b.pull_cold_cpu_s)
    met = "met" if cold >= 0.5 * hot and cold >= 50_000 else "NOT met"
    lines = [
        f"pull       {hot:>12,.0f} msgs/s hot  (median of {runs}, PULL_MESSAGE of {PULL_BATCH}; "
        f"broker CPU {hc:.2f} us/msg)",
        f"pull       {cold:>12,.0f} msgs/s cold (broker CPU {cc:.2f} us/msg; {b.chunks} chunks "
        f"in the tier, {b.count / max(1, b.chunks):,.0f} msgs each)",
        f"pull ratio {cold / hot:>12.2f}x (cold/hot; target >= 0.5x and >= 50,000 msgs/s: {met}; "
        f"CPU cold/hot {cc / hc if hc else 0:.2f}x)",
    ]
    if b.spark_skipped:
        lines.append(f"Spark batch read skipped: {b.spark_skipped}")
    else:
        sh, sc = b.rate(b.spark_hot_s), b.rate(b.spark_cold_s)
        lines += [
            f"Spark read {sh:>12,.0f} rows/s hot  (batch read into noop, local[2], median of {runs})",
            f"Spark read {sc:>12,.0f} rows/s tier",
            f"Spark ratio{sc / sh:>12.2f}x (tier/hot; target >= 0.5x: "
            f"{'met' if sc >= 0.5 * sh else 'NOT met'})",
        ]
    return "\n".join(lines)

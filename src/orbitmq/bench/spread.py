"""`python -m orbitmq.bench spread`: disk use and produce rate with messages spread over many queues.

Issue #14: ConsumeQueue files and IndexFiles used to take all their blocks up front (5.7 MiB per
queue, 420 MB per IndexFile), so 10,000 topics x 8 queues needed ~460 GB before holding a byte.
This bench puts one message in each of ``topics x queues`` queues (the spread run) and the same
number of messages into one topic of ``queues`` queues (the one-topic run), in the same process,
one after the other, each into a fresh store with the production defaults (1 GiB CommitLog
segments, 300,000-entry ConsumeQueue files, the IndexFile on). It reports the real disk use
(``st_blocks``, not file sizes) of each store and the produce rate, both for the puts alone and
including the dispatch that makes the messages readable (creating 80,000 queues costs there).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from orbitmq.bench.machine import machine_info
from orbitmq.common.message import MessageBatch
from orbitmq.store.config import StoreConfig
from orbitmq.store.message_store import MessageStore


@dataclass(frozen=True, slots=True)
class SpreadRun:
    name: str
    messages: int
    put_s: float
    readable_s: float
    disk_bytes: int
    apparent_bytes: int
    files: int

    @property
    def put_rate(self) -> float:
        return self.messages / self.put_s if self.put_s else 0.0

    @property
    def readable_rate(self) -> float:
        return self.messages / self.readable_s if self.readable_s else 0.0


def disk_use(root: Path) -> tuple[int, int, int]:
    """(bytes of blocks taken, apparent bytes, files) under ``root``."""
    blocks = apparent = files = 0
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            st = os.stat(os.path.join(dirpath, name))
            blocks += st.st_blocks * 512
            apparent += st.st_size
            files += 1
    return blocks, apparent, files


def run_one(base: Path, name: str, topics: list[str], queues: int, body: bytes) -> SpreadRun:
    root = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=base))
    try:
        store = MessageStore(StoreConfig(store_path=root, clean_resource_interval_ms=3_600_000))
        store.open()
        try:
            batches = [MessageBatch.of(t, q, [body]) for t in topics for q in range(queues)]
            began = time.perf_counter()
            for batch in batches:
                store.put(batch)
            put_s = time.perf_counter() - began
            if not store.wait_for_dispatch(timeout=3600):
                raise RuntimeError(f"{name}: dispatch did not catch up ({store.health()})")
            readable_s = time.perf_counter() - began
            store.checkpoint()
        finally:
            store.close()
        blocks, apparent, files = disk_use(root)
        return SpreadRun(name, len(batches), put_s, readable_s, blocks, apparent, files)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def format_runs(runs: list[SpreadRun]) -> str:
    lines = [
        "| run | messages | put msg/s | readable msg/s | disk use (blocks) | apparent size | files |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines.extend(
        f"| {r.name} | {r.messages:,} | {r.put_rate:,.0f} | {r.readable_rate:,.0f} | "
        f"{r.disk_bytes / 2**20:,.1f} MiB | {r.apparent_bytes / 2**30:,.1f} GiB | {r.files:,} |"
        for r in runs
    )
    if len(runs) == 2 and runs[1].put_rate:
        lines.append("")
        lines.append(
            f"spread / one topic: put {runs[0].put_rate / runs[1].put_rate:.0%}, "
            f"readable {runs[0].readable_rate / runs[1].readable_rate:.0%}"
        )
    return "\n".join(lines)


def main(argv: list[str], command: str) -> int:
    ap = argparse.ArgumentParser(prog="python -m orbitmq.bench spread", description=__doc__)
    ap.add_argument("--topics", type=int, default=10_000)
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--body", type=int, default=256, help="body bytes")
    ap.add_argument("--dir", type=Path, default=Path(".bench-tmp"))
    args = ap.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    body = os.urandom(args.body)
    spread = run_one(args.dir, "spread", [f"T{i:05d}" for i in range(args.topics)],
                     args.queues, body)  # fmt: skip
    one = run_one(args.dir, "one-topic", ["T"] * args.topics, args.queues, body)
    print(f"command: {command}")
    for key, value in machine_info(args.dir).items():
        print(f"{key}: {value}")
    print(format_runs([spread, one]))
    return 0

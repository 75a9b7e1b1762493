"""The measured store cases: append, SYNC_FLUSH puts (threads or asyncio appenders, as the
broker) and sequential reads, each timed around the measured calls only; building batches,
opening and closing stores and dispatch catch-up stay outside the timed window.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from orbitmq.bench.machine import percentile
from orbitmq.bench.store.model import BODY_SIZE, TOPIC, Progress, RunSample, run_line
from orbitmq.common.message import MessageBatch
from orbitmq.store.config import FlushDiskType, StoreConfig
from orbitmq.store.message_store import GetStatus, MessageStore


def store_config(root: Path, flush: FlushDiskType, **overrides: Any) -> StoreConfig:
    # Production defaults (1 GiB segments, 300k-entry ConsumeQueue files, index on); only the
    # periodic retention run is pushed out of the way, since the bench dirs are short-lived.
    opts: dict[str, Any] = {"clean_resource_interval_ms": 3_600_000}
    opts.update(overrides)
    return StoreConfig(store_path=root, flush_disk_type=flush, **opts)


@contextmanager
def case_dir(base: Path, name: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def make_batches(count: int, batch_size: int, body: bytes) -> list[MessageBatch]:
    out = []
    left = count
    while left > 0:
        n = min(batch_size, left)
        out.append(MessageBatch(TOPIC, 0, [body] * n, [b""] * n))
        left -= n
    return out


def make_body(size: int) -> bytes:
    return os.urandom(size)


# ---------------------------------------------------------------------------- cases


def bench_append(root: Path, count: int, batch_size: int, body_size: int = BODY_SIZE) -> RunSample:
    """One appender thread, ASYNC_FLUSH: time ``put`` of ``count`` messages."""
    batches = make_batches(count, batch_size, make_body(body_size))
    store = MessageStore(store_config(root, FlushDiskType.ASYNC_FLUSH))
    store.open()
    try:
        start = store.commit_log.max_offset
        put = store.put
        c0 = time.process_time()
        t0 = time.perf_counter()
        for batch in batches:
            put(batch)
        t1 = time.perf_counter()
        if not store.wait_for_dispatch(timeout=600):
            raise RuntimeError("dispatch did not catch up within 600 s")
        t2 = time.perf_counter()
        cpu = time.process_time() - c0
        written = store.commit_log.max_offset - start
        fsyncs = store.flusher.fsync_count
    finally:
        store.close()
    return RunSample(
        count,
        written,
        t1 - t0,
        {
            "cpu_us_per_msg": round(cpu / count * 1e6, 3),
            "dispatch_catch_up_s": round(t2 - t1, 4),
            "background_fsyncs": fsyncs,
        },
    )


def bench_sync_async(
    root: Path, count: int, concurrency: int, body_size: int = BODY_SIZE
) -> RunSample:
    """SYNC_FLUSH driven the way the broker drives it: ``concurrency`` asyncio tasks sending
    one message each through the broker's StoreBridge (the sends of one loop iteration
    appended as one write on the loop, one loop callback per fsync completing every send it
    covered)."""
    import asyncio

    from orbitmq.broker.store_bridge import StoreBridge

    body = make_body(body_size)
    store = MessageStore(store_config(root, FlushDiskType.SYNC_FLUSH))
    store.open()
    bridge = StoreBridge(store, capacity=1_000_000, wait_timeout_ms=60_000)
    latencies: list[float] = []
    per_task = [
        count // concurrency + (1 if i < count % concurrency else 0) for i in range(concurrency)
    ]

    async def appender(i: int) -> None:
        batch = MessageBatch(TOPIC, i % 8, [body], [b""])
        clock = time.perf_counter
        for _ in range(per_task[i]):
            t = clock()
            await bridge.put(batch)
            latencies.append(clock() - t)

    async def run_all() -> None:
        await asyncio.gather(*(appender(i) for i in range(concurrency)))

    try:
        start = store.commit_log.max_offset
        fsyncs_before = store.flusher.fsync_count
        c0 = time.process_time()
        t0 = time.perf_counter()
        asyncio.run(run_all())
        t1 = time.perf_counter()
        cpu = time.process_time() - c0
        fsyncs = store.flusher.fsync_count - fsyncs_before
        written = store.commit_log.max_offset - start
    finally:
        bridge.shutdown()
        store.close()
    lat = sorted(latencies)
    return RunSample(
        count,
        written,
        t1 - t0,
        {
            "cpu_us_per_msg": round(cpu / count * 1e6, 3),
            "fsyncs": fsyncs,
            "msgs_per_fsync": round(count / max(fsyncs, 1), 1),
            "put_p50_ms": round(percentile(lat, 50) * 1000, 3),
            "put_p99_ms": round(percentile(lat, 99) * 1000, 3),
        },
    )


def bench_sync(root: Path, count: int, threads: int, body_size: int = BODY_SIZE) -> RunSample:
    """SYNC_FLUSH, ``threads`` appenders each putting one-message batches until ``count``
    messages are stored in all; every put waits for its fsync (group commit)."""
    body = make_body(body_size)
    per_thread = [count // threads + (1 if i < count % threads else 0) for i in range(threads)]
    store = MessageStore(store_config(root, FlushDiskType.SYNC_FLUSH))
    store.open()
    latencies: list[list[float]] = [[] for _ in range(threads)]
    errors: list[Exception] = []
    barrier = threading.Barrier(threads + 1)

    def worker(i: int) -> None:
        batches = [MessageBatch(TOPIC, i % 8, [body], [b""]) for _ in range(per_thread[i])]
        lat = latencies[i]
        put = store.put
        clock = time.perf_counter
        try:
            barrier.wait()
            for batch in batches:
                t = clock()
                put(batch)
                lat.append(clock() - t)
        except Exception as exc:  # noqa: BLE001 - re-raised by the main thread after the join
            errors.append(exc)

    workers = [
        threading.Thread(target=worker, args=(i,), name=f"bench-put-{i}", daemon=True)
        for i in range(threads)
    ]
    try:
        for w in workers:
            w.start()
        start = store.commit_log.max_offset
        fsyncs_before = store.flusher.fsync_count
        barrier.wait()
        c0 = time.process_time()
        t0 = time.perf_counter()
        for w in workers:
            w.join()
        t1 = time.perf_counter()
        cpu = time.process_time() - c0
        fsyncs = store.flusher.fsync_count - fsyncs_before
        written = store.commit_log.max_offset - start
    finally:
        barrier.abort()
        for w in workers:
            w.join(timeout=30)
        store.close()
    if errors:
        raise RuntimeError(f"{len(errors)} appender(s) failed: {errors[0]!r}") from errors[0]
    all_lat = sorted(x for lat in latencies for x in lat)
    return RunSample(
        count,
        written,
        t1 - t0,
        {
            "cpu_us_per_msg": round(cpu / count * 1e6, 3),
            "fsyncs": fsyncs,
            "msgs_per_fsync": round(count / fsyncs, 1) if fsyncs else None,
            "put_p50_ms": round(percentile(all_lat, 50) * 1000, 3),
            "put_p99_ms": round(percentile(all_lat, 99) * 1000, 3),
        },
    )


def _fill(store: MessageStore, count: int, body: bytes) -> int:
    """Append ``count`` messages in batches of 256; return one record's size."""
    size = 0
    for batch in make_batches(count, 256, body):
        size = store.put(batch).sizes[0]
    if not store.wait_for_dispatch(timeout=600):
        raise RuntimeError("dispatch did not catch up within 600 s")
    return size


def read_all(store: MessageStore, expected: int, max_count: int) -> tuple[int, float, float]:
    """Read queue 0 of the bench topic from offset 0 to the end; (messages, seconds, CPU s)."""
    get = store.get_messages
    offset = 0
    n = 0
    c0 = time.process_time()
    t0 = time.perf_counter()
    while True:
        r = get(TOPIC, 0, offset, max_count)
        if r.status is not GetStatus.FOUND:
            break
        if r.skipped:
            raise RuntimeError(f"read skipped corrupt records at {r.skipped[:5]}")
        # A pull forwards r.body_parts (one view per run of records), with no per-record
        # object; r.messages would cut them into one view per record on first use.
        n += r.count
        offset = r.next_begin_offset
    t1 = time.perf_counter()
    cpu = time.process_time() - c0
    if r.status is not GetStatus.OFFSET_OVERFLOW_ONE or n != expected:
        raise RuntimeError(f"read {n} of {expected} messages, stopped with {r.status}")
    return n, t1 - t0, cpu


def _read_extra(n: int, cpu: float, *, crc: bool) -> dict[str, Any]:
    return {"cpu_us_per_msg": round(cpu / n * 1e6, 3) if n else None, "crc_verified": crc}


def bench_read(
    root: Path,
    count: int,
    cases: list[str],
    runs: int,
    body_size: int = BODY_SIZE,
    progress: Progress | None = None,
) -> dict[str, list[RunSample]]:
    """Fill once; read everything ``runs`` times for each hot case (``read-hot-m<max_count>``),
    then close, reopen and do the same for each reopen case (``read-reopen-m<max_count>``).
    Returns samples keyed by case name."""
    out: dict[str, list[RunSample]] = {}
    cfg = store_config(root, FlushDiskType.ASYNC_FLUSH)

    def read_cases(store: MessageStore, kind: str, rec_size: int) -> None:
        for name in cases:
            if not name.startswith(f"read-{kind}-m"):
                continue
            max_count = int(name.rsplit("-m", 1)[1])
            for _ in range(runs):
                n, secs, cpu = read_all(store, count, max_count)
                sample = RunSample(n, n * rec_size, secs, _read_extra(n, cpu, crc=kind != "hot"))
                out.setdefault(name, []).append(sample)
                if progress:
                    progress(run_line(name, sample))

    store = MessageStore(cfg)
    store.open()
    try:
        t0 = time.perf_counter()
        rec_size = _fill(store, count, make_body(body_size))
        if progress:
            progress(f"read: filled {count:,} messages in {time.perf_counter() - t0:.1f}s")
        read_cases(store, "hot", rec_size)
    finally:
        store.close()
    if any(name.startswith("read-reopen-") for name in cases):
        store = MessageStore(cfg)
        report = store.open()
        try:
            if not report.clean:
                raise RuntimeError(f"reopen after a clean close was not clean: {report.problems}")
            read_cases(store, "reopen", rec_size)
        finally:
            store.close()
    return out

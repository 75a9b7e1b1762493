"""Storage-engine benchmark: `python -m orbitmq.bench store` (later `orbitmq bench store`).

Cases (``--only`` takes names or group prefixes, e.g. ``--only append,read-hot``):

    append-b1 / append-b32 / append-b256   one thread, ASYNC_FLUSH, 1 KiB bodies, batch 1/32/256
    sync-t1 / sync-t64                      SYNC_FLUSH, 1 or 64 threads, each put one message
                                            and waits for its fsync (group commit)
    read-hot-m32 / read-hot-m256            sequential read by queue offset right after
                                            appending (records are trusted: no CRC check)
    read-reopen-m32 / read-reopen-m256      the same after close and reopen (CRC verified)
    recovery                                a child fills the CommitLog with ASYNC_FLUSH, keeps
                                            appending and is SIGKILLed; time MessageStore.open()

Every case runs ``runs`` times; the report gives the median with min and max. Timings are wall
clock (``time.perf_counter``) around the measured calls only: building batches, opening and
closing stores and dispatch catch-up are outside the timed window (catch-up is reported).

A CLI calls :func:`run_store_bench` with :class:`StoreBenchOptions` and prints
:func:`format_report`; :func:`add_arguments` and :func:`options_from_args` give it the same
flags as ``python -m orbitmq.bench store``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import select
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orbitmq.common
import orbitmq.store
from orbitmq.common.message import MessageBatch
from orbitmq.store.config import FlushDiskType, GiB, MiB, StoreConfig
from orbitmq.store.message_store import GetStatus, MessageStore

TOPIC = "BenchTopic"
BODY_SIZE = 1024

APPEND_CASES = {"append-b1": 1, "append-b32": 32, "append-b256": 256}
SYNC_CASES = {"sync-t1": 1, "sync-t64": 64}
ASYNC_SYNC_CASES = {"sync-a64": 64}
READ_CASES = ("read-hot-m32", "read-hot-m256", "read-reopen-m32", "read-reopen-m256")
ALL_CASES = (*APPEND_CASES, *SYNC_CASES, *ASYNC_SYNC_CASES, *READ_CASES, "recovery")

# Default messages per run when --count is not given.
DEFAULT_COUNTS = {
    "append-b1": 20_000,
    "append-b32": 200_000,
    "append-b256": 200_000,
    "sync-t1": 2_000,
    "sync-t64": 64_000,
    "sync-a64": 100_000,
    "read": 1_000_000,
}

# The targets: case -> (comparison, value, text); the median is compared.
TARGETS: dict[str, tuple[str, float, str]] = {
    "append-b256": (">=", 400_000, ">= 400,000 msgs/s"),
    "sync-t64": (">=", 100_000, ">= 100,000 msgs/s"),
    "sync-a64": (">=", 100_000, ">= 100,000 msgs/s"),
    "read-hot-m32": (">=", 1_000_000, ">= 1,000,000 msgs/s"),
    "read-hot-m256": (">=", 1_000_000, ">= 1,000,000 msgs/s"),
    "read-reopen-m32": (">=", 1_000_000, ">= 1,000,000 msgs/s"),
    "read-reopen-m256": (">=", 1_000_000, ">= 1,000,000 msgs/s"),
    "recovery": ("<", 2.0, "< 2 s"),
}

Progress = Callable[[str], None]


# ---------------------------------------------------------------------------- options/results


@dataclass(slots=True)
class StoreBenchOptions:
    """What to run. ``count`` (if set) overrides every case's messages per run."""

    runs: int = 3
    count: int | None = None
    read_count: int | None = None
    directory: Path | None = None
    only: tuple[str, ...] = ()
    recovery_gib: float = 2.0
    recovery_segment_bytes: int = 1 * GiB
    recovery_tail_s: float = 0.5
    body_size: int = BODY_SIZE
    fsync_samples: int = 200
    command: str = ""

    def messages_for(self, case: str) -> int:
        if case.startswith("read"):
            if self.read_count is not None:
                return self.read_count
            return self.count if self.count is not None else DEFAULT_COUNTS["read"]
        return self.count if self.count is not None else DEFAULT_COUNTS[case]

    def selected(self) -> list[str]:
        if not self.only:
            return list(ALL_CASES)
        chosen = [
            c
            for c in ALL_CASES
            if any(c == t or c.startswith(t.rstrip("-") + "-") for t in self.only)
        ]
        unknown = [
            t
            for t in self.only
            if not any(c == t or c.startswith(t.rstrip("-") + "-") for c in ALL_CASES)
        ]
        if unknown:
            raise ValueError(f"unknown case(s) {unknown}; cases: {', '.join(ALL_CASES)}")
        return chosen


@dataclass(slots=True)
class RunSample:
    """One run: ``messages`` handled in ``seconds``; ``extra`` holds case-specific numbers."""

    messages: int
    bytes: int
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else math.inf

    @property
    def mib_per_s(self) -> float:
        return self.bytes / MiB / self.seconds if self.seconds > 0 else math.inf


@dataclass(slots=True)
class CaseResult:
    name: str
    description: str
    runs: list[RunSample] = field(default_factory=list)
    primary: str = "msgs/s"  # or "seconds" (recovery)

    def values(self) -> list[float]:
        if self.primary == "seconds":
            return [r.seconds for r in self.runs]
        return [r.msgs_per_s for r in self.runs]

    @property
    def median(self) -> float:
        return statistics.median(self.values())

    @property
    def median_mib_per_s(self) -> float:
        return statistics.median(r.mib_per_s for r in self.runs)

    @property
    def target(self) -> str:
        t = TARGETS.get(self.name)
        return t[2] if t else ""

    @property
    def target_met(self) -> bool | None:
        t = TARGETS.get(self.name)
        if t is None or not self.runs:
            return None
        op, value, _ = t
        return self.median >= value if op == ">=" else self.median < value


@dataclass(slots=True)
class StoreBenchResults:
    command: str
    machine: dict[str, str]
    fsync_latency_ms: dict[str, float]
    cases: list[CaseResult]
    started_at: str
    total_seconds: float
    load_at_end: str = ""

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for case, raw in zip(self.cases, out["cases"], strict=True):
            raw["median"] = case.median if case.runs else None
            raw["median_mib_per_s"] = case.median_mib_per_s if case.runs else None
            raw["target"] = case.target
            raw["target_met"] = case.target_met
        return out


# ---------------------------------------------------------------------------- machine


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _mem_total() -> str:
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    kib = int(line.split()[1])
                    return f"{kib / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError):
        pass
    return "unknown"


def filesystem_of(path: Path) -> str:
    """'<fstype> on <device> (<mount point>, <options>)' for the mount holding ``path``."""
    real = os.path.realpath(path)
    best: tuple[str, str, str, str] | None = None
    try:
        with open("/proc/mounts", encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 4:
                    continue
                dev, mnt, fstype, opts = parts[:4]
                mnt = mnt.replace("\\040", " ")
                inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
                if inside and (best is None or len(mnt) >= len(best[1])):
                    best = (dev, mnt, fstype, opts)
    except OSError:
        return "unknown"
    if best is None:
        return "unknown"
    dev, mnt, fstype, opts = best
    text = f"{fstype} on {dev} (mounted at {mnt}, {opts})"
    cache = Path("/sys/block") / Path(dev).name / "queue" / "write_cache"
    with suppress(OSError):
        text += f"; device write cache: {cache.read_text().strip()}"
    return text


def code_digest() -> str:
    """sha256 (first 12 hex digits) of the storage engine's source, and its newest mtime:
    the store is under active work, so a result names the code it measured."""
    digest = hashlib.sha256()
    newest = 0.0
    for pkg in (orbitmq.common, orbitmq.store):
        for path in sorted(Path(next(iter(pkg.__path__))).glob("*.py")):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
            newest = max(newest, path.stat().st_mtime)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(newest))
    return f"orbitmq.store + orbitmq.common sha256 {digest.hexdigest()[:12]} (newest file {when})"


def _loadavg() -> str:
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "unknown"
    return f"{one:.2f} {five:.2f} {fifteen:.2f} (1/5/15 min)"


def machine_info(directory: Path) -> dict[str, str]:
    cpus = os.cpu_count() or 0
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = cpus
    return {
        "cpu": _cpu_model(),
        "cores": f"{cpus} (usable by this process: {usable})",
        "memory": _mem_total(),
        "os": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "store filesystem": filesystem_of(directory),
        "store dir": str(directory),
        "load average at start": _loadavg(),
        "store code": code_digest(),
    }


def measure_fsync_latency(directory: Path, samples: int = 200) -> dict[str, float]:
    """pwrite 4 KiB at the next offset of a preallocated file + fdatasync, as the CommitLog
    does per group commit. Returns milliseconds (p50, p90, p99, max, mean)."""
    path = directory / "fsync-probe"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    times: list[float] = []
    try:
        block = os.urandom(4096)
        os.posix_fallocate(fd, 0, 4096 * (samples + 1))
        os.fdatasync(fd)
        for i in range(samples):
            os.pwrite(fd, block, i * 4096)
            t0 = time.perf_counter()
            os.fdatasync(fd)
            times.append((time.perf_counter() - t0) * 1000)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    if not times:
        return {}
    times.sort()
    return {
        "p50": _pct(times, 50),
        "p90": _pct(times, 90),
        "p99": _pct(times, 99),
        "max": times[-1],
        "mean": statistics.fmean(times),
        "samples": len(times),
    }


def _pct(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return math.nan
    k = min(len(sorted_values) - 1, max(0, math.ceil(p / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


# ---------------------------------------------------------------------------- helpers


def _config(root: Path, flush: FlushDiskType, **overrides: Any) -> StoreConfig:
    # Production defaults (1 GiB segments, 300k-entry ConsumeQueue files, index on); only the
    # periodic retention run is pushed out of the way, since the bench dirs are short-lived.
    opts: dict[str, Any] = {"clean_resource_interval_ms": 3_600_000}
    opts.update(overrides)
    return StoreConfig(store_path=root, flush_disk_type=flush, **opts)


@contextmanager
def _case_dir(base: Path, name: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _batches(count: int, batch_size: int, body: bytes) -> list[MessageBatch]:
    out = []
    left = count
    while left > 0:
        n = min(batch_size, left)
        out.append(MessageBatch(TOPIC, 0, [body] * n, [b""] * n))
        left -= n
    return out


def _body(size: int) -> bytes:
    return os.urandom(size)


# ---------------------------------------------------------------------------- cases


def bench_append(root: Path, count: int, batch_size: int, body_size: int = BODY_SIZE) -> RunSample:
    """One appender thread, ASYNC_FLUSH: time ``put`` of ``count`` messages."""
    batches = _batches(count, batch_size, _body(body_size))
    store = MessageStore(_config(root, FlushDiskType.ASYNC_FLUSH))
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
    one message each through the broker's StoreBridge (one writer thread taking every queued
    append at once, one loop callback per fsync completing every send it covered)."""
    import asyncio

    from orbitmq.broker.store_bridge import StoreBridge

    body = _body(body_size)
    store = MessageStore(_config(root, FlushDiskType.SYNC_FLUSH))
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
            "put_p50_ms": round(_pct(lat, 50) * 1000, 3),
            "put_p99_ms": round(_pct(lat, 99) * 1000, 3),
        },
    )


def bench_sync(root: Path, count: int, threads: int, body_size: int = BODY_SIZE) -> RunSample:
    """SYNC_FLUSH, ``threads`` appenders each putting one-message batches until ``count``
    messages are stored in all; every put waits for its fsync (group commit)."""
    body = _body(body_size)
    per_thread = [count // threads + (1 if i < count % threads else 0) for i in range(threads)]
    store = MessageStore(_config(root, FlushDiskType.SYNC_FLUSH))
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
            "put_p50_ms": round(_pct(all_lat, 50) * 1000, 3),
            "put_p99_ms": round(_pct(all_lat, 99) * 1000, 3),
        },
    )


def _fill(store: MessageStore, count: int, body: bytes) -> int:
    """Append ``count`` messages in batches of 256; return one record's size."""
    size = 0
    for batch in _batches(count, 256, body):
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
    cfg = _config(root, FlushDiskType.ASYNC_FLUSH)

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
                    progress(_run_line(name, sample))

    store = MessageStore(cfg)
    store.open()
    try:
        t0 = time.perf_counter()
        rec_size = _fill(store, count, _body(body_size))
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


# ----------------------------------------------------------------- recovery (child + parent)

_CHILD_CODE = (
    "import sys; from orbitmq.bench.store import fill_child; "
    "fill_child(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))"
)


def fill_child(directory: str, target_bytes: int, min_new_bytes: int, segment_bytes: int) -> None:
    """Runs in the child: append until the CommitLog holds ``target_bytes`` (and at least
    ``min_new_bytes`` more than at start), print READY, keep appending until killed.
    Bounded: after READY at most 512 MiB more and 120 s, then exits by itself."""
    cfg = _config(
        Path(directory), FlushDiskType.ASYNC_FLUSH, mapped_file_size_commit_log=segment_bytes
    )
    store = MessageStore(cfg)
    store.open()
    batches = _batches(256, 256, _body(BODY_SIZE))
    batch = batches[0]
    cl = store.commit_log
    goal = max(target_bytes, cl.max_offset + min_new_bytes)
    while cl.max_offset < goal:
        store.put(batch)
    sys.stdout.write(f"READY {cl.max_offset} {store.dispatcher.reput_offset}\n")
    sys.stdout.flush()
    stop_at = cl.max_offset + 512 * MiB
    deadline = time.monotonic() + 120
    while cl.max_offset < stop_at and time.monotonic() < deadline:
        store.put(batch)
    while time.monotonic() < deadline:
        time.sleep(0.1)
    os._exit(3)  # never reached when the parent does its job


def _spawn_filler(
    directory: Path, target: int, min_new: int, segment_bytes: int, timeout_s: float, log: Path
) -> tuple[subprocess.Popen[bytes], int, int]:
    """Start the child and wait for READY; returns (process, end offset, dispatched offset)."""
    with open(log, "ab") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD_CODE, str(directory), str(target), str(min_new),
             str(segment_bytes)],
            stdout=subprocess.PIPE,
            stderr=err,
        )  # fmt: skip
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    line = b""
    try:
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"filler did not get ready within {timeout_s:.0f}s")
            ready, _, _ = select.select([proc.stdout], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(proc.stdout.fileno(), 256)
                if not chunk:
                    tail = log.read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"filler exited ({proc.wait()}) before READY: {tail}")
                line += chunk
        word, end, reput = line.decode().split()
        if word != "READY":
            raise RuntimeError(f"filler said {line!r}")
        return proc, int(end), int(reput)
    except BaseException:
        proc.kill()
        proc.wait()
        raise


def bench_recovery(
    root: Path,
    gib: float,
    runs: int,
    segment_bytes: int = 1 * GiB,
    tail_s: float = 0.5,
    progress: Progress | None = None,
) -> list[RunSample]:
    """Per run: a child appends until the CommitLog holds ``gib`` GiB (each later run adds at
    least 64 MiB more), keeps appending ``tail_s`` seconds, is SIGKILLed; then time open()."""
    target = int(gib * GiB)
    min_new = min(64 * MiB, max(1, target))
    timeout_s = max(120.0, gib * 120)
    log = root / "filler.log"
    data = root / "store"
    samples = []
    for i in range(runs):
        t0 = time.perf_counter()
        proc, end, reput = _spawn_filler(data, target, min_new, segment_bytes, timeout_s, log)
        fill_s = time.perf_counter() - t0
        try:
            time.sleep(tail_s)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        store = MessageStore(
            _config(data, FlushDiskType.ASYNC_FLUSH, mapped_file_size_commit_log=segment_bytes)
        )
        c1 = time.process_time()
        t1 = time.perf_counter()
        report = store.open()
        open_s = time.perf_counter() - t1
        open_cpu = time.process_time() - c1
        try:
            if report.clean:
                raise RuntimeError("open after SIGKILL reported a clean start")
            segments = len(store.commit_log.segments.segments)
        finally:
            store.close()
        sample = RunSample(
            report.records_scanned,
            report.end_offset - report.scanned_from,
            open_s,
            {
                "commit_log_gib": round(report.end_offset / GiB, 3),
                "segments": segments,
                "recover_s": round(report.duration_s, 4),
                "open_cpu_s": round(open_cpu, 4),
                "records_scanned": report.records_scanned,
                "redispatched": report.redispatched,
                "scanned_mib": round((report.end_offset - report.scanned_from) / MiB, 1),
                "bytes_cut": report.bytes_cut,
                "cuts": len(report.cuts),
                "cq_entries_dropped": report.consume_queue_entries_dropped,
                "problems": len(report.problems),
                "fill_s": round(fill_s, 1),
                "dispatch_lag_at_ready_mib": round((end - reput) / MiB, 1),
            },
        )
        samples.append(sample)
        if progress:
            progress(_run_line(f"recovery run {i + 1}/{runs}", sample, seconds=True))
    return samples


# ---------------------------------------------------------------------------- driver


def _run_line(name: str, s: RunSample, *, seconds: bool = False) -> str:
    head = (
        f"{name}: open() {s.seconds:.3f}s"
        if seconds
        else f"{name}: {s.msgs_per_s:,.0f} msgs/s, {s.mib_per_s:,.1f} MiB/s ({s.seconds:.3f}s)"
    )
    extra = ", ".join(f"{k}={v}" for k, v in s.extra.items())
    return f"{head} {extra}".rstrip()


DESCRIPTIONS = {
    "append-b1": "append, batch 1, ASYNC_FLUSH, 1 thread",
    "append-b32": "append, batch 32, ASYNC_FLUSH, 1 thread",
    "append-b256": "append, batch 256, ASYNC_FLUSH, 1 thread",
    "sync-t1": "put 1 msg, SYNC_FLUSH, 1 thread",
    "sync-t64": "put 1 msg, SYNC_FLUSH, 64 threads (group commit)",
    "sync-a64": "put 1 msg, SYNC_FLUSH, 64 asyncio appenders, one writer thread (as the broker)",
    "read-hot-m32": "sequential read, max_count 32, hot (no CRC)",
    "read-hot-m256": "sequential read, max_count 256, hot (no CRC)",
    "read-reopen-m32": "sequential read, max_count 32, after reopen (CRC)",
    "read-reopen-m256": "sequential read, max_count 256, after reopen (CRC)",
    "recovery": "MessageStore.open() after SIGKILL",
}


def run_store_bench(
    options: StoreBenchOptions, progress: Progress | None = None
) -> StoreBenchResults:
    """Run the selected cases and return their results (nothing is printed but ``progress``)."""
    selected = options.selected()
    began = time.perf_counter()
    started_at = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    made_base = False
    if options.directory is None:
        base_parent = Path.cwd() / ".bench-tmp"
        base_parent.mkdir(exist_ok=True)
        base = Path(tempfile.mkdtemp(prefix="store-", dir=base_parent))
        made_base = True
    else:
        base = options.directory
        base.mkdir(parents=True, exist_ok=True)
    cases: dict[str, CaseResult] = {
        name: CaseResult(
            name, DESCRIPTIONS[name], primary="seconds" if name == "recovery" else "msgs/s"
        )
        for name in selected
    }
    try:
        machine = machine_info(base)
        fsync_ms = (
            measure_fsync_latency(base, options.fsync_samples) if options.fsync_samples else {}
        )
        runners: list[tuple[dict[str, int], Callable[[Path, int, int, int], RunSample]]] = [
            (APPEND_CASES, bench_append),
            (SYNC_CASES, bench_sync),
            (ASYNC_SYNC_CASES, bench_sync_async),
        ]
        for table, bench in runners:
            for name, param in table.items():
                if name not in cases:
                    continue
                for i in range(options.runs):
                    with _case_dir(base, name) as d:
                        s = bench(d, options.messages_for(name), param, options.body_size)
                    cases[name].runs.append(s)
                    if progress:
                        progress(_run_line(f"{name} run {i + 1}/{options.runs}", s))
        wanted_reads = [c for c in READ_CASES if c in cases]
        if wanted_reads:
            with _case_dir(base, "read") as d:
                samples = bench_read(
                    d,
                    options.messages_for("read"),
                    wanted_reads,
                    options.runs,
                    options.body_size,
                    progress,
                )
            for name in wanted_reads:
                cases[name].runs = samples[name]
        if "recovery" in cases:
            with _case_dir(base, "recovery") as d:
                cases["recovery"].runs = bench_recovery(
                    d,
                    options.recovery_gib,
                    options.runs,
                    options.recovery_segment_bytes,
                    options.recovery_tail_s,
                    progress,
                )
    finally:
        if made_base:
            shutil.rmtree(base, ignore_errors=True)
            with suppress(OSError):
                base.parent.rmdir()  # only if nothing else is in .bench-tmp
    return StoreBenchResults(
        command=options.command,
        machine=machine,
        fsync_latency_ms=fsync_ms,
        cases=list(cases.values()),
        started_at=started_at,
        total_seconds=time.perf_counter() - began,
        load_at_end=_loadavg(),
    )


# ---------------------------------------------------------------------------- report


def _num(v: float, seconds: bool) -> str:
    if seconds:
        return f"{v:.3f} s"
    return f"{v:,.0f}"


def _notes(case: CaseResult) -> str:
    if not case.runs:
        return ""
    ex = [r.extra for r in case.runs]

    def med(key: str) -> float:
        vals = [e[key] for e in ex if e.get(key) is not None]
        return statistics.median(vals) if vals else math.nan

    cpu = f"CPU {med('cpu_us_per_msg'):.2f} us/msg; " if "cpu_us_per_msg" in ex[0] else ""
    if case.name.startswith("append"):
        return f"{cpu}dispatch catch-up after last append {med('dispatch_catch_up_s'):.2f} s"
    if case.name.startswith("sync"):
        return (
            f"{cpu}fsyncs {med('fsyncs'):,.0f} ({med('msgs_per_fsync'):,.1f} msgs/fsync); "
            f"put p50 {med('put_p50_ms'):.2f} ms, p99 {med('put_p99_ms'):.2f} ms"
        )
    if case.name.startswith("read"):
        crc = "CRC verified on read" if ex[0].get("crc_verified") else "CRC not re-checked"
        return f"{cpu}{crc}"
    if case.name == "recovery":
        return (
            f"CommitLog {med('commit_log_gib'):.2f} GiB; recover() {med('recover_s'):.3f} s; "
            f"scanned {med('records_scanned'):,.0f} records ({med('scanned_mib'):,.1f} MiB); "
            f"cut {med('bytes_cut'):,.0f} bytes"
        )
    return ""


def _cpu_rate(case: CaseResult) -> str:
    """Messages per CPU-second of the whole process (1e6 / median CPU us per message): an
    estimate of what one otherwise idle core would do, less sensitive to a noisy machine."""
    cpu = [r.extra["cpu_us_per_msg"] for r in case.runs if r.extra.get("cpu_us_per_msg")]
    return f"{1e6 / statistics.median(cpu):,.0f}" if cpu else ""


TABLE_HEADER = (
    "case", "what", "runs", "median", "min", "max", "unit", "MiB/s", "msgs/CPU-s", "target",
    "met",
)  # fmt: skip


def table_rows(results: StoreBenchResults) -> list[tuple[str, ...]]:
    """One row per case that ran, in :data:`TABLE_HEADER` order."""
    rows: list[tuple[str, ...]] = []
    for c in results.cases:
        if not c.runs:
            continue
        secs = c.primary == "seconds"
        vals = c.values()
        met = c.target_met
        rows.append(
            (
                c.name,
                c.description,
                str(len(c.runs)),
                _num(c.median, secs),
                _num(min(vals), secs),
                _num(max(vals), secs),
                "open() s" if secs else "msgs/s",
                "" if secs else f"{c.median_mib_per_s:,.1f}",
                "" if secs else _cpu_rate(c),
                c.target,
                "" if met is None else ("yes" if met else "NO"),
            )
        )
    return rows


def _fsync_line(results: StoreBenchResults) -> str:
    f = results.fsync_latency_ms
    if not f:
        return ""
    return (
        f"fdatasync after a 4 KiB pwrite ({f.get('samples', 0):.0f} samples): "
        f"p50 {f['p50']:.2f} ms, p90 {f['p90']:.2f} ms, p99 {f['p99']:.2f} ms, "
        f"max {f['max']:.2f} ms"
    )


def format_report(results: StoreBenchResults) -> str:
    """The plain-text report: machine, command, table, per-case notes."""
    lines = [
        "OrbitMQ storage benchmark",
        f"command: {results.command}",
        f"started: {results.started_at}",
    ]
    lines += [f"{k}: {v}" for k, v in results.machine.items()]
    if results.fsync_latency_ms:
        lines.append(_fsync_line(results))
    lines.append("")
    rows = [TABLE_HEADER, *table_rows(results)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_HEADER))]
    right = {2, 3, 4, 5, 7, 8}
    for r in rows:
        cells = [
            r[i].rjust(widths[i]) if i in right else r[i].ljust(widths[i]) for i in range(len(r))
        ]
        lines.append("  ".join(cells).rstrip())
    lines.append("")
    lines.append("notes (medians):")
    lines += [f"  {c.name}: {_notes(c)}" for c in results.cases if c.runs]
    rec = next((c for c in results.cases if c.name == "recovery" and c.runs), None)
    if rec is not None:
        lines.append("")
        lines.append("recovery runs:")
        for i, s in enumerate(rec.runs, 1):
            lines.append(
                f"  run {i}: "
                + ", ".join(f"{k}={v}" for k, v in s.extra.items())
                + f", open_s={s.seconds:.3f}"
            )
    lines.append("")
    lines.append(
        f"total time {results.total_seconds:.0f} s; load average at end {results.load_at_end}"
    )
    return "\n".join(lines)


def format_markdown(results: StoreBenchResults) -> str:
    """The same results as Markdown (for docs/benchmarks.md)."""
    lines = [f"Command: `{results.command}` (started {results.started_at}, took "
             f"{results.total_seconds:.0f} s)", ""]  # fmt: skip
    lines += [f"- {k}: {v}" for k, v in results.machine.items()]
    lines.append(f"- load average at end: {results.load_at_end}")
    if results.fsync_latency_ms:
        lines.append(f"- {_fsync_line(results)}")
    lines.append("")
    right = {2, 3, 4, 5, 7, 8}
    lines.append("| " + " | ".join(TABLE_HEADER) + " | notes (medians) |")
    lines.append(
        "|" + "|".join("---:" if i in right else "---" for i in range(len(TABLE_HEADER))) + "|---|"
    )
    notes = {c.name: _notes(c) for c in results.cases if c.runs}
    for r in table_rows(results):
        met = f"**{r[10]}**" if r[10] == "NO" else r[10]
        lines.append("| " + " | ".join((*r[:10], met, notes[r[0]])) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- CLI glue


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--count", type=int, default=None,
        help="messages per run for every case (default: 20k append-b1, 200k append-b32/b256, "
        "2k sync-t1, 64k sync-t64, 1M read)",
    )  # fmt: skip
    parser.add_argument("--read-count", type=int, default=None, help="messages for the read cases")
    parser.add_argument("--runs", type=int, default=3, help="runs per case (default 3)")
    parser.add_argument(
        "--dir", type=Path, default=None,
        help="where to put the stores (default: a temp dir under ./.bench-tmp)",
    )  # fmt: skip
    parser.add_argument(
        "--only", action="append", default=[],
        help=f"cases or prefixes, comma-separated, repeatable: {', '.join(ALL_CASES)}",
    )  # fmt: skip
    parser.add_argument(
        "--recovery-gib", type=float, default=2.0, help="CommitLog size before SIGKILL (default 2)"
    )
    parser.add_argument(
        "--recovery-segment-mib", type=int, default=1024,
        help="CommitLog segment size for the recovery case (default 1024 = production)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument(
        "--markdown", type=Path, default=None, help="also write a Markdown table here"
    )


def options_from_args(ns: argparse.Namespace, command: str = "") -> StoreBenchOptions:
    only = tuple(t.strip() for arg in ns.only for t in arg.split(",") if t.strip())
    if ns.runs < 1:
        raise ValueError("--runs must be at least 1")
    for flag, value in (("--count", ns.count), ("--read-count", ns.read_count)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be at least 1")
    if ns.recovery_gib <= 0 or ns.recovery_segment_mib < 1:
        raise ValueError("--recovery-gib and --recovery-segment-mib must be positive")
    opts = StoreBenchOptions(
        runs=ns.runs,
        count=ns.count,
        read_count=ns.read_count,
        directory=ns.dir,
        only=only,
        recovery_gib=ns.recovery_gib,
        recovery_segment_bytes=ns.recovery_segment_mib * MiB,
        command=command,
    )
    opts.selected()  # validates --only
    return opts


def main(argv: list[str], command: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog="orbitmq bench store", description=__doc__.split("\n")[0])
    add_arguments(parser)
    ns = parser.parse_args(argv)
    cmd = command or shlex.join([sys.executable, "-m", "orbitmq.bench", "store", *argv])
    try:
        options = options_from_args(ns, cmd)
    except ValueError as exc:
        parser.error(str(exc))

    def progress(line: str) -> None:
        print(f"  {line}", file=sys.stderr, flush=True)

    results = run_store_bench(options, progress)
    print(format_report(results))
    if ns.json is not None:
        ns.json.write_text(json.dumps(results.to_json(), indent=2, default=str) + "\n")
    if ns.markdown is not None:
        ns.markdown.write_text(format_markdown(results))
    return 0

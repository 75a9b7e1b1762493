"""The recovery case: a child process fills a CommitLog with ASYNC_FLUSH, keeps appending
and is SIGKILLed; the parent times ``MessageStore.open()`` on what it left.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from orbitmq.bench.store.cases import make_batches, make_body, store_config
from orbitmq.bench.store.model import BODY_SIZE, Progress, RunSample, run_line
from orbitmq.store.config import FlushDiskType, GiB, MiB
from orbitmq.store.message_store import MessageStore

_CHILD_CODE = (
    "import sys; from orbitmq.bench.store.recovery import fill_child; "
    "fill_child(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))"
)


def fill_child(directory: str, target_bytes: int, min_new_bytes: int, segment_bytes: int) -> None:
    """Runs in the child: append until the CommitLog holds ``target_bytes`` (and at least
    ``min_new_bytes`` more than at start), print READY, keep appending until killed.
    Bounded: after READY at most 512 MiB more and 120 s, then exits by itself."""
    cfg = store_config(
        Path(directory), FlushDiskType.ASYNC_FLUSH, mapped_file_size_commit_log=segment_bytes
    )
    store = MessageStore(cfg)
    store.open()
    batches = make_batches(256, 256, make_body(BODY_SIZE))
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
            store_config(data, FlushDiskType.ASYNC_FLUSH, mapped_file_size_commit_log=segment_bytes)
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
            progress(run_line(f"recovery run {i + 1}/{runs}", sample, seconds=True))
    return samples

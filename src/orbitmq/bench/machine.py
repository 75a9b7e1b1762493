"""What a benchmark report says about the machine: CPU model, memory, load average, the
filesystem under a folder, a digest of the code measured, and fsync latency there. Shared by
every ``orbitmq bench`` command, so their reports describe a machine the same way.
"""

from __future__ import annotations

import hashlib
import math
import os
import platform
import statistics
import time
from contextlib import suppress
from pathlib import Path

import orbitmq.common
import orbitmq.store


def cpu_model() -> str:
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


def loadavg() -> str:
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
        "cpu": cpu_model(),
        "cores": f"{cpus} (usable by this process: {usable})",
        "memory": _mem_total(),
        "os": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "store filesystem": filesystem_of(directory),
        "store dir": str(directory),
        "load average at start": loadavg(),
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
        "p50": percentile(times, 50),
        "p90": percentile(times, 90),
        "p99": percentile(times, 99),
        "max": times[-1],
        "mean": statistics.fmean(times),
        "samples": len(times),
    }


def percentile(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return math.nan
    k = min(len(sorted_values) - 1, max(0, math.ceil(p / 100 * len(sorted_values)) - 1))
    return sorted_values[k]

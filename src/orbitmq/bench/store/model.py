"""The store benchmark's cases, defaults and targets, its options and its results
(:class:`StoreBenchOptions`, :class:`RunSample`, :class:`CaseResult`, :class:`StoreBenchResults`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orbitmq.store.config import GiB, MiB

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


def run_line(name: str, s: RunSample, *, seconds: bool = False) -> str:
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
    "sync-a64": "put 1 msg, SYNC_FLUSH, 64 asyncio appenders through the broker's StoreBridge",
    "read-hot-m32": "sequential read, max_count 32, hot (no CRC)",
    "read-hot-m256": "sequential read, max_count 256, hot (no CRC)",
    "read-reopen-m32": "sequential read, max_count 32, after reopen (CRC)",
    "read-reopen-m256": "sequential read, max_count 256, after reopen (CRC)",
    "recovery": "MessageStore.open() after SIGKILL",
}

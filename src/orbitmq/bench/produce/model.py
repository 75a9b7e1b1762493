"""The producer benchmark's defaults, options and results (:class:`ProduceBenchOptions`,
:class:`WorkerResult`, :class:`ProduceBenchResult`), the latency histogram they share and the
:class:`Recorder` every producer (async or blocking) counts its answers with.
"""

from __future__ import annotations

import array
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from hdrh.histogram import HdrHistogram

MODES = ("async", "sync", "oneway")
APIS = ("async", "blocking")
"""Which client sends: AsyncProducer on an event loop, or the blocking Producer from a thread."""
DEFAULT_TOPIC = "BenchProduce"
DEFAULT_COUNT = 100_000
DEFAULT_QUEUES = 8
HIST_MAX_US = 60_000_000
PERCENTILES = (50.0, 90.0, 99.0, 99.9)
MAX_ERRORS = 1000
"""A producer stops sending after this many failed sends (the report says so)."""
STARTUP_TIMEOUT_S = 60.0
STORED_WAIT_S = 3.0

Progress = Callable[[str], None]


# ---------------------------------------------------------------------------- options/results


@dataclass(slots=True)
class ProduceBenchOptions:
    namesrv: str = "127.0.0.1:9876"
    topic: str = DEFAULT_TOPIC
    producers: int = 1
    size: int = 1024
    count: int | None = None
    """Messages over all producers (default DEFAULT_COUNT unless duration_s is set)."""
    duration_s: float | None = None
    batch: int = 0
    """Explicit send_batch size; 0 relies on the producer's automatic batching."""
    mode: str = "async"
    queues: int | None = None
    cluster: str | None = None
    rate: float = 0.0
    """Target msgs/s over all producers (0: as fast as possible)."""
    window: int = 16_384
    """async: unanswered messages per producer at most (api async; the blocking Producer keeps
    its own bound, max_buffered_bytes)."""
    api: str = "async"
    command: str = ""

    def validate(self) -> None:
        problems = []
        if self.mode not in MODES:
            problems.append(f"mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.api not in APIS:
            problems.append(f"api {self.api!r} is not one of {', '.join(APIS)}")
        if self.api == "blocking" and self.batch and self.mode != "sync":
            problems.append("api blocking: --batch only with --mode sync")
        if self.producers < 1:
            problems.append("producers must be at least 1")
        if self.size < 1:
            problems.append("size must be at least 1 byte")
        if self.count is not None and self.duration_s is not None:
            problems.append("give count or duration, not both")
        if self.count is not None and self.count < self.producers:
            problems.append("count must be at least the number of producers")
        if self.duration_s is not None and self.duration_s <= 0:
            problems.append("duration must be positive")
        if self.batch < 0:
            problems.append("batch must be 0 (automatic) or more")
        if self.batch and self.mode == "oneway":
            problems.append("oneway sends one message at a time: no --batch")
        if self.queues is not None and self.queues < 1:
            problems.append("queues must be at least 1")
        if self.rate < 0 or self.window < 1:
            problems.append("rate must be >= 0 and window >= 1")
        if problems:
            raise ValueError("; ".join(problems))

    def share(self, index: int) -> int | None:
        """Messages producer ``index`` sends (None: until the duration is over)."""
        if self.duration_s is not None:
            return None
        total = self.count if self.count is not None else DEFAULT_COUNT
        base, extra = divmod(total, self.producers)
        return base + (1 if index < extra else 0)


@dataclass(slots=True)
class WorkerResult:
    index: int
    messages: int
    errors: int
    seconds: float
    warmup: int
    first_error: str | None = None
    histogram: str = ""
    """HdrHistogram.encode() of the latencies in microseconds (ASCII)."""
    cpu_s: float = 0.0
    """CPU time of the producer's process while it sent (all its threads)."""


@dataclass(slots=True)
class ProduceBenchResult:
    options: ProduceBenchOptions
    messages: int
    errors: int
    seconds: float
    latency_ms: dict[str, float]
    flush_types: dict[str, str]
    """broker name -> ASYNC_FLUSH / SYNC_FLUSH."""
    stored: int | None
    """How much the topic's queues grew during the run, warm-up included (None: unknown)."""
    warmup: int
    workers: list[WorkerResult]
    started_at: str
    machine: dict[str, str] = field(default_factory=dict)
    first_error: str | None = None

    @property
    def body_bytes(self) -> int:
        return self.messages * self.options.size

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    @property
    def client_cpu_us_per_msg(self) -> float:
        """The producers' CPU time per message answered, in microseconds."""
        cpu = sum(w.cpu_s for w in self.workers)
        return cpu * 1e6 / self.messages if self.messages else 0.0

    @property
    def mib_per_s(self) -> float:
        return self.body_bytes / 1024 / 1024 / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for w in data["workers"]:
            w.pop("histogram", None)
        data.update(
            msgs_per_s=self.msgs_per_s,
            mib_per_s=self.mib_per_s,
            client_cpu_us_per_msg=self.client_cpu_us_per_msg,
        )
        return data


def new_histogram() -> HdrHistogram:
    return HdrHistogram(1, HIST_MAX_US, 3)


class Recorder:
    """Counts answers and keeps latencies; cheap per message (an append), binned afterwards.

    Latencies (ns) go to an array and into the histogram in bulk (numpy) when the run is over,
    or every SPILL_EVERY samples, so measuring costs the sender little.
    """

    SPILL_EVERY = 4_000_000

    def __init__(self) -> None:
        self.hist = new_histogram()
        self.samples = array.array("q")
        self.ok = 0
        self.errors = 0
        self.first_error: str | None = None

    def success(self, started_ns: int, n: int = 1) -> None:
        if n == 1:
            self.samples.append(time.perf_counter_ns() - started_ns)
            if len(self.samples) >= self.SPILL_EVERY:
                self.spill()
        else:
            us = (time.perf_counter_ns() - started_ns) // 1000
            self.hist.record_value(min(max(us, 1), HIST_MAX_US), n)
        self.ok += n

    def spill(self) -> None:
        """Move the kept samples into the histogram."""
        if not self.samples:
            return
        us = np.clip(np.frombuffer(self.samples, dtype=np.int64) // 1000, 1, HIST_MAX_US)
        values, counts = np.unique(us, return_counts=True)
        for v, c in zip(values.tolist(), counts.tolist(), strict=True):
            self.hist.record_value(v, c)
        self.samples = array.array("q")

    def failure(self, exc: BaseException, n: int = 1) -> None:
        self.errors += n
        if self.first_error is None:
            self.first_error = f"{type(exc).__name__}: {exc}"

    @property
    def give_up(self) -> bool:
        return self.errors >= MAX_ERRORS

"""The gRPC benchmark's workload constants, targets, options and results
(:class:`GrpcBenchOptions`, :class:`SideResult`, :class:`GrpcBenchResult`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from orbitmq.bench.grpc_floor import FloorResult

DEFAULT_TOPIC = "BenchGrpc"
DEFAULT_THREADS = 16
DEFAULT_COUNT = 10_000
DEFAULT_RUNS = 3
DEFAULT_RECEIVE_THREADS = 4
QUEUES = 8
RECEIVE_BATCH = 32
INVISIBLE_S = 60
AWAIT_S = 1
"""Long polling of a receive: short, so priming a group and the end of a run cost little."""
WARMUP_PER_THREAD = 20
RECEIVE_TIMEOUT_S = 120.0
ROUTE_WAIT_S = 30.0
"""How long a new topic may take to show up in the NameServer (the broker registers every few s)."""
WORKER_TIMEOUT_S = 900.0
PROXY_READY = "orbitmq proxy ready "
TARGET_P50_OVERHEAD_MS = 1.0
TARGET_GRPC_SENDS_PER_S = 5000.0

Say = Callable[[str], None]


@dataclass(slots=True)
class GrpcBenchOptions:
    namesrv: str | None = None
    """A running cluster's NameServer (with ``proxy``); None: start one."""
    proxy: str | None = None
    """The gRPC proxy endpoint host:port (with ``namesrv``)."""
    topic: str = DEFAULT_TOPIC
    threads: int = DEFAULT_THREADS
    count: int = DEFAULT_COUNT
    """Messages each side sends (and receives) per run."""
    size: int = 1024
    receive_threads: int = DEFAULT_RECEIVE_THREADS
    runs: int = DEFAULT_RUNS
    receive: bool = True
    proxy_tls: str = "permissive"
    """TLS mode of the proxy the benchmark starts (``off`` measures gRPC on the port itself,
    without the TLS/plaintext splice)."""
    floor: bool = True
    """Also measure a bare Python gRPC echo server with the same threads (the floor under any
    Python proxy; :mod:`orbitmq.bench.grpc_floor`)."""
    command: str = ""

    def validate(self) -> None:
        problems = []
        if (self.namesrv is None) != (self.proxy is None):
            problems.append("give both --namesrv and --proxy, or neither (then both are started)")
        if self.threads < 1 or self.receive_threads < 1:
            problems.append("threads and receive threads must be at least 1")
        if self.count < self.threads:
            problems.append("count must be at least the number of threads")
        if not 1 <= self.size <= 4 * 1024 * 1024:
            problems.append("size must be 1 byte .. 4 MiB")
        if self.runs < 1:
            problems.append("runs must be at least 1")
        if self.proxy_tls not in ("off", "permissive"):
            problems.append("--proxy-tls must be off or permissive (the client speaks plaintext)")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(slots=True)
class SideResult:
    """One side (``grpc`` or ``native``) of one run."""

    side: str
    sent: int
    send_errors: int
    send_seconds: float
    send_ms: dict[str, float]
    received: int = 0
    receive_seconds: float = 0.0
    receive_call_ms: dict[str, float] = field(default_factory=dict)
    receive_errors: int = 0
    first_error: str | None = None
    client_cpu_ms_per_send: float = 0.0
    """CPU time of the client process over the send phase, per message sent (all threads)."""
    proxy_cpu_ms_per_msg: float | None = None
    """grpc side, proxy started by the benchmark: the proxy's CPU time over the whole side
    (sends, receives, acks) per message sent. Tells where time goes on a busy machine."""

    @property
    def send_msgs_per_s(self) -> float:
        return self.sent / self.send_seconds if self.send_seconds > 0 else 0.0

    @property
    def receive_msgs_per_s(self) -> float:
        return self.received / self.receive_seconds if self.receive_seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            send_msgs_per_s=self.send_msgs_per_s, receive_msgs_per_s=self.receive_msgs_per_s
        )
        return data


@dataclass(slots=True)
class GrpcBenchResult:
    options: GrpcBenchOptions
    runs: list[dict[str, SideResult]]
    started_at: str
    machine: dict[str, str]
    client_version: str
    floor: FloorResult | None = None

    def median(self, side: str, metric: Callable[[SideResult], float]) -> float:
        return statistics.median(metric(run[side]) for run in self.runs)

    @property
    def p50_overhead_ms(self) -> float:
        """Median over runs of (official client via proxy p50) - (native p50)."""
        return statistics.median(
            run["grpc"].send_ms["p50"] - run["native"].send_ms["p50"] for run in self.runs
        )

    def to_json(self) -> dict[str, Any]:
        medians = {
            side: {
                "send_msgs_per_s": self.median(side, lambda r: r.send_msgs_per_s),
                "send_p50_ms": self.median(side, lambda r: r.send_ms["p50"]),
                "send_p99_ms": self.median(side, lambda r: r.send_ms["p99"]),
                "receive_msgs_per_s": self.median(side, lambda r: r.receive_msgs_per_s),
            }
            for side in ("grpc", "native")
        }
        return {
            "options": asdict(self.options),
            "started_at": self.started_at,
            "machine": self.machine,
            "client_version": self.client_version,
            "runs": [{side: r.to_json() for side, r in run.items()} for run in self.runs],
            "medians": medians,
            "p50_overhead_ms": self.p50_overhead_ms,
            "bare_grpc_floor": None if self.floor is None else self.floor.to_json(),
            "targets": {
                "p50_overhead_ms_below": TARGET_P50_OVERHEAD_MS,
                "grpc_sends_per_s_at_least": TARGET_GRPC_SENDS_PER_S,
                "p50_overhead_met": self.p50_overhead_ms < TARGET_P50_OVERHEAD_MS,
                "grpc_sends_met": medians["grpc"]["send_msgs_per_s"] >= TARGET_GRPC_SENDS_PER_S,
            },
        }


def percentiles(samples_ms: list[float]) -> dict[str, float]:
    if not samples_ms:
        return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0, "mean": 0.0}
    arr = np.asarray(samples_ms, dtype=np.float64)
    p50, p90, p99 = np.percentile(arr, [50, 90, 99]).tolist()
    return {"p50": p50, "p90": p90, "p99": p99, "max": float(arr.max()), "mean": float(arr.mean())}

"""``orbitmq bench proxy`` (also ``python -m orbitmq.bench proxy``): the gRPC proxy's SendMessage
against a bare ``grpc.aio`` echo, driven the same way in the same run (issue #15).

What it starts, on 127.0.0.1 free ports, and stops by pid at the end: a NameServer + Broker
(``orbitmq up``, unless ``--namesrv`` names a running cluster), the proxy (``orbitmq proxy
--tls off``, ``--workers`` processes on one port) and the echo server
(:mod:`orbitmq.bench.proxy_load`). Then ``runs`` times, echo first then proxy, it runs the
asyncio load generator of :mod:`.proxy_load` against each (a fresh process each time, same
requests, ``inflight`` calls open at once) and reads the server processes' CPU around each
drive. It reports calls/s, p50 and p99 per side, the proxy's share of the echo's calls/s and the
p50 the proxy adds, each as the median over runs, beside the targets: share >= 60 %, added p50
<= 0.5 ms. The official client's compatibility run stays ``orbitmq bench grpc``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orbitmq.bench._child import ServerChild, process_cpu_s
from orbitmq.bench.cluster import prepare_topics, target_cluster
from orbitmq.bench.machine import cpu_model, loadavg
from orbitmq.bench.proxy_load import ECHO_READY
from orbitmq.common.errors import ClientError, MQError

__all__ = [
    "ProxyBenchOptions",
    "ProxyBenchResult",
    "SideRun",
    "format_report",
    "main",
    "run_proxy_bench",
]

TARGET_SHARE = 0.60
TARGET_TLS_SHARE = 0.70
"""Issue #16: TLS throughput >= 70 % of plaintext."""
TLS_CHOICES = ("off", "permissive", "required")
TARGET_ADDED_P50_MS = 0.5
PROXY_READY = "orbitmq proxy ready "
QUEUES = 8
DRIVE_TIMEOUT_S = 600.0
ROUTE_WAIT_S = 15.0

Say = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class ProxyBenchOptions:
    count: int = 10_000
    inflight: int = 32
    size: int = 1024
    runs: int = 3
    workers: int = 1
    topic: str = "BenchProxy"
    namesrv: str | None = None
    command: str = ""
    tls: str = "off"
    """off: echo and the plaintext proxy. permissive or required: also a second proxy in that
    TLS mode (the bench's own certificate), driven over TLS in the same runs."""

    def validate(self) -> None:
        if self.count < 1 or self.inflight < 1 or self.size < 1 or self.runs < 1:
            raise ValueError("count, inflight, size and runs must be at least 1")
        if self.workers < 1:
            raise ValueError("workers must be at least 1")
        if self.count < self.inflight:
            raise ValueError(f"count must be at least inflight ({self.inflight})")
        if self.tls not in TLS_CHOICES:
            raise ValueError(f"tls must be one of {', '.join(TLS_CHOICES)}")


@dataclass(slots=True)
class SideRun:
    """One drive of one server."""

    calls: int
    answered: int
    errors: int
    seconds: float
    p50_ms: float
    p99_ms: float
    client_cpu_s: float
    server_cpu_s: float | None
    first_error: str | None = None

    @property
    def calls_per_s(self) -> float:
        return self.answered / self.seconds if self.seconds > 0 else 0.0

    @property
    def server_cpu_ms_per_call(self) -> float | None:
        if self.server_cpu_s is None or not self.answered:
            return None
        return self.server_cpu_s * 1000.0 / self.answered

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "calls_per_s": self.calls_per_s,
            "server_cpu_ms_per_call": self.server_cpu_ms_per_call,
        }


@dataclass(slots=True)
class ProxyBenchResult:
    options: ProxyBenchOptions
    runs: list[dict[str, SideRun]] = field(default_factory=list)
    machine: dict[str, str] = field(default_factory=dict)

    def median(self, side: str, what: str) -> float:
        return statistics.median(float(getattr(run[side], what)) for run in self.runs)

    @property
    def share(self) -> float:
        """Median over runs of proxy calls/s / echo calls/s (same run)."""
        return statistics.median(
            run["proxy"].calls_per_s / run["echo"].calls_per_s if run["echo"].calls_per_s else 0.0
            for run in self.runs
        )

    @property
    def tls_share(self) -> float | None:
        """Median over runs of TLS proxy calls/s / plaintext proxy calls/s (same run); None
        without ``--tls``."""
        if not self.runs or "proxy_tls" not in self.runs[0]:
            return None
        return statistics.median(
            run["proxy_tls"].calls_per_s / run["proxy"].calls_per_s
            if run["proxy"].calls_per_s
            else 0.0
            for run in self.runs
        )

    @property
    def added_p50_ms(self) -> float:
        """Median over runs of proxy p50 - echo p50 (same run)."""
        return statistics.median(run["proxy"].p50_ms - run["echo"].p50_ms for run in self.runs)

    @property
    def errors(self) -> int:
        return sum(
            r.errors + (r.calls - r.answered - r.errors) for run in self.runs for r in run.values()
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "options": asdict(self.options),
            "machine": self.machine,
            "runs": [{k: v.to_json() for k, v in run.items()} for run in self.runs],
            "share_of_echo": self.share,
            "added_p50_ms": self.added_p50_ms,
            "tls_share_of_plaintext": self.tls_share,
            "targets": {
                "share_met": self.share >= TARGET_SHARE,
                "added_p50_met": self.added_p50_ms <= TARGET_ADDED_P50_MS,
            },
        }


def _prepare_topic(namesrv: str, topic: str) -> None:
    prepare_topics(namesrv, [topic], queues=QUEUES, wait_s=ROUTE_WAIT_S)


@dataclass(frozen=True, slots=True)
class Target:
    """A server the generator drives: its address, pid, and the CA to trust (TLS) or None."""

    address: str
    pid: int
    tls_ca: str | None = None


def _proxy_child(namesrv: str, options: ProxyBenchOptions, log: Path, *tls: str) -> ServerChild:
    return ServerChild(
        [
            "orbitmq", "proxy", "--namesrv", namesrv, "--host", "127.0.0.1",
            "--port", "0", *(tls or ("--tls", "off")), "--log-level", "WARNING",
            *(["--workers", str(options.workers)] if options.workers > 1 else []),
        ],
        log,
        PROXY_READY,
    )  # fmt: skip


@contextlib.contextmanager
def _servers(options: ProxyBenchOptions, say: Say) -> Iterator[dict[str, Target]]:
    """The sides to drive: echo, proxy, and proxy_tls with ``--tls``."""
    scratch = Path(tempfile.mkdtemp(prefix="orbitmq-bench-proxy-"))
    failed = True
    try:
        with target_cluster(options.namesrv, None, say) as cluster:
            _prepare_topic(cluster.namesrv, options.topic)
            children = {
                "echo": ServerChild(
                    ["orbitmq.bench.proxy_load", "--echo", "127.0.0.1"],
                    scratch / "echo.log",
                    ECHO_READY,
                ),
                "proxy": _proxy_child(cluster.namesrv, options, scratch / "proxy.log"),
            }
            ca: str | None = None
            if options.tls != "off":
                from orbitmq.proxy.tls import self_signed

                ident = self_signed(["127.0.0.1", "localhost"])
                cert, key = scratch / "proxy-cert.pem", scratch / "proxy-key.pem"
                cert.write_bytes(ident.cert_pem)
                key.write_bytes(ident.key_pem)
                key.chmod(0o600)
                ca = str(cert)
                children["proxy_tls"] = _proxy_child(
                    cluster.namesrv, options, scratch / "proxy-tls.log",
                    "--tls", options.tls, "--tls-cert", str(cert), "--tls-key", str(key),
                )  # fmt: skip
            try:
                targets: dict[str, Target] = {}
                for side, child in children.items():
                    address = child.start().split()[0].removeprefix("proxy=")
                    assert child.proc is not None
                    targets[side] = Target(
                        address, child.proc.pid, ca if side == "proxy_tls" else None
                    )
                say(
                    ", ".join(f"{side} {t.address}" for side, t in targets.items())
                    + f" ({options.workers} proxy process(es) each)"
                )
                yield targets
                failed = False
            finally:
                for child in reversed(children.values()):
                    child.stop(30.0)
    finally:
        if not failed:
            shutil.rmtree(scratch, ignore_errors=True)


def _tree_cpu_s(pid: int) -> float | None:
    """CPU of ``pid`` and its live children (proxy workers), seconds."""
    total = process_cpu_s(pid)
    if total is None:
        return None
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        kids = []
    for kid in kids:
        total += process_cpu_s(int(kid)) or 0.0
    return total


def drive(
    address: str, options: ProxyBenchOptions, server_pid: int | None, tls_ca: str | None = None
) -> SideRun:
    """One load-generator process against ``address`` (over TLS trusting ``tls_ca`` when
    given); the server's CPU read around it."""
    args = [
        sys.executable, "-m", "orbitmq.bench.proxy_load", "--drive", address,
        "--count", str(options.count), "--inflight", str(options.inflight),
        "--size", str(options.size), "--topic", options.topic,
        *(["--tls-ca", tls_ca] if tls_ca else []),
    ]  # fmt: skip
    cpu0 = _tree_cpu_s(server_pid) if server_pid else None
    done = subprocess.run(
        args, capture_output=True, text=True, timeout=DRIVE_TIMEOUT_S, check=False
    )
    cpu1 = _tree_cpu_s(server_pid) if server_pid else None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise ClientError(f"the load generator failed ({done.returncode}): {done.stderr[-2000:]}")
    data = json.loads(lines[-1])
    # The server's CPU includes the generator's warm-up: small beside a measured run.
    server_cpu = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
    return SideRun(
        calls=data["calls"],
        answered=data["answered"],
        errors=data["errors"],
        seconds=data["seconds"],
        p50_ms=data["p50_ms"],
        p99_ms=data["p99_ms"],
        client_cpu_s=data["client_cpu_s"],
        server_cpu_s=server_cpu,
        first_error=data["first_error"],
    )


def run_proxy_bench(options: ProxyBenchOptions, progress: Say | None = None) -> ProxyBenchResult:
    options.validate()
    say: Say = progress or (lambda _line: None)
    result = ProxyBenchResult(
        options,
        machine={"cpu": cpu_model(), "cpus": str(os.cpu_count()), "load": loadavg()},
    )
    with _servers(options, say) as targets:
        for i in range(1, options.runs + 1):
            run: dict[str, SideRun] = {}
            for side, t in targets.items():
                say(f"run {i}/{options.runs}: {side}")
                run[side] = drive(t.address, options, t.pid, t.tls_ca)
            result.runs.append(run)
    return result


def format_report(result: ProxyBenchResult) -> str:
    o = result.options
    m = result.machine
    lines = [
        "OrbitMQ gRPC proxy vs bare grpc.aio echo: SendMessage, asyncio generator "
        f"({o.inflight} calls in flight), {o.size} B bodies, {o.count:,} calls per side per run, "
        f"{o.runs} run(s), proxy workers {o.workers}",
        *([f"command: {o.command}"] if o.command else []),
        f"machine: {m.get('cpu')}, {m.get('cpus')} cpus, load {m.get('load')}",
        "",
        f"{'run':<5}{'side':<10}{'calls/s':>10}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'server CPU ms/call':>20}{'client CPU ms/call':>20}{'errors':>8}",
    ]
    sides = list(result.runs[0]) if result.runs else ["echo", "proxy"]
    for i, run in enumerate(result.runs, start=1):
        for side in sides:
            r = run[side]
            cpu = r.server_cpu_ms_per_call
            client = r.client_cpu_s * 1000 / r.answered if r.answered else 0.0
            lines.append(
                f"{i:<5}{side:<10}{r.calls_per_s:>10,.0f}{r.p50_ms:>9.3f}{r.p99_ms:>9.3f}"
                f"{(f'{cpu:.3f}' if cpu is not None else '-'):>20}{client:>20.3f}{r.errors:>8}"
            )
    lines.extend(
        f"median {side:<9}{result.median(side, 'calls_per_s'):>9,.0f}"
        f"{result.median(side, 'p50_ms'):>9.3f}{result.median(side, 'p99_ms'):>9.3f}"
        for side in sides
    )
    share, added = result.share, result.added_p50_ms
    lines += [
        "",
        f"proxy / echo calls/s: {share:.1%} (target >= {TARGET_SHARE:.0%}: "
        f"{'met' if share >= TARGET_SHARE else 'MISSED'}); added p50 {added:.3f} ms "
        f"(target <= {TARGET_ADDED_P50_MS} ms: {'met' if added <= TARGET_ADDED_P50_MS else 'MISSED'})",
    ]
    tls = result.tls_share
    if tls is not None:
        lines.append(
            f"proxy TLS ({o.tls}) / proxy plaintext calls/s: {tls:.1%} (target >= "
            f"{TARGET_TLS_SHARE:.0%}: {'met' if tls >= TARGET_TLS_SHARE else 'MISSED'})"
        )
    errors = [r.first_error for run in result.runs for r in run.values() if r.first_error]
    if errors:
        lines.append(f"first error: {errors[0]}")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m orbitmq.bench proxy", description=__doc__)
    d = ProxyBenchOptions()
    ap.add_argument("--count", type=int, default=d.count, help="calls per side per run")
    ap.add_argument("--inflight", type=int, default=d.inflight, help="calls open at once")
    ap.add_argument("--size", type=int, default=d.size, help="body bytes")
    ap.add_argument("--runs", type=int, default=d.runs)
    ap.add_argument("--workers", type=int, default=d.workers, help="proxy processes, one port")
    ap.add_argument("--topic", default=d.topic)
    ap.add_argument("--namesrv", "-n", default=None, help="a running cluster (default: start one)")
    ap.add_argument("--json", type=Path, default=None, help="also write the result here")
    ap.add_argument(
        "--tls",
        choices=TLS_CHOICES,
        default=d.tls,
        help="also drive a proxy in this TLS mode over TLS, beside the plaintext one",
    )
    return ap


def main(argv: list[str], command: str) -> int:
    args = parser().parse_args(argv)
    options = ProxyBenchOptions(
        count=args.count, inflight=args.inflight, size=args.size, runs=args.runs,
        workers=args.workers, topic=args.topic, namesrv=args.namesrv, command=command,
        tls=args.tls,
    )  # fmt: skip
    try:
        options.validate()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        result = run_proxy_bench(options, lambda line: print(line, file=sys.stderr))
    except MQError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(format_report(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result.to_json(), indent=2) + "\n")
    return 1 if result.errors else 0

"""Running the gRPC benchmark: the servers it measures (:func:`target`, started here when not
given), :func:`run_grpc_bench` (the sides one after the other, ``runs`` times) and
:func:`format_report`.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import shutil
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path

from orbitmq.bench._child import ServerChild, process_cpu_s
from orbitmq.bench.cluster import prepare_topics, target_cluster
from orbitmq.bench.grpc.model import (
    PROXY_READY,
    QUEUES,
    RECEIVE_BATCH,
    ROUTE_WAIT_S,
    TARGET_GRPC_SENDS_PER_S,
    TARGET_P50_OVERHEAD_MS,
    GrpcBenchOptions,
    GrpcBenchResult,
    Say,
    SideResult,
)
from orbitmq.bench.grpc.sides import client_version, run_native_side, run_official_side
from orbitmq.bench.grpc_floor import run_floor
from orbitmq.bench.machine import cpu_model, loadavg
from orbitmq.common.clock import now_ms


@contextlib.contextmanager
def target(options: GrpcBenchOptions, say: Say) -> Iterator[tuple[str, str, Path, int | None]]:
    """(namesrv, proxy endpoint, a scratch folder, the proxy's pid if started here): as given, or
    started here and stopped after."""
    scratch = Path(tempfile.mkdtemp(prefix="orbitmq-bench-grpc-"))
    failed = True
    try:
        if options.namesrv and options.proxy:
            yield options.namesrv, options.proxy, scratch, None
            failed = False
            return
        with target_cluster(None, None, say) as cluster:
            proxy = ServerChild(
                [
                    "orbitmq", "proxy", "--namesrv", cluster.namesrv, "--host", "127.0.0.1",
                    "--port", "0", "--tls", options.proxy_tls,
                ],
                scratch / "proxy.log",
                PROXY_READY,
            )  # fmt: skip
            endpoint = proxy.start().split()[0].removeprefix("proxy=")  # proxy=<host:port> ...
            say(f"started proxy {endpoint}")
            try:
                assert proxy.proc is not None
                yield cluster.namesrv, endpoint, scratch, proxy.proc.pid
                failed = False
            finally:
                proxy.stop(30.0)
    finally:
        if not failed:  # kept otherwise: the client's log and the proxy's log are in it
            shutil.rmtree(scratch, ignore_errors=True)


def _prepare_topics(namesrv: str, topics: list[str]) -> None:
    prepare_topics(namesrv, topics, queues=QUEUES, wait_s=ROUTE_WAIT_S)


def run_grpc_bench(options: GrpcBenchOptions, progress: Say | None = None) -> GrpcBenchResult:
    """Run the benchmark; raises MQError (cannot start or reach the servers, a client failed)
    or ValueError (bad options)."""
    options.validate()
    say: Say = progress or (lambda _line: None)
    started_at = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    machine = {
        "cpu": cpu_model(),
        "cpus": str(os.cpu_count()),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "load average at start": loadavg(),
    }
    runs: list[dict[str, SideResult]] = []
    with target(options, say) as (namesrv, endpoint, scratch, proxy_pid):
        grpc_topic, native_topic = f"{options.topic}Grpc", f"{options.topic}Native"
        _prepare_topics(namesrv, [grpc_topic, native_topic])
        stamp = now_ms() // 1000
        for i in range(1, options.runs + 1):
            say(f"run {i}/{options.runs}: official client via the proxy {endpoint}")
            cpu0 = process_cpu_s(proxy_pid)
            official = run_official_side(
                endpoint, grpc_topic, f"BenchGrpcG{stamp}x{i}", options, scratch / f"home{i}"
            )
            cpu1 = process_cpu_s(proxy_pid)
            if cpu0 is not None and cpu1 is not None and official.sent:
                official.proxy_cpu_ms_per_msg = (cpu1 - cpu0) * 1000 / official.sent
            say(f"run {i}/{options.runs}: native SDK via {namesrv}")
            native = run_native_side(namesrv, native_topic, f"BenchNativeG{stamp}x{i}", options)
            runs.append({"grpc": official, "native": native})
        floor = None
        if options.floor:
            say(f"bare gRPC echo server, {options.threads} threads (the floor under the proxy)")
            floor = run_floor(options.threads, min(options.count, 10_000), options.size, scratch)
    return GrpcBenchResult(options, runs, started_at, machine, client_version(), floor)


def format_report(result: GrpcBenchResult) -> str:
    o = result.options
    lines = [
        f"OrbitMQ gRPC proxy benchmark: official rocketmq-python-client {result.client_version} "
        "via the proxy vs the native SDK",
        *([f"command: {o.command}"] if o.command else []),
        f"started: {result.started_at}; {result.machine['cpu']}, {result.machine['cpus']} cpus, "
        f"python {result.machine['python']}; load {result.machine['load average at start']}",
        f"{o.count:,} sync sends per side per run from {o.threads} threads, {o.size} B bodies; "
        f"receive with {o.receive_threads} threads, batches of {RECEIVE_BATCH}; {o.runs} run(s)",
        "",
        f"{'run':<5}{'side':<8}{'send msgs/s':>12}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'recv msgs/s':>13}{'recv call p50':>15}{'p99':>8}{'errors':>8}",
    ]
    for i, run in enumerate(result.runs, start=1):
        for side in ("grpc", "native"):
            r = run[side]
            rc = r.receive_call_ms or {"p50": 0.0, "p99": 0.0}
            lines.append(
                f"{i:<5}{side:<8}{r.send_msgs_per_s:>12,.0f}{r.send_ms['p50']:>9.3f}"
                f"{r.send_ms['p99']:>9.3f}{r.receive_msgs_per_s:>13,.0f}{rc['p50']:>15.3f}"
                f"{rc['p99']:>8.3f}{r.send_errors + r.receive_errors:>8}"
            )
    data = result.to_json()
    med = data["medians"]
    for side in ("grpc", "native"):
        m = med[side]
        lines.append(
            f"median {side:<7}{m['send_msgs_per_s']:>11,.0f}{m['send_p50_ms']:>9.3f}"
            f"{m['send_p99_ms']:>9.3f}{m['receive_msgs_per_s']:>13,.0f}"
        )
    cpu = [
        f"{side} client {statistics.median(run[side].client_cpu_ms_per_send for run in result.runs):.3f}"
        for side in ("grpc", "native")
    ]
    proxy_cpu = [run["grpc"].proxy_cpu_ms_per_msg for run in result.runs]
    if all(c is not None for c in proxy_cpu):
        cpu.append(f"proxy {statistics.median(c for c in proxy_cpu if c is not None):.3f}")
    lines.append("CPU ms per message (median): " + ", ".join(cpu))
    f = result.floor
    if f is not None:
        server = f.server_cpu_ms_per_call
        cores = os.cpu_count() or 1
        bound = (
            f", at most ~{cores * 1000 / server:,.0f} calls/s on {cores} cores" if server else ""
        )
        lines.append(
            f"bare Python gRPC echo ({f.threads} threads, same stack, no proxy work): "
            f"{f.calls_per_s:,.0f} calls/s, p50 {f.p50_ms:.3f} ms, server CPU "
            f"{server if server is not None else float('nan'):.3f} ms per call{bound} "
            f"(client CPU {f.client_cpu_ms_per_call:.3f} ms per call)"
        )
    t = data["targets"]
    lines += [
        "",
        f"proxy p50 overhead {result.p50_overhead_ms:.3f} ms (target < {TARGET_P50_OVERHEAD_MS:g}"
        f" ms: {'met' if t['p50_overhead_met'] else 'MISSED'}); official client sync sends "
        f"{med['grpc']['send_msgs_per_s']:,.0f} msgs/s from {o.threads} threads (target >= "
        f"{TARGET_GRPC_SENDS_PER_S:,.0f}: {'met' if t['grpc_sends_met'] else 'MISSED'})",
    ]
    errors = [r.first_error for run in result.runs for r in run.values() if r.first_error]
    if errors:
        lines.append(f"first error: {errors[0]}")
    return "\n".join(lines)

"""gRPC proxy benchmark: ``orbitmq bench grpc``. The official Apache RocketMQ 5 Python client
(PyPI ``rocketmq-python-client``, unmodified) against OrbitMQ's gRPC proxy, and the same workload
through the native SDK (Remoting, straight to the broker), side by side in one run.

Workload, per side and run: a new consumer group is primed (one receive fixes where it starts),
then ``--threads`` threads share one producer and each sends its share of ``--count`` messages of
``--size`` bytes with *sync* sends (latency: the round trip of one send); then
``--receive-threads`` threads share one SimpleConsumer and receive batches of up to 32 and ack
each message with a sync ``ack`` until every message sent is back (the official client has no
batch ack and its ``ack_async`` is unusable in 5.1.2, so the native side acks one by one too).
Each side has its own topic (``<topic>Grpc`` / ``<topic>Native``, 8 queues) so a group sees only
its side's messages.

Besides latency and throughput it reports CPU time per message: of each client process over its
send phase, and of the proxy over the official client's whole side when the benchmark started the
proxy. On a shared machine throughput moves with the load; CPU per message says where time goes.

The official client runs in a child process (``python -m orbitmq.bench.grpc --worker``): its
generated protobuf modules cannot share a process with the proxy's, and it configures logging and
writes its log under ``$HOME/logs/rocketmq_python/`` (HOME is pointed at the benchmark's own
folder, kept when something fails, and the error names the log). The native side runs in this
process. Sides run one after the other, never at once.

Without ``--namesrv``/``--proxy`` the benchmark starts a NameServer + Broker (``orbitmq up``) and a
proxy (``python -m orbitmq proxy``) on 127.0.0.1 free ports, data in a temporary folder, and stops
them by pid at the end. Targets (issue #7): the proxy adds < 1 ms to the p50 of a sync send, and
the official client sustains >= 5,000 sync sends/s from 16 threads.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from orbitmq.bench._child import ServerChild, process_cpu_s
from orbitmq.bench.consume import target_cluster
from orbitmq.bench.grpc_floor import FloorResult, run_floor
from orbitmq.bench.store import _cpu_model, _loadavg
from orbitmq.client import AdminClient, Message, Producer, SimpleConsumer
from orbitmq.client.consumer.config import SimpleConfig
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.common.errors import ClientError, MQError

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


# ---------------------------------------------------------------------------- shared loops


def _shares(count: int, threads: int) -> list[int]:
    base, extra = divmod(count, threads)
    return [base + (1 if i < extra else 0) for i in range(threads)]


def _send_threads(
    send: Callable[[], object], count: int, threads: int
) -> tuple[list[float], int, float, str | None]:
    """``threads`` threads call ``send`` ``count`` times in all; (latencies ms, errors, seconds,
    first error). Latencies are kept per thread and joined at the end (no lock per send)."""
    per_thread: list[list[float]] = [[] for _ in range(threads)]
    errors = [0] * threads
    first: list[str] = []
    start = threading.Barrier(threads + 1)

    def worker(i: int, n: int) -> None:
        mine = per_thread[i]
        start.wait()
        for _ in range(n):
            t0 = time.perf_counter()
            try:
                send()
            except Exception as exc:  # noqa: BLE001 - counted, the first one reported
                errors[i] += 1
                if not first:
                    first.append(f"{type(exc).__name__}: {exc}")
                continue
            mine.append((time.perf_counter() - t0) * 1000.0)

    pool = [
        threading.Thread(target=worker, args=(i, n), name=f"bench-send-{i}", daemon=True)
        for i, n in enumerate(_shares(count, threads))
    ]
    for t in pool:
        t.start()
    start.wait()
    began = time.perf_counter()
    for t in pool:
        t.join()
    seconds = time.perf_counter() - began
    return [x for lst in per_thread for x in lst], sum(errors), seconds, first[0] if first else None


def _receive_threads(
    receive_batch: Callable[[], int], expected: int, threads: int
) -> tuple[int, float, list[float], int, str | None]:
    """Threads call ``receive_batch`` (receive + ack, returns how many) until ``expected`` came
    or RECEIVE_TIMEOUT_S passed; (received, seconds to the last one, receive call ms of the
    calls that returned messages, errors, first error)."""
    lock = threading.Lock()
    state = {"got": 0, "errors": 0, "last": 0.0}
    calls: list[float] = []
    first: list[str] = []
    began = time.perf_counter()
    deadline = began + RECEIVE_TIMEOUT_S

    def worker() -> None:
        while time.perf_counter() < deadline:
            with lock:
                if state["got"] >= expected:
                    return
            t0 = time.perf_counter()
            try:
                n = receive_batch()
            except Exception as exc:  # noqa: BLE001 - counted, the first one reported
                with lock:
                    state["errors"] += 1
                    if not first:
                        first.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.05)
                continue
            now = time.perf_counter()
            if n:
                with lock:
                    state["got"] += n
                    state["last"] = now
                    calls.append((now - t0) * 1000.0)

    pool = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    seconds = (state["last"] or time.perf_counter()) - began
    return int(state["got"]), seconds, calls, int(state["errors"]), first[0] if first else None


# ---------------------------------------------------------------------------- native side


def run_native_side(namesrv: str, topic: str, group: str, options: GrpcBenchOptions) -> SideResult:
    """The workload with the native SDK (Remoting to the broker), in this process."""
    body = (b"native " + b"x" * options.size)[: options.size]
    consumer = SimpleConsumer(
        namesrv, group, SimpleConfig(await_duration_s=AWAIT_S), subscriptions={topic: "*"}
    )
    consumer.start()
    try:
        consumer.receive(RECEIVE_BATCH, INVISIBLE_S)  # fixes the group's start: the end
        with Producer(namesrv, ProducerConfig(compress_over_bytes=-1)) as producer:

            def send() -> object:
                return producer.send(Message(topic, body))

            for _ in range(WARMUP_PER_THREAD * options.threads):
                send()
            cpu0 = time.process_time()
            lat, errors, seconds, first = _send_threads(send, options.count, options.threads)
            cpu = time.process_time() - cpu0
        result = SideResult(
            "native", len(lat), errors, seconds, percentiles(lat), first_error=first
        )
        result.client_cpu_ms_per_send = cpu * 1000 / max(len(lat), 1)
        if not options.receive:
            return result

        warmup = WARMUP_PER_THREAD * options.threads

        def receive_batch() -> int:
            msgs = consumer.receive(RECEIVE_BATCH, INVISIBLE_S)
            for m in msgs:  # one ack per message, as the official client does
                consumer.ack(m)
            return len(msgs)

        got, secs, calls, rerrors, rfirst = _receive_threads(
            receive_batch, len(lat) + warmup, options.receive_threads
        )
        result.received, result.receive_seconds = got, secs
        result.receive_call_ms, result.receive_errors = percentiles(calls), rerrors
        result.first_error = result.first_error or rfirst
        return result
    finally:
        consumer.close()


# ---------------------------------------------------------------------------- official side


def official_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """The workload with the official client; runs in the ``--worker`` child process."""
    mq: Any = importlib.import_module("rocketmq")
    cfg = mq.ClientConfiguration(spec["endpoint"], mq.Credentials("", ""), request_timeout=10)
    topic, size = spec["topic"], spec["size"]
    body = (b"grpc " + b"x" * size)[:size]
    consumer = mq.SimpleConsumer(
        cfg, spec["group"], {topic: mq.FilterExpression("*")}, await_duration=AWAIT_S
    )
    consumer.startup()
    producer = mq.Producer(cfg, (topic,))
    out: dict[str, Any] = {}
    try:
        consumer.receive(RECEIVE_BATCH, INVISIBLE_S)  # fixes the group's start: the end
        producer.startup()

        def send() -> object:
            msg = mq.Message()
            msg.topic = topic
            msg.body = body
            return producer.send(msg)

        warmup = WARMUP_PER_THREAD * spec["threads"]
        for _ in range(warmup):
            send()
        cpu0 = time.process_time()
        lat, errors, seconds, first = _send_threads(send, spec["count"], spec["threads"])
        cpu = time.process_time() - cpu0
        out.update(send_ms=lat, send_errors=errors, send_seconds=seconds, first_error=first)
        out["client_cpu_ms_per_send"] = cpu * 1000 / max(len(lat), 1)
        if spec["receive"]:

            def receive_batch() -> int:
                msgs = consumer.receive(RECEIVE_BATCH, INVISIBLE_S) or []
                for m in msgs:  # ack_async is unusable in 5.1.2 (returns None; needs a loop)
                    consumer.ack(m)
                return len(msgs)

            got, secs, calls, rerrors, rfirst = _receive_threads(
                receive_batch, len(lat) + warmup, spec["receive_threads"]
            )
            out.update(
                received=got,
                receive_seconds=secs,
                receive_call_ms=calls,
                receive_errors=rerrors,
                first_error=first or rfirst,
            )
    finally:
        for client in (producer, consumer):
            with contextlib.suppress(Exception):
                client.shutdown()
    return out


def client_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rocketmq-python-client")
    except PackageNotFoundError:
        return "not installed"


def run_official_side(
    endpoint: str, topic: str, group: str, options: GrpcBenchOptions, home: Path
) -> SideResult:
    """Run :func:`official_worker` in a child process with HOME at ``home``."""
    spec = {
        "endpoint": endpoint, "topic": topic, "group": group, "size": options.size,
        "threads": options.threads, "count": options.count, "receive": options.receive,
        "receive_threads": options.receive_threads,
    }  # fmt: skip
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HOME=str(home), PYTHONUNBUFFERED="1")
    log = home / "logs" / "rocketmq_python" / "rocketmq_client.log"
    try:
        done = subprocess.run(
            [sys.executable, "-m", "orbitmq.bench.grpc", "--worker"],
            input=json.dumps(spec).encode(),
            capture_output=True,
            env=env,
            timeout=WORKER_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise ClientError(f"the official client did not finish; its log: {log}") from None
    try:
        data = json.loads(done.stdout.decode().strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise ClientError(
            f"the official client failed (exit {done.returncode}); its log: {log}\n"
            + done.stderr.decode(errors="replace")[-2000:]
        ) from None
    if "error" in data:
        raise ClientError(f"the official client failed: {data['error']}; its log: {log}")
    return SideResult(
        "grpc",
        sent=len(data["send_ms"]),
        send_errors=data["send_errors"],
        send_seconds=data["send_seconds"],
        send_ms=percentiles(data["send_ms"]),
        received=data.get("received", 0),
        receive_seconds=data.get("receive_seconds", 0.0),
        receive_call_ms=percentiles(data.get("receive_call_ms", [])),
        receive_errors=data.get("receive_errors", 0),
        first_error=data.get("first_error"),
        client_cpu_ms_per_send=data.get("client_cpu_ms_per_send", 0.0),
    )


# ---------------------------------------------------------------------------- targets


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
    admin = AdminClient(namesrv)
    try:
        existing = set(admin.list_topics())
        for topic in topics:
            if topic not in existing:
                admin.create_topic(topic, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
        deadline = time.monotonic() + ROUTE_WAIT_S
        for topic in topics:
            while True:
                try:
                    if admin.topic_route(topic).queue_datas:
                        break
                except MQError:
                    pass
                if time.monotonic() > deadline:
                    raise ClientError(f"the NameServer does not route {topic!r}")
                time.sleep(0.1)
    finally:
        admin.close()


def run_grpc_bench(options: GrpcBenchOptions, progress: Say | None = None) -> GrpcBenchResult:
    """Run the benchmark; raises MQError (cannot start or reach the servers, a client failed)
    or ValueError (bad options)."""
    options.validate()
    say: Say = progress or (lambda _line: None)
    started_at = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    machine = {
        "cpu": _cpu_model(),
        "cpus": str(os.cpu_count()),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "load average at start": _loadavg(),
    }
    runs: list[dict[str, SideResult]] = []
    with target(options, say) as (namesrv, endpoint, scratch, proxy_pid):
        grpc_topic, native_topic = f"{options.topic}Grpc", f"{options.topic}Native"
        _prepare_topics(namesrv, [grpc_topic, native_topic])
        stamp = int(time.time())
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


def _worker_main() -> int:
    spec = json.load(sys.stdin)
    try:
        out = official_worker(spec)
    except Exception as exc:  # noqa: BLE001 - reported to the parent as data
        out = {"error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    code = _worker_main()
    sys.stderr.flush()
    os._exit(code)  # the official client may leave non-daemon threads behind

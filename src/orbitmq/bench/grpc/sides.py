"""The two sides of the gRPC benchmark: the same send-then-receive workload through the
native SDK (:func:`run_native_side`, in this process) and through the official client
(:func:`run_official_side`, which runs :func:`official_worker` in a ``python -m
orbitmq.bench.grpc --worker`` child, :func:`worker_main`), on the shared thread loops.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orbitmq.bench.grpc.model import (
    AWAIT_S,
    INVISIBLE_S,
    RECEIVE_BATCH,
    RECEIVE_TIMEOUT_S,
    WARMUP_PER_THREAD,
    WORKER_TIMEOUT_S,
    GrpcBenchOptions,
    SideResult,
    percentiles,
)
from orbitmq.client import Message, Producer, SimpleConsumer
from orbitmq.client.consumer.config import SimpleConfig
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.common.errors import ClientError


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


def worker_main() -> int:
    spec = json.load(sys.stdin)
    try:
        out = official_worker(spec)
    except Exception as exc:  # noqa: BLE001 - reported to the parent as data
        out = {"error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0

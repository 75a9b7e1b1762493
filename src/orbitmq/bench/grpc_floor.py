"""The floor under the gRPC proxy: what Python's gRPC costs before the proxy does any work.

A bare ``grpc.aio`` echo server (the proxy's server stack: grpcio on uvloop, same channel
options, one unary method that returns its request) in a child process, called by blocking
stubs from ``threads`` threads in this process with ``size``-byte requests, the shape of the
proxy benchmark's sync sends. The server's CPU per call is the least any Python gRPC proxy can
spend per send, and ``cores / server CPU per call`` bounds the calls per second one machine can
serve, whatever the proxy does inside the call. ``orbitmq bench grpc`` prints it beside the
proxy's own figures so the two can be read together.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from orbitmq.bench._child import ServerChild, process_cpu_s

__all__ = ["FloorResult", "run_floor"]

READY = "orbitmq grpc-echo ready "
SERVICE = "orbitmq.bench.Echo"
METHOD = "Echo"
WARMUP_CALLS = 200


@dataclass(frozen=True, slots=True)
class FloorResult:
    threads: int
    calls: int
    seconds: float
    p50_ms: float
    p99_ms: float
    server_cpu_ms_per_call: float | None
    client_cpu_ms_per_call: float

    @property
    def calls_per_s(self) -> float:
        return self.calls / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "calls_per_s": self.calls_per_s}


def _same(data: bytes) -> bytes:
    return data


async def _serve() -> None:
    import grpc

    async def echo(request: bytes, context: Any) -> bytes:
        return request

    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", 8 * 1024 * 1024), ("grpc.so_reuseport", 0)]
    )
    handler = grpc.method_handlers_generic_handler(
        SERVICE, {METHOD: grpc.unary_unary_rpc_method_handler(echo, _same, _same)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    sys.stdout.write(f"{READY}127.0.0.1:{port}\n")
    sys.stdout.flush()
    await server.wait_for_termination()


def run_floor(threads: int, count: int, size: int, scratch: Path) -> FloorResult:
    """Start the echo server, make ``count`` calls from ``threads`` threads, stop it."""
    import grpc
    import numpy as np

    child = ServerChild(["orbitmq.bench.grpc_floor", "--server"], scratch / "echo.log", READY)
    address = child.start().split()[0]
    try:
        assert child.proc is not None
        pid = child.proc.pid
        with grpc.insecure_channel(address) as channel:
            call = channel.unary_unary(
                f"/{SERVICE}/{METHOD}", request_serializer=_same, response_deserializer=_same
            )
            payload = os.urandom(size)
            for _ in range(WARMUP_CALLS):
                call(payload, timeout=10)
            per = [count // threads + (1 if i < count % threads else 0) for i in range(threads)]
            samples: list[list[float]] = [[] for _ in range(threads)]

            def worker(i: int) -> None:
                out = samples[i]
                for _ in range(per[i]):
                    t0 = time.perf_counter()
                    call(payload, timeout=10)
                    out.append((time.perf_counter() - t0) * 1000)

            workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
            cpu0, client0, wall0 = process_cpu_s(pid), time.process_time(), time.perf_counter()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            wall = time.perf_counter() - wall0
            client = time.process_time() - client0
            cpu1 = process_cpu_s(pid)
    finally:
        child.stop(10.0)
    flat = np.concatenate([np.asarray(s) for s in samples])
    p50, p99 = np.percentile(flat, [50, 99]).tolist()
    server = None if cpu0 is None or cpu1 is None else (cpu1 - cpu0) * 1000 / count
    return FloorResult(threads, count, wall, p50, p99, server, client * 1000 / count)


if __name__ == "__main__" and sys.argv[1:] == ["--server"]:
    from orbitmq.net.loop import run

    run(_serve())

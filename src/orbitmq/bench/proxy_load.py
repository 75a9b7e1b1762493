"""The two processes of ``orbitmq bench proxy`` besides the servers: the asyncio load generator
and the bare ``grpc.aio`` echo server it is compared with.

**The generator** (``python -m orbitmq.bench.proxy_load --drive HOST:PORT ...``) is one
``grpc.aio`` client on uvloop that keeps ``--inflight`` SendMessage calls open at once (one
coroutine per slot, each starting its next call as soon as its last one is answered) until
``--count`` calls were made after a warm-up, and prints one JSON line: calls, seconds, errors,
latency percentiles and its own CPU. Requests are real ``SendMessageRequest`` bytes (one
message, ``--size`` bytes of body, a distinct message id per call, the metadata the official
client sends), built before the clock starts; the bytes go out as they are (generic
``bytes -> bytes`` stub), and each answer is parsed and its status checked, so the client does
the same work whichever server answers.

**The echo** (``--echo``) is what a proxy written on Python's gRPC costs before it does any
work: a ``grpc.aio`` server on uvloop with the proxy's channel options and the proxy's method
path, whose SendMessage returns the serialized ``SendMessageResponse`` the proxy would answer
(status OK, one entry with an id and an offset): the same proto and message sizes both ways,
no parsing, no broker. Both run in their own processes so the bench can read each one's CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["ECHO_READY", "METHOD", "build_requests", "canned_response", "main"]

ECHO_READY = "orbitmq proxy-echo ready "
METHOD = "/apache.rocketmq.v2.MessagingService/SendMessage"
WARMUP_CALLS = 200
CALL_TIMEOUT_S = 30.0
CLIENT_ID = "orbitmq-bench-proxy@1@0"
METADATA = (
    ("x-mq-client-id", CLIENT_ID),
    ("x-mq-language", "PYTHON"),
    ("x-mq-protocol", "v2"),
    ("x-mq-client-version", "5.1.2"),
    ("x-mq-date-time", "20261126T000000Z"),
    ("authorization", "MQv2-HMAC-SHA1 Credential=, SignedHeaders=x-mq-date-time, Signature="),
)
"""What the official client sends on every call (no credentials: ACL off)."""


def build_requests(topic: str, size: int, count: int, tag: str = "bench") -> list[bytes]:
    """``count`` serialized SendMessageRequests of one ``size``-byte message each, ids distinct."""
    from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
    from orbitmq.proxy.grpc_v2 import service_pb2 as svc

    body = os.urandom(size)
    born = int(time.time())
    out: list[bytes] = []
    base = os.urandom(6).hex().upper()
    for i in range(count):
        msg = pb.Message(topic=pb.Resource(name=topic), body=body)
        sp = msg.system_properties
        sp.message_id = f"01{base}{i:018X}"
        sp.tag = tag
        sp.message_type = pb.MessageType.NORMAL
        sp.body_encoding = pb.Encoding.IDENTITY
        sp.born_timestamp.seconds = born
        sp.born_host = "bench"
        out.append(svc.SendMessageRequest(messages=[msg]).SerializeToString())
    return out


def canned_response() -> bytes:
    """A SendMessageResponse shaped like the proxy's answer to one message."""
    from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
    from orbitmq.proxy.grpc_v2 import service_pb2 as svc

    ok = pb.Status(code=pb.Code.OK, message="OK")
    entry = svc.SendResultEntry(status=ok, message_id="01" + "0" * 30, offset=123_456)
    return svc.SendMessageResponse(status=ok, entries=[entry]).SerializeToString()


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; plain asyncio still works
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


# ---------------------------------------------------------------------------- the echo server


async def _serve_echo(host: str) -> None:
    import grpc

    answer = canned_response()

    async def send(_request: bytes, _context: Any) -> bytes:
        return answer

    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", 8 * 1024 * 1024),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 0),
        ]
    )
    handler = grpc.method_handlers_generic_handler(
        "apache.rocketmq.v2.MessagingService",
        {"SendMessage": grpc.unary_unary_rpc_method_handler(send)},  # bytes in, bytes out
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port(f"{host}:0")
    await server.start()
    sys.stdout.write(f"{ECHO_READY}{host}:{port}\n")
    sys.stdout.flush()
    await server.wait_for_termination()


# ---------------------------------------------------------------------------- the generator


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _drive(
    target: str, requests: list[bytes], inflight: int, tls_ca: str | None = None
) -> dict[str, Any]:
    import grpc

    from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
    from orbitmq.proxy.grpc_v2 import service_pb2 as svc

    ok = int(pb.Code.OK)
    parse = svc.SendMessageResponse.FromString
    options = [("grpc.max_receive_message_length", 8 * 1024 * 1024)]
    if tls_ca is None:
        opened = grpc.aio.insecure_channel(target, options=options)
    else:  # TLS, verifying the server against the bench's own CA
        creds = grpc.ssl_channel_credentials(root_certificates=Path(tls_ca).read_bytes())
        opened = grpc.aio.secure_channel(target, creds, options=options)
    async with opened as channel:
        call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(METHOD)
        errors = 0
        first_error: list[str] = []

        async def one(req: bytes, lat: list[float] | None) -> None:
            nonlocal errors
            t0 = time.perf_counter()
            try:
                raw = await call(req, metadata=METADATA, timeout=CALL_TIMEOUT_S)
                resp = parse(raw)
                code = resp.status.code
            except grpc.aio.AioRpcError as exc:
                errors += 1
                if not first_error:
                    first_error.append(f"{exc.code().name}: {exc.details()}")
                return
            if code != ok:
                errors += 1
                if not first_error:
                    first_error.append(f"status {code}: {resp.status.message}")
                return
            if lat is not None:
                lat.append((time.perf_counter() - t0) * 1000.0)

        async def lane(reqs: list[bytes], lat: list[float] | None) -> None:
            for req in reqs:
                await one(req, lat)

        async def run(reqs: list[bytes], lat: list[float] | None) -> float:
            lanes = [reqs[i::inflight] for i in range(inflight)]
            t0 = time.perf_counter()
            await asyncio.gather(*(lane(part, lat) for part in lanes if part))
            return time.perf_counter() - t0

        warm, timed = requests[:WARMUP_CALLS], requests[WARMUP_CALLS:]
        await run(warm, None)
        errors, first_error[:] = 0, []
        latencies: list[float] = []
        cpu0 = _cpu_s()
        seconds = await run(timed, latencies)
        cpu = _cpu_s() - cpu0
    latencies.sort()
    n = len(latencies)

    def pct(q: float) -> float:
        return latencies[min(n - 1, int(q * n))] if n else 0.0

    return {
        "calls": len(timed),
        "answered": n,
        "errors": errors,
        "first_error": first_error[0] if first_error else None,
        "seconds": seconds,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "max_ms": latencies[-1] if n else 0.0,
        "client_cpu_s": cpu,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m orbitmq.bench.proxy_load", description=__doc__)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--echo", metavar="HOST", help="serve the bare echo on HOST, a free port")
    mode.add_argument("--drive", metavar="HOST:PORT", help="drive SendMessage calls at a server")
    ap.add_argument("--count", type=int, default=10_000)
    ap.add_argument("--inflight", type=int, default=32)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--topic", default="BenchProxy")
    ap.add_argument("--tls-ca", default=None, help="drive over TLS, trusting this PEM CA")
    args = ap.parse_args(argv)
    loop = _new_loop()
    asyncio.set_event_loop(loop)
    try:
        if args.echo:
            loop.run_until_complete(_serve_echo(args.echo))
            return 0
        requests = build_requests(args.topic, args.size, args.count + WARMUP_CALLS)
        result = loop.run_until_complete(_drive(args.drive, requests, args.inflight, args.tls_ca))
    finally:
        loop.close()
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

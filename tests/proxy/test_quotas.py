"""Quotas and connection caps on the gRPC proxy port, as on the Remoting ports: a producer over
its byte rate is held (and another client is not), receive streams are held over the fetch
rate, and connections beyond the per-address cap are closed at accept."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

from orbitmq.net.limits import REASON_PER_IP, REASON_THROTTLED
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.grpc_v2 import service_pb2 as svc
from orbitmq.proxy.grpc_v2 import service_pb2_grpc
from orbitmq.proxy.quotas import ProxyQuotas, message_bytes, peer_address
from tests.proxy.conftest import ProxyEnv, metadata, proxy_env_fixture
from tests.proxy.test_producer_rpcs import message

RATE = 100_000  # bytes per second, per client
BODY = 50_000
KEYS = {"fast-ak": "fast-sk", "slow-ak": "slow-sk"}
env = proxy_env_fixture(
    {"QuotaTopic": "NORMAL"},
    proxy_options={
        "acl_enabled": True,
        "access_keys": KEYS,
        "produce_quota_bytes_per_s": RATE,
        "fetch_quota_bytes_per_s": RATE,
        "limit_connections": True,
        "max_connections_per_ip": 3,
        "limits_exempt_loopback": False,
    },
)


async def _send(stub: service_pb2_grpc.MessagingServiceStub, ak: str) -> float:
    started = time.monotonic()
    resp = await stub.SendMessage(
        svc.SendMessageRequest(messages=[message("QuotaTopic", b"q" * BODY)]),
        metadata=metadata(ak=ak, sk=KEYS[ak]),
        timeout=30,
    )
    assert resp.status.code == pb.Code.OK, resp.status
    return time.monotonic() - started


async def test_a_producer_over_its_quota_is_held_and_others_are_not(env: ProxyEnv) -> None:
    servicer = env.proxy.servicer
    assert servicer is not None
    async with grpc.aio.insecure_channel(env.endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        started = time.monotonic()
        # Four bodies = two seconds of quota; the first second is the bucket's burst.
        for _ in range(4):
            await _send(stub, "slow-ak")
        slow = time.monotonic() - started
        other = await _send(stub, "fast-ak")
    assert 0.8 <= slow < 6.0, slow  # held about (4 * BODY - RATE) / RATE seconds, not more
    assert other < 0.8, other  # a different access key has its own, full bucket
    assert servicer.quotas.refusals.counts[REASON_THROTTLED] >= 1


class _Context:
    def __init__(self, ak: str) -> None:
        self._metadata = metadata(ak=ak, sk=KEYS[ak])

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self._metadata

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5555"


async def test_receive_streams_are_held_over_the_fetch_quota(env: ProxyEnv) -> None:
    servicer = env.proxy.servicer
    assert servicer is not None
    item = svc.ReceiveMessageResponse(message=pb.Message(body=b"r" * BODY))

    async def stream(count: Any, _context: Any) -> AsyncIterator[svc.ReceiveMessageResponse]:
        yield svc.ReceiveMessageResponse(status=pb.Status(code=pb.Code.OK))
        for _ in range(count):
            yield item

    limited = servicer.fetch_limited(stream)
    started = time.monotonic()
    got = [x async for x in limited(4, _Context("slow-ak"))]  # two seconds of quota
    held = time.monotonic() - started
    assert len(got) == 5 and 0.8 <= held < 6.0, held
    started = time.monotonic()  # another client, within its burst: not held
    assert len([x async for x in limited(1, _Context("fast-ak"))]) == 2
    assert time.monotonic() - started < 0.8


def test_quota_helpers() -> None:
    assert peer_address("ipv4:10.1.2.3:4567") == "10.1.2.3"
    assert peer_address("ipv6:[::1]:4567") == "::1"
    assert message_bytes(svc.PullMessageResponse(next_offset=3)) == 0
    assert message_bytes(svc.PullMessageResponse(message=pb.Message(body=b"abc"))) == 3
    assert not ProxyQuotas(None, None).active


def _hold_open(port: int, n: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(n)]


def _closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


async def test_connections_beyond_the_per_address_cap_are_closed_at_accept(
    env: ProxyEnv,
) -> None:
    mux = env.proxy._mux
    assert mux is not None and mux.admission is not None
    deadline = time.monotonic() + 10
    while mux.admission.total and time.monotonic() < deadline:  # earlier tests' channels
        await asyncio.sleep(0.05)
    assert mux.admission.total == 0
    before = mux.refusals.counts[REASON_PER_IP]
    held = await asyncio.to_thread(_hold_open, env.proxy.port, 3)
    try:
        extra = await asyncio.to_thread(_hold_open, env.proxy.port, 1)
        try:
            assert await asyncio.to_thread(_closed_by_server, extra[0])
        finally:
            extra[0].close()
        assert mux.refusals.counts[REASON_PER_IP] == before + 1
    finally:
        for s in held:
            s.close()
    while mux.admission.total and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    async with grpc.aio.insecure_channel(env.endpoint) as channel:  # served again
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        await _send(stub, "fast-ak")

"""Byte-rate quotas: a producer far over its quota is held to it (responses delayed, with
throttle_time_ms), while a client from another address is not slowed."""

from __future__ import annotations

import asyncio
import time

from orbitmq.common.codes import ResponseCode
from orbitmq.net.connection import Connection, Reply
from orbitmq.net.limits import REASON_THROTTLED
from orbitmq.net.quota import ByteQuotas
from orbitmq.net.server import RemotingServer
from orbitmq.protocol.frame import DEFAULT_MAX_FRAME_SIZE, Frame

PRODUCE, OTHER = 10, 99
RATE = 400_000.0  # bytes per second
CHUNK = 20_000


async def handler(frame: Frame, conn: Connection) -> Reply:
    return frame.reply(ResponseCode.SUCCESS)


async def connect(port: int, source: str) -> Connection:
    loop = asyncio.get_running_loop()
    _t, conn = await loop.create_connection(
        lambda: Connection(None, max_frame_size=DEFAULT_MAX_FRAME_SIZE),
        "127.0.0.1",
        port,
        local_addr=(source, 0),
    )
    return conn


async def test_a_producer_at_10x_its_quota_is_held_to_it() -> None:
    quotas = ByteQuotas.of({PRODUCE}, (), RATE, None)
    server = RemotingServer(handler, quotas=quotas)
    await server.start()
    greedy = await connect(server.port, "127.0.0.1")
    polite = await connect(server.port, "127.0.0.2")
    try:
        sent = 0
        throttle_ms = 0
        start = time.monotonic()
        duration = 2.5

        async def push() -> None:  # 8 requests in flight: 10x the quota if not throttled
            nonlocal sent, throttle_ms
            while time.monotonic() - start < duration:
                reply = await greedy.request(Frame(PRODUCE, body=bytes(CHUNK)), timeout=40)
                assert reply.code == ResponseCode.SUCCESS
                sent += CHUNK
                throttle_ms = max(throttle_ms, int(reply.fields.get("throttle_time_ms", 0)))

        pushers = [asyncio.create_task(push()) for _ in range(8)]
        await asyncio.sleep(1.0)
        # Another client (another address) is answered at once while the first is throttled.
        t0 = time.monotonic()
        for _ in range(5):
            reply = await polite.request(Frame(PRODUCE, body=bytes(CHUNK)), timeout=5)
            assert "throttle_time_ms" not in reply.fields
        assert time.monotonic() - t0 < 0.5
        await asyncio.gather(*pushers)
        elapsed = time.monotonic() - start
        # One second of burst, then the rate: allow the requests in flight at the end.
        ceiling = RATE * (elapsed + 1.0) + 8 * CHUNK
        assert RATE * elapsed * 0.6 < sent < ceiling, (sent, elapsed)
        assert throttle_ms > 0
        assert server.refusals.counts[REASON_THROTTLED] > 0
        assert quotas is not None and quotas.throttled > 0
        # A code without a quota is never throttled.
        reply = await greedy.request(Frame(OTHER, body=bytes(CHUNK)), timeout=40)
        assert "throttle_time_ms" not in reply.fields
    finally:
        greedy.close()
        polite.close()
        await server.stop()


def test_no_rate_means_no_quota_object() -> None:
    assert ByteQuotas.of({PRODUCE}, (), None, None) is None
    quotas = ByteQuotas.of({PRODUCE}, {11}, 100.0, 50.0)
    assert quotas is not None
    assert quotas.charge(PRODUCE, 100, 0, "a") == 0.0  # within the 1 s burst
    assert quotas.charge(PRODUCE, 100, 0, "a") > 0.9  # 100 bytes over at 100 B/s
    assert quotas.charge(PRODUCE, 100, 0, "b") == 0.0  # another client's own account
    assert quotas.charge(11, 0, 100, "a") > 0.9  # fetch counts response bytes, at 50 B/s

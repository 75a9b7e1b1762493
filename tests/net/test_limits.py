"""Abuse limits of a Remoting listener: frame size, per-IP caps, slowloris, idle, pending."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from pathlib import Path

from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from orbitmq.net.connection import Connection, Reply
from orbitmq.net.limits import (
    REASON_FRAME_TIMEOUT,
    REASON_IDLE,
    REASON_PER_IP,
    REASON_PROTOCOL,
    REASON_RATE,
    Limits,
)
from orbitmq.net.server import RemotingServer
from orbitmq.protocol.frame import Frame

ECHO, HOLD = 1, 2


class Handler:
    def __init__(self) -> None:
        self.running = 0
        self.peak = 0
        self.release = asyncio.Event()

    async def __call__(self, frame: Frame, conn: Connection) -> Reply:
        if frame.code == HOLD:
            self.running += 1
            self.peak = max(self.peak, self.running)
            await self.release.wait()
            self.running -= 1
        return frame.reply(ResponseCode.SUCCESS, body=frame.body)


async def _closed_by_server(reader: asyncio.StreamReader, within: float) -> bool:
    try:
        async with asyncio.timeout(within):
            return await reader.read(100) == b""
    except (TimeoutError, ConnectionResetError):
        return False


async def _still_serves(server: RemotingServer) -> None:
    client = RemotingClient()
    try:
        reply = await client.invoke(server.address, Frame(ECHO, body=b"ok"), timeout=5)
        assert reply.body == b"ok"
    finally:
        await client.close()


async def test_huge_and_negative_length_prefixes_close_without_allocating() -> None:
    server = RemotingServer(Handler())
    await server.start()
    try:
        for prefix in (0x80000000, 0xFFFFFFFF, 2**31 - 1):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(struct.pack(">IBBHII", prefix, 1, 0, ECHO, 1, 0))
            assert await _closed_by_server(reader, 3.0)
            writer.close()
            await _still_serves(server)
        assert server.refusals.counts[REASON_PROTOCOL] == 3
    finally:
        await server.stop()


async def test_connections_per_ip_are_capped() -> None:
    server = RemotingServer(
        Handler(), limits=Limits(max_connections_per_ip=5, exempt_loopback=False)
    )
    await server.start()
    socks = []
    try:
        for _ in range(12):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            socks.append(s)
        await asyncio.sleep(0.3)
        assert len(server.connections) == 5
        assert server.refusals.counts[REASON_PER_IP] == 7
        for s in socks[:5]:
            s.close()
        await asyncio.sleep(0.3)
        await _still_serves(server)  # closed ones gave their slots back
    finally:
        for s in socks:
            s.close()
        await server.stop()


async def test_slowloris_frame_is_cut_and_idle_connections_close() -> None:
    limits = Limits(frame_timeout_s=0.4, idle_timeout_s=0.6)
    server = RemotingServer(Handler(), limits=limits)
    await server.start()
    try:
        slow_r, slow_w = await asyncio.open_connection("127.0.0.1", server.port)
        idle_r, idle_w = await asyncio.open_connection("127.0.0.1", server.port)
        loop = asyncio.get_running_loop()
        started = loop.time()
        cut = False
        for _ in range(40):  # 1 byte every 50 ms: a frame that never completes
            slow_w.write(b"\x00")
            await asyncio.sleep(0.05)
            if slow_r.at_eof() or slow_w.is_closing():
                break
            try:
                await slow_w.drain()
            except ConnectionError:
                cut = True
                break
        cut = cut or await _closed_by_server(slow_r, 1.0)
        assert cut and loop.time() - started < 1.5
        assert await _closed_by_server(idle_r, 1.5)
        assert server.refusals.counts[REASON_FRAME_TIMEOUT] == 1
        assert server.refusals.counts[REASON_IDLE] >= 1
        for w in (slow_w, idle_w):
            w.close()
        await _still_serves(server)
    finally:
        await server.stop()


async def test_pending_requests_per_connection_are_capped() -> None:
    handler = Handler()
    server = RemotingServer(handler, limits=Limits(max_pending_requests=3))
    await server.start()
    client = RemotingClient()
    try:
        calls = [
            asyncio.create_task(client.invoke(server.address, Frame(HOLD), timeout=10))
            for _ in range(20)
        ]
        await asyncio.sleep(0.3)
        assert handler.peak == 3
        handler.release.set()
        replies = await asyncio.gather(*calls)
        assert all(r.code == ResponseCode.SUCCESS for r in replies)
        assert handler.peak == 3
    finally:
        await client.close()
        await server.stop()


def test_refusals_are_exported_as_a_prometheus_counter() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from orbitmq.net.limits import Refusals
    from orbitmq.net.metrics import RefusalCollector

    refusals = Refusals()
    registry = CollectorRegistry()
    registry.register(RefusalCollector("broker", refusals))
    refusals.count(REASON_PER_IP, "10.0.0.1")
    text = generate_latest(registry).decode()
    line = 'orbitmq_net_refused_total{listener="broker",reason="max_connections_per_ip"} 1.0'
    assert line in text


async def test_a_silent_connection_to_a_tls_port_is_closed_after_the_handshake_timeout(
    tmp_path: Path,
) -> None:
    from orbitmq.net.limits import REASON_HANDSHAKE_TIMEOUT
    from orbitmq.net.tls import ContextSource, server_context
    from tests.net.pki import Ca

    folder = tmp_path
    ca = Ca.make(folder)
    cert, key = ca.issue(folder, "localhost", ip="127.0.0.1")
    source = ContextSource(lambda: server_context(str(cert), str(key)), [str(cert), str(key)])
    server = RemotingServer(
        Handler(), tls=source, tls_mode="permissive", limits=Limits(handshake_timeout_s=0.3)
    )
    await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        assert await _closed_by_server(reader, 2.0)
        writer.close()
        assert server.refusals.counts[REASON_HANDSHAKE_TIMEOUT] == 1
        await _still_serves(server)  # plaintext still served in permissive mode
    finally:
        await server.stop()


async def test_loopback_is_exempt_by_default_and_new_connections_are_rate_limited() -> None:
    exempt = RemotingServer(Handler(), limits=Limits(max_connections_per_ip=2))
    strict = RemotingServer(
        Handler(), limits=Limits(new_connections_per_ip_per_s=3, exempt_loopback=False)
    )
    await exempt.start()
    await strict.start()
    socks = []
    try:
        for server in (exempt, strict):
            for _ in range(8):
                socks.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
        await asyncio.sleep(0.3)
        assert len(exempt.connections) == 8 and exempt.refusals.total == 0
        assert len(strict.connections) == 3  # the burst, then the bucket is empty
        assert strict.refusals.counts[REASON_RATE] == 5
    finally:
        for s in socks:
            s.close()
        await exempt.stop()
        await strict.stop()


FLOOD = int(os.environ.get("ORBITMQ_FLOOD_CONNECTIONS", "1000"))


async def test_a_connection_flood_from_one_address_leaves_others_served() -> None:
    """FLOOD connections from 127.0.0.1 (per-address cap 100) while a client from 127.0.0.2
    keeps sending: the flood is refused past the cap, the other client is always answered."""
    limits = Limits(
        max_connections_per_ip=100, new_connections_per_ip_per_s=1e6, exempt_loopback=False
    )
    server = RemotingServer(Handler(), limits=limits)
    await server.start()
    loop = asyncio.get_running_loop()
    _t, other = await loop.create_connection(
        lambda: Connection(None, max_frame_size=1 << 20), "127.0.0.1", server.port,
        local_addr=("127.0.0.2", 0),
    )  # fmt: skip
    flood: list[asyncio.StreamWriter] = []
    answered = 0
    try:

        async def open_flood() -> None:
            for _ in range(FLOOD):
                try:
                    _r, w = await asyncio.open_connection("127.0.0.1", server.port)
                except OSError:
                    continue
                flood.append(w)

        async def keep_asking() -> None:
            nonlocal answered
            for _ in range(50):
                reply = await other.request(Frame(ECHO, body=b"x"), timeout=5)
                assert reply.code == ResponseCode.SUCCESS
                answered += 1
                await asyncio.sleep(0.01)

        await asyncio.gather(open_flood(), keep_asking())
        await asyncio.sleep(0.2)
        flooders = [c for c in server.connections if c.attributes["ip"] == "127.0.0.1"]
        assert len(flooders) <= 100
        assert server.refusals.counts[REASON_PER_IP] >= FLOOD - 100
        assert answered == 50
    finally:
        for w in flood:
            w.close()
        other.close()
        await server.stop()


def test_a_deeply_nested_header_is_a_protocol_error() -> None:
    """Found by fuzzing: 60,000 nested msgpack arrays made msgspec raise RecursionError out of
    the frame decoder; it is a ProtocolError (the connection is closed) like any bad header."""
    from orbitmq.common.errors import ProtocolError
    from orbitmq.protocol.frame import FrameDecoder

    header = b"\x81\xa1a" + b"\x91" * 60_000 + b"\xc0"
    wire = struct.pack(">IBBHII", 12 + len(header), 1, 0, ECHO, 1, len(header)) + header
    try:
        FrameDecoder().feed(wire)
    except ProtocolError:
        return
    raise AssertionError("a 60,000-deep header was accepted")

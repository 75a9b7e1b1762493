"""TLS writes are coalesced: what one loop pass writes goes to the SSL transport as one buffer
(full records, one encrypt pass), in order, and close() sends what was written before it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from orbitmq.net.connection import Connection, Reply
from orbitmq.net.server import RemotingServer
from orbitmq.net.tls import ContextSource, client_context, server_context
from orbitmq.protocol.frame import Frame, FrameDecoder
from tests.net.pki import Ca


class FakeTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closing = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def writelines(self, parts: Any) -> None:
        self.writes.extend(bytes(p) for p in parts)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True


async def test_one_write_per_loop_pass_in_order() -> None:
    conn = Connection(max_frame_size=1 << 20)
    transport = FakeTransport()
    conn.transport = transport  # type: ignore[assignment]
    conn.tls = True
    frames = [Frame(2, opaque=i, flags=1, body=bytes([i]) * 10) for i in range(5)]
    for f in frames[:3]:
        conn._send(f, [f.body[:4], f.body[4:]])
    assert transport.writes == []  # not yet: at the end of this pass
    await asyncio.sleep(0)
    assert len(transport.writes) == 1
    got = FrameDecoder(1 << 20).feed(transport.writes[0])
    assert [(g.opaque, g.body) for g in got] == [(f.opaque, f.body) for f in frames[:3]]
    conn._send(frames[3])
    conn._send(frames[4])
    conn.close("test")  # flushes before closing
    assert transport.closing and len(transport.writes) == 2
    assert [g.opaque for g in FrameDecoder(1 << 20).feed(transport.writes[1])] == [3, 4]
    await asyncio.sleep(0)  # the scheduled flush finds nothing left
    assert len(transport.writes) == 2


async def test_plaintext_writes_are_not_delayed() -> None:
    conn = Connection(max_frame_size=1 << 20)
    transport = FakeTransport()
    conn.transport = transport  # type: ignore[assignment]
    conn._send(Frame(2, opaque=1, flags=1, body=b"abc"))
    assert transport.writes  # written at once, parts not joined


async def _many_parts(frame: Frame, conn: Connection) -> Reply:
    body = frame.body
    parts = [body[i : i + 100] for i in range(0, len(body), 100)]
    return frame.reply(ResponseCode.SUCCESS), parts


async def test_tls_round_trips_with_many_parts_and_requests(tmp_path: Path) -> None:
    ca = Ca.make(tmp_path)
    cert, key = ca.issue(tmp_path, "localhost", ip="127.0.0.1")
    source = ContextSource(lambda: server_context(str(cert), str(key)), [str(cert), str(key)])
    server = RemotingServer(_many_parts, tls=source, tls_mode="required")
    await server.start()
    client = RemotingClient(ssl_context=client_context(ca_file=str(ca.file)))
    try:
        bodies = [bytes([i % 251]) * (50 + 997 * i) for i in range(40)]
        replies = await asyncio.wait_for(
            asyncio.gather(
                *(client.invoke(server.address, Frame(7, body=b), timeout=10) for b in bodies)
            ),
            20,
        )
        assert [r.body for r in replies] == bodies
    finally:
        await client.close()
        await server.stop()

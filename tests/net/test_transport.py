"""The asyncio transport: pipelining, timeouts, oneway, lost connections, back-pressure, TLS."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import RequestTimeoutError
from orbitmq.net.client import RemotingClient
from orbitmq.net.connection import Connection, ConnectionClosedError, Reply
from orbitmq.net.server import RemotingServer
from orbitmq.protocol.frame import Frame

ECHO, SLOW, SILENT, BIG = 1, 2, 3, 4


async def handler(frame: Frame, conn: Connection) -> Reply:
    if frame.code == SLOW:
        await asyncio.sleep(float(frame.fields.get("delay", 0.2)))
    if frame.code == SILENT:
        await asyncio.sleep(10)
    if frame.code == BIG:
        return frame.reply(ResponseCode.SUCCESS), [b"x" * 1_000_000] * 4
    conn.attributes.setdefault("seen", []).append(frame.fields.get("i"))
    return frame.reply(ResponseCode.SUCCESS, fields={"i": frame.fields.get("i")}, body=frame.body)


async def test_pipelined_requests_match_their_responses() -> None:
    server = RemotingServer(handler)
    await server.start()
    client = RemotingClient()
    try:
        delays = [0.05 * (i % 4) for i in range(40)]
        frames = [
            Frame(SLOW, fields={"i": i, "delay": d}, body=bytes([i])) for i, d in enumerate(delays)
        ]
        replies = await asyncio.gather(
            *(client.invoke(server.address, f, timeout=5) for f in frames)
        )
        assert [r.fields["i"] for r in replies] == list(range(40))
        assert [r.body for r in replies] == [bytes([i]) for i in range(40)]
        big = await client.invoke(server.address, Frame(BIG), timeout=10)
        assert len(big.body) == 4_000_000
    finally:
        await client.close()
        await server.stop()


async def test_timeout_and_oneway() -> None:
    server = RemotingServer(handler)
    await server.start()
    client = RemotingClient()
    try:
        with pytest.raises(RequestTimeoutError):
            await client.invoke(server.address, Frame(SILENT), timeout=0.2)
        await client.invoke_oneway(server.address, Frame(ECHO, fields={"i": "oneway"}))
        # The oneway request was processed and produced no response frame.
        reply = await client.invoke(server.address, Frame(ECHO, fields={"i": 2}))
        assert reply.fields["i"] == 2
        conn = next(iter(server.connections))
        assert "oneway" in conn.attributes["seen"]
    finally:
        await client.close()
        await server.stop()


async def test_timed_out_and_cancelled_requests_leave_nothing_pending() -> None:
    server = RemotingServer(handler)
    await server.start()
    client = RemotingClient()
    try:
        conn = await client.connection(server.address)
        with pytest.raises(RequestTimeoutError, match=r"within 0\.100s"):
            await conn.request(Frame(SILENT), 0.1)
        assert conn.pending == {}
        task = asyncio.create_task(conn.request(Frame(SILENT), 5.0))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert conn.pending == {}
        # The connection still works, and answers reach their own requests.
        replies = await asyncio.gather(
            *(conn.request(Frame(ECHO, fields={"i": i}), 5.0) for i in range(5))
        )
        assert [r.fields["i"] for r in replies] == list(range(5))
    finally:
        await client.close()
        await server.stop()


async def test_lost_connection_fails_pending_and_reconnects() -> None:
    server = RemotingServer(handler)
    await server.start()
    client = RemotingClient()
    try:
        pending = asyncio.ensure_future(client.invoke(server.address, Frame(SILENT), timeout=5))
        await asyncio.sleep(0.1)
        for conn in list(server.connections):
            conn.abort("test drops it")
        with pytest.raises(ConnectionClosedError):
            await pending
        reply = await client.invoke(server.address, Frame(ECHO, fields={"i": 1}))
        assert reply.code == ResponseCode.SUCCESS
    finally:
        await client.close()
        await server.stop()


async def test_server_stops_reading_beyond_max_in_flight() -> None:
    server = RemotingServer(handler, max_in_flight=4)
    await server.start()
    client = RemotingClient()
    try:
        frames = [Frame(SLOW, fields={"i": i, "delay": 0.3}) for i in range(12)]
        started = asyncio.get_running_loop().time()
        await asyncio.gather(*(client.invoke(server.address, f, timeout=10) for f in frames))
        # 12 requests, 4 at a time, 0.3 s each: at least three rounds.
        assert asyncio.get_running_loop().time() - started >= 0.85
    finally:
        await client.close()
        await server.stop()


async def test_connect_refused_is_a_clear_error() -> None:
    client = RemotingClient(connect_timeout=1)
    try:
        with pytest.raises(ConnectionClosedError, match="cannot connect"):
            await client.invoke("127.0.0.1:1", Frame(ECHO))
    finally:
        await client.close()


async def test_a_timeout_on_a_silent_connection_drops_it_and_the_next_request_reconnects() -> None:
    # A peer that takes bytes and never answers: what a partition looks like to TCP (no FIN,
    # no RST). The timed-out request's connection must not carry the next requests.
    accepted: list[asyncio.StreamWriter] = []

    async def black_hole(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        while await reader.read(65536):
            pass

    hole = await asyncio.start_server(black_hole, "127.0.0.1", 0)
    addr = f"127.0.0.1:{hole.sockets[0].getsockname()[1]}"
    client = RemotingClient()
    try:
        other = asyncio.ensure_future(client.invoke(addr, Frame(ECHO), timeout=30))
        with pytest.raises(RequestTimeoutError):
            await client.invoke(addr, Frame(ECHO), timeout=0.2)
        # The other request on that connection fails at once rather than in 30 s.
        with pytest.raises(ConnectionClosedError):
            await asyncio.wait_for(other, 5)
        with pytest.raises(RequestTimeoutError):
            await client.invoke(addr, Frame(ECHO), timeout=0.2)
        assert len(accepted) == 2  # a new connection for the request after the timeout
    finally:
        await client.close()
        for w in accepted:
            w.close()
        hole.close()
        await hole.wait_closed()


async def test_a_timeout_on_a_connection_that_answers_others_keeps_it() -> None:
    server = RemotingServer(handler)
    await server.start()
    client = RemotingClient()
    try:
        silent = asyncio.ensure_future(client.invoke(server.address, Frame(SILENT), timeout=0.5))
        for i in range(5):  # answered while the silent one waits: the peer is alive, just slow
            await client.invoke(server.address, Frame(ECHO, fields={"i": i}))
            await asyncio.sleep(0.05)
        conn = await client.connection(server.address)
        with pytest.raises(RequestTimeoutError):
            await silent
        assert conn.is_open and await client.connection(server.address) is conn
        reply = await client.invoke(server.address, Frame(ECHO, fields={"i": 9}))
        assert reply.fields["i"] == 9 and len(server.connections) == 1
    finally:
        await client.close()
        await server.stop()


async def test_alive_until_waits_for_a_late_answer_while_the_peer_answers_others() -> None:
    """A producer's pipelined batch on a loaded broker: its answer comes after ``timeout`` but
    the peer keeps answering other requests, so the request waits (no resend) up to
    ``alive_until``; a peer that answers nothing still fails it after ``timeout``."""
    server = RemotingServer(handler)
    await server.start()
    client = RemotingClient()
    loop = asyncio.get_running_loop()
    try:
        late = Frame(SLOW, fields={"i": "late", "delay": 0.6})
        waiting = asyncio.ensure_future(
            client.invoke(server.address, late, timeout=0.2, alive_until=loop.time() + 5)
        )
        for i in range(50):  # answers to others while the late one waits: alive, behind
            if waiting.done():
                break
            await client.invoke(server.address, Frame(ECHO, fields={"i": i}))
            await asyncio.sleep(0.05)
        assert (await asyncio.wait_for(waiting, 5)).fields["i"] == "late"
        conn = await client.connection(server.address)
        assert conn.pending == {} and conn._alive_timers == {}
        # Without alive_until, the same late answer is a timeout.
        with pytest.raises(RequestTimeoutError):
            await client.invoke(
                server.address, Frame(SLOW, fields={"i": 1, "delay": 0.6}), timeout=0.2
            )
        # Nothing read for ``timeout``: fails as before, alive_until or not.
        t0 = loop.time()
        with pytest.raises(RequestTimeoutError):
            await client.invoke(
                server.address, Frame(SILENT), timeout=0.2, alive_until=loop.time() + 5
            )
        assert loop.time() - t0 < 2
        # Slow, then quiet: fails once nothing came for ``timeout``, and the connection goes.
        conn = await client.connection(server.address)
        quiet = asyncio.ensure_future(
            client.invoke(server.address, Frame(SILENT), timeout=0.2, alive_until=loop.time() + 5)
        )
        for i in range(3):
            await client.invoke(server.address, Frame(ECHO, fields={"i": i}))
            await asyncio.sleep(0.1)
        with pytest.raises(RequestTimeoutError):
            await asyncio.wait_for(quiet, 5)
        assert await client.connection(server.address) is not conn
        # alive_until bounds the wait even while others are answered.
        bounded = asyncio.ensure_future(
            client.invoke(server.address, Frame(SILENT), timeout=0.2, alive_until=loop.time() + 0.5)
        )
        for i in range(100):
            if bounded.done():
                break
            await client.invoke(server.address, Frame(ECHO, fields={"i": i}))
            await asyncio.sleep(0.05)
        with pytest.raises(RequestTimeoutError):
            await asyncio.wait_for(bounded, 5)
        conn = await client.connection(server.address)
        assert conn.pending == {} and conn._alive_timers == {}
    finally:
        await client.close()
        await server.stop()


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


async def test_tls(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.create_default_context(cafile=str(cert))
    server = RemotingServer(handler, ssl_context=server_ctx)
    await server.start()
    client = RemotingClient(ssl_context=client_ctx)
    plain = RemotingClient(connect_timeout=1)
    try:
        reply = await client.invoke(server.address, Frame(ECHO, fields={"i": 7}, body=b"secret"))
        assert reply.body == b"secret"
        # A client without TLS gets no answer: the server closes the connection.
        with pytest.raises((ConnectionClosedError, RequestTimeoutError)):
            await plain.invoke(server.address, Frame(ECHO), timeout=1)
    finally:
        await client.close()
        await plain.close()
        await server.stop()

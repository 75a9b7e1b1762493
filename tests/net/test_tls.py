"""TLS on a Remoting listener: required, permissive, mutual TLS, TLS >= 1.2, reload."""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import warnings
from pathlib import Path

import pytest

from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from orbitmq.net.connection import Connection, ConnectionClosedError, Reply
from orbitmq.net.limits import REASON_PLAINTEXT, REASON_TLS
from orbitmq.net.server import RemotingServer
from orbitmq.net.tls import ContextSource, client_context, reload_all, server_context
from orbitmq.protocol.frame import Frame, FrameDecoder, encode_bytes
from tests.net.pki import Ca

ECHO = 1


class Recorder:
    def __init__(self) -> None:
        self.principals: list[str | None] = []

    async def __call__(self, frame: Frame, conn: Connection) -> Reply:
        self.principals.append(conn.principal)
        return frame.reply(ResponseCode.SUCCESS, body=frame.body)


@pytest.fixture
def pki(tmp_path: Path) -> tuple[Ca, Path, Path]:
    ca = Ca.make(tmp_path)
    cert, key = ca.issue(tmp_path, "localhost", ip="127.0.0.1")
    return ca, cert, key


def _server(handler: Recorder, mode: str, cert: Path, key: Path, **tls: str) -> RemotingServer:
    source = ContextSource(
        lambda: server_context(str(cert), str(key), **tls), [str(cert), str(key)]
    )
    return RemotingServer(handler, tls=source, tls_mode=mode)


def _plain_exchange(port: int) -> bytes:
    """Send one plaintext frame and read what comes back (b"" if closed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(encode_bytes(Frame(ECHO, opaque=1, body=b"hi")))
        sock.settimeout(5)
        try:
            return sock.recv(65536)
        except ConnectionResetError:
            return b""


async def test_required_mode_serves_tls_and_refuses_plaintext(pki: tuple[Ca, Path, Path]) -> None:
    ca, cert, key = pki
    handler = Recorder()
    server = _server(handler, "required", cert, key)
    await server.start()
    client = RemotingClient(ssl_context=client_context(ca_file=str(ca.file)))
    try:
        reply = await client.invoke(server.address, Frame(ECHO, body=b"x"), timeout=5)
        assert reply.body == b"x"
        conn = await client.connection(server.address)
        assert conn.transport is not None
        version = conn.transport.get_extra_info("ssl_object").version()
        assert version in ("TLSv1.2", "TLSv1.3")
        got = await asyncio.to_thread(_plain_exchange, server.port)
        assert got == b""
        assert server.refusals.counts[REASON_PLAINTEXT] == 1
        assert len(handler.principals) == 1  # the plaintext frame reached no handler
    finally:
        await client.close()
        await server.stop()


async def test_permissive_mode_serves_both_on_one_port(pki: tuple[Ca, Path, Path]) -> None:
    ca, cert, key = pki
    handler = Recorder()
    server = _server(handler, "permissive", cert, key)
    await server.start()
    tls_client = RemotingClient(ssl_context=client_context(ca_file=str(ca.file)))
    plain_client = RemotingClient()
    try:
        for client in (tls_client, plain_client):
            reply = await client.invoke(server.address, Frame(ECHO, body=b"y"), timeout=5)
            assert reply.body == b"y"
        assert [c.tls for c in server.connections].count(True) == 1
        assert len(server.connections) == 2
    finally:
        await tls_client.close()
        await plain_client.close()
        await server.stop()


async def test_clients_verify_the_server_by_default(pki: tuple[Ca, Path, Path]) -> None:
    _ca, cert, key = pki
    server = _server(Recorder(), "required", cert, key)
    await server.start()
    client = RemotingClient(ssl_context=client_context())  # system roots only
    try:
        with pytest.raises(ConnectionClosedError, match="CERTIFICATE_VERIFY_FAILED"):
            await client.invoke(server.address, Frame(ECHO), timeout=5)
    finally:
        await client.close()
        await server.stop()


async def test_tls_below_1_2_is_refused(pki: tuple[Ca, Path, Path]) -> None:
    ca, cert, key = pki
    server = _server(Recorder(), "required", cert, key)
    await server.start()
    assert server.tls is not None
    assert server.tls.current.minimum_version == ssl.TLSVersion.TLSv1_2
    old = client_context(ca_file=str(ca.file))
    old.set_ciphers("DEFAULT:@SECLEVEL=0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old.minimum_version = ssl.TLSVersion.TLSv1
        old.maximum_version = ssl.TLSVersion.TLSv1_1
    client = RemotingClient(ssl_context=old)
    try:
        with pytest.raises(ConnectionClosedError):
            await client.invoke(server.address, Frame(ECHO), timeout=5)
    finally:
        await client.close()
        await server.stop()


async def test_mutual_tls_rejects_missing_wrong_and_expired_certificates(
    pki: tuple[Ca, Path, Path], tmp_path: Path
) -> None:
    ca, cert, key = pki
    good_cert, good_key = ca.issue(tmp_path, "producer-1")
    rogue = Ca.make(tmp_path / "..", name=f"rogue-{tmp_path.name}")
    bad_cert, bad_key = rogue.issue(tmp_path, "intruder")
    old_cert, old_key = ca.issue(tmp_path, "expired-client", expired=True)
    handler = Recorder()
    server = _server(handler, "required", cert, key, ca_file=str(ca.file), client_auth="required")
    await server.start()
    ok = RemotingClient(
        ssl_context=client_context(
            ca_file=str(ca.file), cert_file=str(good_cert), key_file=str(good_key)
        )
    )
    none = RemotingClient(ssl_context=client_context(ca_file=str(ca.file)))
    wrong = RemotingClient(
        ssl_context=client_context(
            ca_file=str(ca.file), cert_file=str(bad_cert), key_file=str(bad_key)
        )
    )
    expired = RemotingClient(
        ssl_context=client_context(
            ca_file=str(ca.file), cert_file=str(old_cert), key_file=str(old_key)
        )
    )
    try:
        reply = await ok.invoke(server.address, Frame(ECHO, body=b"z"), timeout=5)
        assert reply.body == b"z"
        assert handler.principals == ["producer-1"]
        for client in (none, wrong, expired):
            # TLS 1.3 clients finish their side first: the refusal arrives as a closed link.
            with pytest.raises((ConnectionClosedError, ssl.SSLError)):
                await client.invoke(server.address, Frame(ECHO), timeout=5)
        assert handler.principals == ["producer-1"]  # no application byte got through
        for _ in range(50):
            if server.refusals.counts[REASON_TLS] >= 3:
                break
            await asyncio.sleep(0.05)
        assert server.refusals.counts[REASON_TLS] == 3
    finally:
        for client in (ok, none, wrong, expired):
            await client.close()
        await server.stop()


async def test_certificate_reload_applies_to_new_connections(
    pki: tuple[Ca, Path, Path], tmp_path: Path
) -> None:
    ca, cert, key = pki
    other = Ca.make(tmp_path / "..", name=f"next-{tmp_path.name}")
    (tmp_path / "next").mkdir()
    next_cert, next_key = other.issue(tmp_path / "next", "localhost", ip="127.0.0.1")
    server = _server(Recorder(), "required", cert, key)
    await server.start()
    old_client = RemotingClient(ssl_context=client_context(ca_file=str(ca.file)))
    new_client = RemotingClient(ssl_context=client_context(ca_file=str(other.file)))
    try:
        await old_client.invoke(server.address, Frame(ECHO), timeout=5)
        with pytest.raises(ConnectionClosedError):
            await new_client.invoke(server.address, Frame(ECHO), timeout=5)
        shutil.copyfile(next_cert, cert)
        shutil.copyfile(next_key, key)
        deadline = asyncio.get_running_loop().time() + 2.0  # the brief's T9 bound
        while True:
            try:
                await new_client.invoke(server.address, Frame(ECHO), timeout=5)
                break
            except ConnectionClosedError:
                assert asyncio.get_running_loop().time() < deadline, "not reloaded in 2 s"
                await asyncio.sleep(0.1)
        # The connection made before the swap is still up and serving.
        reply = await old_client.invoke(server.address, Frame(ECHO, body=b"old"), timeout=5)
        assert reply.body == b"old"
        assert server.tls is not None and server.tls.reloads == 1
        assert reload_all() >= 1  # SIGHUP's path rebuilds even without a change
    finally:
        await old_client.close()
        await new_client.close()
        await server.stop()


def test_decoder_refuses_a_2gib_length_before_buffering() -> None:
    decoder = FrameDecoder()
    with pytest.raises(Exception, match="outside"):
        decoder.feed(b"\x80\x00\x00\x00" + bytes(12))

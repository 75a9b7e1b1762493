"""The front port's kernel splice (:mod:`orbitmq.proxy.splice`): bytes unchanged both ways
with back-pressure, EOF carried as a half-close, a reset ending both sides; the proxy's
permissive port carries gRPC through it, and required mode binds gRPC's own TLS port."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket

import grpc
import pytest

from orbitmq.proxy import splice
from orbitmq.proxy.splice import Splice
from tests.proxy.conftest import ProxyEnv, proxy_env_fixture
from tests.proxy.test_tls import _route, _send, _tls_channel

pytestmark = pytest.mark.skipif(not splice.AVAILABLE, reason="os.splice is Linux only")

TOPICS = {"TlsT": "NORMAL"}
env = proxy_env_fixture(TOPICS)  # permissive: the front port, spliced
required_env = proxy_env_fixture(TOPICS, proxy_options={"tls_mode": "required"})
capped_env = proxy_env_fixture(
    TOPICS, proxy_options={"tls_mode": "required", "limit_connections": True}
)


def _pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    return a, b


async def _read_all(loop: asyncio.AbstractEventLoop, sock: socket.socket, pace: float) -> bytes:
    got = bytearray()
    while True:
        chunk = await asyncio.wait_for(loop.sock_recv(sock, 1 << 16), 10)
        if not chunk:
            return bytes(got)
        got += chunk
        if pace:  # a slow reader: the splice must hold back, not buffer without end
            await asyncio.sleep(pace)


async def test_bytes_cross_unchanged_both_ways_and_eof_is_a_half_close() -> None:
    loop = asyncio.get_running_loop()
    client, front = _pair()
    back, server = _pair()
    closed: list[int] = []
    s = Splice(front, back, lambda: closed.append(1), loop)
    up, down = os.urandom(6 << 20), os.urandom(3 << 20)

    async def send(sock: socket.socket, data: bytes) -> None:
        await loop.sock_sendall(sock, data)
        sock.shutdown(socket.SHUT_WR)

    try:
        got_up, got_down, *_ = await asyncio.gather(
            _read_all(loop, server, 0.002),
            _read_all(loop, client, 0),
            send(client, up),
            send(server, down),
        )
        assert hashlib.sha256(got_up).digest() == hashlib.sha256(up).digest()
        assert hashlib.sha256(got_down).digest() == hashlib.sha256(down).digest()
        for _ in range(100):  # both directions ended: the splice closes itself
            if closed:
                break
            await asyncio.sleep(0.01)
        assert closed == [1] and s.closed and s.moved == len(up) + len(down)
    finally:
        s.close()
        client.close()
        server.close()
    assert closed == [1]  # once


async def test_a_reset_end_closes_the_other() -> None:
    loop = asyncio.get_running_loop()
    client, front = _pair()
    back, server = _pair()
    closed: list[int] = []
    s = Splice(front, back, lambda: closed.append(1), loop)
    try:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
        await loop.sock_sendall(server, b"x" * 1000)  # unread by the client: close resets
        await asyncio.sleep(0.05)
        client.close()
        assert await _read_all(loop, server, 0) == b""
        assert closed == [1] and s.closed
    finally:
        s.close()
        server.close()


async def test_permissive_port_carries_grpc_through_the_kernel_splice(env: ProxyEnv) -> None:
    mux = env.proxy._mux
    assert mux is not None and mux.splice
    big = os.urandom(1 << 20)
    async with _tls_channel(env) as tls, grpc.aio.insecure_channel(env.endpoint) as plain:
        for channel in (tls, plain):
            assert (await _send(channel, big)).status.code == 20000

        async def moved() -> list[int]:
            return [f.splice.moved for f in mux.fronts if f.splice is not None]

        carried = env.run(moved())
        assert len(carried) >= 2 and sum(carried) > 2 * len(big)


async def test_required_mode_binds_grpcs_own_tls_port(required_env: ProxyEnv) -> None:
    assert required_env.proxy._mux is None  # no front port: no relay at all
    async with _tls_channel(required_env) as tls:
        assert (await _route(tls, required_env)).status.code == 20000
        assert (await _send(tls, os.urandom(1 << 20))).status.code == 20000


async def test_required_mode_with_connection_caps_keeps_the_front_port(
    capped_env: ProxyEnv,
) -> None:
    mux = capped_env.proxy._mux
    assert mux is not None and mux.admission is not None and mux.plain_port is None
    async with _tls_channel(capped_env) as tls:
        assert (await _route(tls, capped_env)).status.code == 20000
    async with grpc.aio.insecure_channel(capped_env.endpoint) as plain:
        with pytest.raises(grpc.aio.AioRpcError):
            await _route(plain, capped_env)


@pytest.mark.parametrize("kernel", [True, False], ids=["splice", "protocols"])
async def test_the_mux_names_the_client_behind_its_loopback_connection(kernel: bool) -> None:
    """gRPC sees connections through the front port coming from loopback; ``peer_of`` gives
    back the client's own address (ACL source ranges, per-address quotas)."""
    from orbitmq.proxy.tls import PortMux

    seen: asyncio.Queue[tuple[str, int]] = asyncio.Queue()

    async def backend(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await seen.put(w.get_extra_info("peername")[:2])
        w.write(await r.read(5))
        await w.drain()
        w.close()

    server = await asyncio.start_server(backend, "127.0.0.1", 0)
    mux = PortMux("permissive", None, server.sockets[0].getsockname()[1], splice=kernel)
    port = await mux.start("127.0.0.1", 0)
    loop = asyncio.get_running_loop()
    client = socket.socket()
    client.setblocking(False)
    try:
        client.bind(("127.0.0.2", 0))  # another loopback address than gRPC's side
        await loop.sock_connect(client, ("127.0.0.1", port))
        await loop.sock_sendall(client, b"PRI *")
        host, back_port = await asyncio.wait_for(seen.get(), 10)
        assert host == "127.0.0.1"
        want = f"ipv4:127.0.0.2:{client.getsockname()[1]}"
        assert mux.peer_of(f"ipv4:127.0.0.1:{back_port}") == want
        assert mux.peer_of("ipv4:10.1.2.3:4") == "ipv4:10.1.2.3:4"  # not ours: as it is
        assert await asyncio.wait_for(loop.sock_recv(client, 5), 10) == b"PRI *"
    finally:
        client.close()
        for _ in range(200):  # the connection's end forgets its origin
            if not mux.origins:
                break
            await asyncio.sleep(0.01)
        assert not mux.origins
        await mux.stop()
        server.close()
        await server.wait_closed()

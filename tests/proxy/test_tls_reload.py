"""The proxy picks up a replaced certificate without a restart: a client trusting only the new
CA is refused before the swap and served within 2 s after it."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import grpc

from orbitmq.proxy.config import ProxyConfig
from orbitmq.proxy.server import ProxyServer
from tests.net.pki import Ca
from tests.proxy.conftest import ProxyEnv, proxy_env_fixture
from tests.proxy.test_tls import _route

required_env = proxy_env_fixture({"TlsT": "NORMAL"}, proxy_options={"tls_mode": "required"})


async def test_certificate_swap_applies_to_new_connections(
    required_env: ProxyEnv, tmp_path: Path
) -> None:
    first, second = Ca.make(tmp_path, "first-ca"), Ca.make(tmp_path, "second-ca")
    (tmp_path / "next").mkdir()
    cert, key = first.issue(tmp_path, "localhost", ip="127.0.0.1")
    next_cert, next_key = second.issue(tmp_path / "next", "localhost", ip="127.0.0.1")
    config = ProxyConfig(
        namesrv_addrs=(required_env.ns,),
        port=0,
        tls_mode="required",
        tls_cert_file=str(cert),
        tls_key_file=str(key),
    )
    loop = required_env.thread.loop
    proxy = await asyncio.wrap_future(
        asyncio.run_coroutine_threadsafe(ProxyServer(config).start(), loop)
    )

    async def route_with(ca: Ca) -> int:
        creds = grpc.ssl_channel_credentials(root_certificates=ca.file.read_bytes())
        options = (("grpc.ssl_target_name_override", "localhost"),)
        async with grpc.aio.secure_channel(proxy.address, creds, options=options) as channel:
            return (await _route(channel, required_env)).status.code

    try:
        assert await route_with(first) == 20000
        try:
            await route_with(second)
            raise AssertionError("a client of the second CA was served before the swap")
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAVAILABLE
        shutil.copyfile(next_cert, cert)
        shutil.copyfile(next_key, key)
        deadline = time.monotonic() + 2.0
        while True:
            try:
                assert await route_with(second) == 20000
                break
            except grpc.aio.AioRpcError:
                assert time.monotonic() < deadline, "new certificate not served within 2 s"
                await asyncio.sleep(0.1)
    finally:
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(proxy.stop(0), loop))

"""The HA replication port takes a new certificate, key and client CA without a restart
(issue #16, "certificate reload without restart"), as the Remoting listeners do: a change of
the files applies to the next handshake within 2 s, and SIGHUP's path rebuilds at once."""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import time
from pathlib import Path

from orbitmq.net.tls import client_context, reload_all
from orbitmq.testing import small_broker_config
from tests.broker.ha.test_replication import ha_of, running
from tests.net.pki import Ca


def _handshake(port: int, ctx: ssl.SSLContext) -> bool:
    """True if a TLS session (client certificate included) is set up with the port."""
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            tls.settimeout(0.3)
            try:
                # TLS 1.3 reports a refused client certificate only here: an alert or a close
                return tls.recv(1) != b""
            except TimeoutError:
                return True  # the master waits for the slave's first request: accepted
    except (ssl.SSLError, ConnectionError):
        return False


async def test_ha_port_reloads_certificate_and_client_ca(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    ca1, ca2 = Ca.make(first, "ca-one"), Ca.make(second, "ca-two")
    cert1, key1 = ca1.issue(first, "localhost", ip="127.0.0.1")
    cert2, key2 = ca2.issue(second, "localhost", ip="127.0.0.1")
    live = tmp_path / "live"
    live.mkdir()
    cert, key, ca = live / "broker.crt", live / "broker.key", live / "ca.pem"
    for src, dst in ((cert1, cert), (key1, key), (ca1.file, ca)):
        shutil.copyfile(src, dst)
    old = client_context(ca_file=str(ca1.file), cert_file=str(cert1), key_file=str(key1))
    new = client_context(ca_file=str(ca2.file), cert_file=str(cert2), key_file=str(key2))
    cfg = small_broker_config(
        tmp_path / "m", ha_enable=True, ha_port=0, tls_mode="required",
        tls_cert_file=str(cert), tls_key_file=str(key), tls_ca_file=str(ca),
        tls_client_auth="required", tls_reload_interval_s=0.1,
    )  # fmt: skip
    async with running(cfg) as master:
        port = ha_of(master).port
        assert await asyncio.to_thread(_handshake, port, old)
        assert not await asyncio.to_thread(_handshake, port, new)
        # the operator rotates to a new CA: server certificate, key and client CA together
        for src, dst in ((cert2, cert), (key2, key), (ca2.file, ca)):
            shutil.copyfile(src, dst)
        deadline = time.monotonic() + 2.0  # the brief's T9 bound
        while not await asyncio.to_thread(_handshake, port, new):
            assert time.monotonic() < deadline, "HA port not reloaded in 2 s"
            await asyncio.sleep(0.1)
        # the old chain is refused both ways: its client does not trust the new server
        # certificate, and a client certificate of the old CA is no longer accepted
        assert not await asyncio.to_thread(_handshake, port, old)
        old_ca_trusting_new = client_context(
            ca_file=str(ca2.file), cert_file=str(cert1), key_file=str(key1)
        )
        assert not await asyncio.to_thread(_handshake, port, old_ca_trusting_new)
        assert reload_all() >= 1  # SIGHUP's path rebuilds the HA port's source too
        assert await asyncio.to_thread(_handshake, port, new)


async def test_sighup_reloads_the_ha_context_at_once(tmp_path: Path) -> None:
    """With a poll interval of an hour, only SIGHUP's path (reload_all) can apply the change."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    ca1, ca2 = Ca.make(first, "ca-one"), Ca.make(second, "ca-two")
    cert1, key1 = ca1.issue(first, "localhost", ip="127.0.0.1")
    cert2, key2 = ca2.issue(second, "localhost", ip="127.0.0.1")
    cert, key = tmp_path / "broker.crt", tmp_path / "broker.key"
    shutil.copyfile(cert1, cert)
    shutil.copyfile(key1, key)
    cfg = small_broker_config(
        tmp_path / "m", ha_enable=True, tls_mode="required", tls_cert_file=str(cert),
        tls_key_file=str(key), tls_reload_interval_s=3600.0,
    )  # fmt: skip
    ctx = cfg.ha_server_ssl()
    assert ctx is not None

    async def idle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    server = await asyncio.start_server(idle, "127.0.0.1", 0, ssl=ctx)
    port = server.sockets[0].getsockname()[1]
    old, new = client_context(ca_file=str(ca1.file)), client_context(ca_file=str(ca2.file))
    try:
        assert await asyncio.to_thread(_handshake, port, old)
        shutil.copyfile(cert2, cert)
        shutil.copyfile(key2, key)
        assert not await asyncio.to_thread(_handshake, port, new)  # not polled for an hour
        assert reload_all() >= 1
        assert await asyncio.to_thread(_handshake, port, new)
        assert not await asyncio.to_thread(_handshake, port, old)
    finally:
        server.close()
        await server.wait_closed()

"""Every port a NameServer and a replicated broker pair bind speaks TLS 1.2+ in required mode:
plaintext is refused, a client without a certificate or with one from another CA is refused
before any application byte (the HA link included), and the inner links (broker ->
NameServer, slave -> master) work over mutual TLS."""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path

from orbitmq.namesrv.config import NamesrvConfig
from orbitmq.net.tls import client_context
from orbitmq.testing import small_broker_config
from orbitmq.testing.servers import run_namesrv
from tests.broker.ha.test_replication import ha_of, in_sync, running, wait_until
from tests.net.pki import Ca


def _tls_version(port: int, ctx: ssl.SSLContext) -> str | None:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        tls.settimeout(0.3)
        try:
            tls.recv(1)  # TLS 1.3 reports a refused client certificate only here
        except TimeoutError:
            pass  # nothing to read: the server accepted us and waits for a request
        except (ssl.SSLError, ConnectionError):
            return None
        return tls.version()


def _refused(port: int, ctx: ssl.SSLContext | None) -> bool:
    try:
        if ctx is None:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
                raw.sendall(b"\x00\x00\x00\x10" + bytes(16))
                raw.settimeout(5)
                return raw.recv(100) == b""
        return _tls_version(port, ctx) is None
    except (ssl.SSLError, ConnectionError):
        return True


async def test_every_port_requires_tls_and_client_certificates(tmp_path: Path) -> None:
    ca = Ca.make(tmp_path)
    cert, key = ca.issue(tmp_path, "localhost", ip="127.0.0.1")
    tls = {
        "tls_mode": "required",
        "tls_cert_file": str(cert),
        "tls_key_file": str(key),
        "tls_ca_file": str(ca.file),
        "tls_client_auth": "required",
        "tls_outbound": True,
    }
    good = client_context(ca_file=str(ca.file), cert_file=str(cert), key_file=str(key))
    no_cert = client_context(ca_file=str(ca.file))
    rogue = Ca.make(tmp_path / "..", name=f"rogue-{tmp_path.name}")
    (tmp_path / "rogue").mkdir()
    bad_cert, bad_key = rogue.issue(tmp_path / "rogue", "localhost", ip="127.0.0.1")
    wrong_ca = client_context(ca_file=str(ca.file), cert_file=str(bad_cert), key_file=str(bad_key))
    ns_tls = {k: v for k, v in tls.items() if k != "tls_outbound"}
    async with run_namesrv(NamesrvConfig(port=0, **ns_tls)) as ns:  # type: ignore[arg-type]
        master_cfg = small_broker_config(
            tmp_path / "m", ha_enable=True, ha_port=0, namesrv_addrs=(ns.address,), **tls
        )
        async with running(master_cfg) as master:
            slave_cfg = small_broker_config(
                tmp_path / "s",
                ha_enable=True,
                broker_id=1,
                ha_master_address=f"127.0.0.1:{ha_of(master).port}",
                **tls,
            )
            async with running(slave_cfg) as slave:
                await in_sync(master)  # slave -> master over mutual TLS
                await wait_until(lambda: ns.routes.broker_count >= 1)  # broker -> NameServer
                ports = [ns.port, master.port, ha_of(master).port, slave.port]
                for port in ports:
                    version = await asyncio.to_thread(_tls_version, port, good)
                    assert version in ("TLSv1.2", "TLSv1.3"), (port, version)
                    for ctx in (None, no_cert, wrong_ca):
                        assert await asyncio.to_thread(_refused, port, ctx), (port, ctx)
                assert ns.server.refusals.counts["plaintext_refused"] == 1
                assert master.server.refusals.counts["tls_handshake_failed"] >= 1


async def test_metrics_endpoint_over_tls_when_asked(tmp_path: Path) -> None:
    import http.client
    import urllib.error
    import urllib.request

    ca = Ca.make(tmp_path)
    cert, key = ca.issue(tmp_path, "localhost", ip="127.0.0.1")
    config = NamesrvConfig(
        port=0, metrics_port=0, metrics_tls=True, tls_cert_file=str(cert), tls_key_file=str(key)
    )
    async with run_namesrv(config) as ns:
        url = f"https://127.0.0.1:{ns.metrics_port}/metrics"
        ctx = client_context(ca_file=str(ca.file))

        def fetch(address: str, context: ssl.SSLContext | None) -> bytes:
            with urllib.request.urlopen(address, context=context, timeout=5) as resp:
                return bytes(resp.read())

        assert b"orbitmq_net_refused_total" in await asyncio.to_thread(fetch, url, ctx)
        plain = url.replace("https://", "http://")
        try:
            await asyncio.to_thread(fetch, plain, None)
            raise AssertionError("plain HTTP served by a TLS metrics endpoint")
        except (urllib.error.URLError, ConnectionError, http.client.HTTPException):
            pass


async def test_sdk_producer_over_mutual_tls(tmp_path: Path) -> None:
    """The SDK with ``ssl_context=client_context(...)``: it verifies the servers, shows its
    certificate, and sends through a mutual-TLS-only NameServer and broker."""
    from orbitmq.client import AsyncProducer, Message

    ca = Ca.make(tmp_path)
    cert, key = ca.issue(tmp_path, "localhost", ip="127.0.0.1")
    tls = {
        "tls_mode": "required",
        "tls_cert_file": str(cert),
        "tls_key_file": str(key),
        "tls_ca_file": str(ca.file),
        "tls_client_auth": "required",
    }
    async with run_namesrv(NamesrvConfig(port=0, **tls)) as ns:  # type: ignore[arg-type]
        config = small_broker_config(
            tmp_path / "b", namesrv_addrs=(ns.address,), tls_outbound=True, **tls
        )
        async with running(config) as broker:
            await wait_until(lambda: ns.routes.broker_count >= 1)
            ctx = client_context(ca_file=str(ca.file), cert_file=str(cert), key_file=str(key))
            async with AsyncProducer([ns.address], ssl_context=ctx) as producer:
                result = await producer.send(Message("TlsTopic", b"over mutual TLS"))
            assert result.queue_offset == 0
            assert broker.store.wait_for_dispatch()
            assert broker.store.max_offset("TlsTopic", result.message_queue.queue_id) == 1

"""TLS and plaintext on the proxy's one port (:mod:`orbitmq.proxy.tls`): permissive serves
both, required refuses plaintext, off has no splice at all; junk on the port never stops it."""

from __future__ import annotations

import asyncio
import datetime
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orbitmq.common.errors import ConfigError
from orbitmq.proxy.config import ProxyConfig
from orbitmq.proxy.grpc_v2 import service_pb2 as svc
from orbitmq.proxy.grpc_v2 import service_pb2_grpc
from orbitmq.proxy.server import ProxyServer
from orbitmq.proxy.tls import TlsIdentity, read_pem, self_signed
from tests.proxy.conftest import ProxyEnv, endpoints_pb, metadata, proxy_env_fixture, res

TOPICS = {"TlsT": "NORMAL"}
env = proxy_env_fixture(TOPICS)  # the default: permissive
required_env = proxy_env_fixture(TOPICS, proxy_options={"tls_mode": "required"})
off_env = proxy_env_fixture(TOPICS, proxy_options={"tls_mode": "off"})


def _tls_channel(env: ProxyEnv) -> grpc.aio.Channel:
    assert env.proxy.tls_cert_pem is not None
    creds = grpc.ssl_channel_credentials(root_certificates=env.proxy.tls_cert_pem)
    return grpc.aio.secure_channel(env.endpoint, creds)


async def _route(channel: grpc.aio.Channel, env: ProxyEnv) -> svc.QueryRouteResponse:
    stub = service_pb2_grpc.MessagingServiceStub(channel)
    return await stub.QueryRoute(
        svc.QueryRouteRequest(topic=res("TlsT"), endpoints=endpoints_pb(env.endpoint)),
        metadata=metadata(),
        timeout=10,
    )


async def _send(channel: grpc.aio.Channel, body: bytes) -> svc.SendMessageResponse:
    from orbitmq.proxy.grpc_v2 import definition_pb2 as pb

    stub = service_pb2_grpc.MessagingServiceStub(channel)
    msg = pb.Message(
        topic=res("TlsT"),
        body=body,
        system_properties=pb.SystemProperties(
            message_id="0102030405060708090A0B0C0D0E0F10", message_type=pb.MessageType.NORMAL
        ),
    )
    return await stub.SendMessage(
        svc.SendMessageRequest(messages=[msg]), metadata=metadata(), timeout=10
    )


async def test_permissive_serves_tls_and_plaintext_on_one_port(env: ProxyEnv) -> None:
    async with _tls_channel(env) as tls, grpc.aio.insecure_channel(env.endpoint) as plain:
        for channel in (tls, plain):
            got = await _route(channel, env)
            assert got.status.code == 20000, got.status
            # QueryRoute names the public port, the one the client used.
            assert {a.port for q in got.message_queues for a in q.broker.endpoints.addresses} == {
                env.proxy.port
            }
        big = bytes(range(256)) * 4096  # 1 MiB: many frames through the splice, both ways
        for channel in (tls, plain):
            sent = await _send(channel, big)
            assert sent.status.code == 20000, sent.status


async def test_required_refuses_plaintext_and_keeps_serving_tls(required_env: ProxyEnv) -> None:
    async with grpc.aio.insecure_channel(required_env.endpoint) as plain:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _route(plain, required_env)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    async with _tls_channel(required_env) as tls:
        assert (await _route(tls, required_env)).status.code == 20000


async def test_off_binds_grpc_itself(off_env: ProxyEnv) -> None:
    assert off_env.proxy.tls_cert_pem is None and off_env.proxy._mux is None
    async with grpc.aio.insecure_channel(off_env.endpoint) as plain:
        assert (await _route(plain, off_env)).status.code == 20000


def _poke(port: int, data: bytes, *, half_close: bool) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        if data:
            s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        s.settimeout(2)
        try:
            while s.recv(65536):
                pass
        except (TimeoutError, ConnectionResetError):
            pass


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=300), half_close=st.booleans())
def test_junk_on_the_port_leaves_the_proxy_serving(
    env: ProxyEnv, data: bytes, half_close: bool
) -> None:
    _poke(env.proxy.port, data, half_close=half_close)
    # A TLS-looking first byte with junk after it goes to gRPC's TLS port, which drops it.
    _poke(env.proxy.port, b"\x16" + data, half_close=half_close)

    async def still_serving() -> int:
        async with grpc.aio.insecure_channel(env.endpoint) as plain:
            return int((await _route(plain, env)).status.code)

    assert asyncio.run(still_serving()) == 20000


async def test_front_connections_end_with_their_clients(env: ProxyEnv) -> None:
    """A splice lasts as long as its client: the mux tracks each front connection until it ends."""
    async with grpc.aio.insecure_channel(env.endpoint) as plain:
        await _route(plain, env)
        mux = env.proxy._mux
        assert mux is not None

        async def count() -> int:
            return len(mux.fronts)

        assert env.run(count()) >= 1
    deadline = asyncio.get_running_loop().time() + 10
    while env.run(count()) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    assert env.run(count()) == 0


def test_self_signed_names_its_hosts() -> None:
    from cryptography import x509

    ident = self_signed(["localhost", "127.0.0.1", "mq.example"])
    cert = x509.load_pem_x509_certificate(ident.cert_pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "mq.example"}
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert b"PRIVATE KEY" in ident.key_pem


def _issue(ca: TlsIdentity, common_name: str, names: Sequence[Any] = ()) -> TlsIdentity:
    """A client certificate for ``common_name`` signed by ``ca`` (a self_signed identity), with
    ``names`` (``cryptography`` GeneralNames) as its subjectAltName when given."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    )
    if names:
        cert = cert.add_extension(x509.SubjectAlternativeName(list(names)), critical=False)
    return TlsIdentity.of(cert.sign(ca_key, hashes.SHA256()), key)


async def test_mutual_tls_admits_only_clients_with_a_certificate_of_the_ca(
    required_env: ProxyEnv, tmp_path: Path
) -> None:
    ca, other_ca = self_signed(["Clients CA"]), self_signed(["Another CA"])
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem)
    config = ProxyConfig(
        namesrv_addrs=(required_env.ns,),
        port=0,
        tls_mode="required",
        tls_client_ca_file=str(tmp_path / "ca.pem"),
    )
    loop = required_env.thread.loop
    proxy = await asyncio.wrap_future(
        asyncio.run_coroutine_threadsafe(ProxyServer(config).start(), loop)
    )
    try:
        assert proxy.tls_cert_pem is not None

        def channel(client: TlsIdentity | None) -> grpc.aio.Channel:
            creds = grpc.ssl_channel_credentials(
                root_certificates=proxy.tls_cert_pem,
                private_key=client.key_pem if client else None,
                certificate_chain=client.cert_pem if client else None,
            )
            return grpc.aio.secure_channel(proxy.address, creds)

        async with channel(_issue(ca, "app-1")) as ok:
            assert (await _route(ok, required_env)).status.code == 20000
        for refused in (None, _issue(other_ca, "intruder")):
            async with channel(refused) as bad:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await _route(bad, required_env)
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        async with grpc.aio.insecure_channel(proxy.address) as plain:
            with pytest.raises(grpc.aio.AioRpcError):
                await _route(plain, required_env)
    finally:
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(proxy.stop(0), loop))


def test_mutual_tls_needs_required_mode_and_a_readable_ca(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tls_mode=required"):
        ProxyConfig(tls_mode="permissive", tls_client_ca_file="ca.pem")
    with pytest.raises(ConfigError, match="cannot read"):
        read_pem(str(tmp_path / "missing.pem"))
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(ConfigError, match="not a PEM file"):
        read_pem(str(tmp_path / "junk.pem"))

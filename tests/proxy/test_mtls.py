"""Mutual TLS principals on the gRPC proxy (:mod:`orbitmq.proxy.mtls`): with ACL on and a client
CA configured, a call without a signature is made by the user its verified certificate names
(Remoting's rule), then authorized by that user's ACL; a signature, when present, decides."""

from __future__ import annotations

import _ssl
import asyncio
import contextlib
import ipaddress
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from orbitmq.auth.model import PolicyEntry
from orbitmq.auth.store import AuthStore
from orbitmq.common.errors import ConfigError
from orbitmq.net.tls import peer_identity
from orbitmq.proxy.config import ProxyConfig
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.grpc_v2 import service_pb2 as svc
from orbitmq.proxy.grpc_v2 import service_pb2_grpc
from orbitmq.proxy.mtls import CertPrincipals, certificate_fields
from orbitmq.proxy.server import ProxyServer
from orbitmq.proxy.tls import TlsIdentity, self_signed
from tests.proxy.conftest import ProxyEnv, metadata, proxy_env_fixture, res
from tests.proxy.test_tls import _issue

Code = pb.Code
env = proxy_env_fixture({"MtlsA": "NORMAL", "MtlsB": "NORMAL"}, proxy_options={"tls_mode": "off"})
SECRETS = {"app-1": "app-1-secret", "bob": "bob-secret-1"}


@dataclass(frozen=True)
class Pki:
    ca: TlsIdentity
    app: TlsIdentity
    """CN app-1: Pub on MtlsA only."""
    stranger: TlsIdentity
    """CN stranger: no such user."""


@pytest.fixture(scope="module")
def pki() -> Pki:
    ca = self_signed(["Clients CA"])
    return Pki(ca, _issue(ca, "app-1"), _issue(ca, "stranger"))


@pytest.fixture
def auth_file(tmp_path: Path, pki: Pki) -> Path:
    store = AuthStore(tmp_path / "auth.json")
    for name, secret in SECRETS.items():
        store.create_user(name, secret)
    store.put_entries("app-1", [PolicyEntry.make("Topic:MtlsA", ["Pub"], "Allow")], create=True)
    store.put_entries("bob", [PolicyEntry.make("Topic:MtlsB", ["Pub"], "Allow")], create=True)
    (tmp_path / "ca.pem").write_bytes(pki.ca.cert_pem)
    return tmp_path / "auth.json"


@contextlib.asynccontextmanager
async def _proxy(env: ProxyEnv, **options: Any) -> AsyncIterator[ProxyServer]:
    """A proxy with ``options`` on the cluster's loop, stopped on the way out."""
    loop = env.thread.loop
    config = ProxyConfig(namesrv_addrs=(env.ns,), port=0, **options)
    proxy = await asyncio.wrap_future(
        asyncio.run_coroutine_threadsafe(ProxyServer(config).start(), loop)
    )
    try:
        yield proxy
    finally:
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(proxy.stop(0), loop))


def _channel(proxy: ProxyServer, client: TlsIdentity | None) -> grpc.aio.Channel:
    if client is None and proxy.config.tls_mode == "permissive":
        return grpc.aio.insecure_channel(proxy.address)
    creds = grpc.ssl_channel_credentials(
        root_certificates=proxy.tls_cert_pem,
        private_key=client.key_pem if client else None,
        certificate_chain=client.cert_pem if client else None,
    )
    return grpc.aio.secure_channel(proxy.address, creds)


async def _send(
    proxy: ProxyServer, client: TlsIdentity | None, topic: str, signer: str | None = None
) -> int:
    """The status code of a one-message send as ``client`` (a certificate; None: plaintext in
    permissive mode), signed by ``signer`` (a user of SECRETS, "wrong": a bad secret)."""
    if signer == "wrong":
        headers = metadata(ak="app-1", sk="not-the-secret")
    elif signer is not None:
        headers = metadata(ak=signer, sk=SECRETS[signer])
    else:
        headers = metadata()  # what a client without credentials sends: Credential=
    message = pb.Message(
        topic=res(topic),
        body=b"m",
        system_properties=pb.SystemProperties(
            message_id="0102030405060708090A0B0C0D0E0F10", message_type=pb.MessageType.NORMAL
        ),
    )
    async with _channel(proxy, client) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        resp = await stub.SendMessage(
            svc.SendMessageRequest(messages=[message]), metadata=headers, timeout=10
        )
    return int(resp.status.code)


def _general_names(*names: str) -> Iterator[Any]:
    from cryptography import x509

    for name in names:
        kind, _, value = name.partition(":")
        if kind == "DNS":
            yield x509.DNSName(value)
        elif kind == "IP":
            yield x509.IPAddress(ipaddress.ip_address(value))
        elif kind == "URI":
            yield x509.UniformResourceIdentifier(value)
        else:
            yield x509.RFC822Name(value)


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        ((), "cn-user"),
        (("DNS:app-2.clients",), "app-2.clients"),
        (("URI:spiffe://x/y", "email:a@b.c", "DNS:app-3"), "app-3"),
        (("IP:10.1.2.3", "DNS:app-4"), "10.1.2.3"),
        (("IP:2001:db8::1",), "2001:DB8:0:0:0:0:0:1"),
        (("URI:spiffe://x/y",), "cn-user"),
    ],
)
def test_a_certificate_names_the_user_remoting_would(
    pki: Pki, tmp_path: Path, names: tuple[str, ...], expected: str
) -> None:
    """The proxy's reading of a certificate against CPython's own (``getpeercert``'s shape,
    which Remoting connections use): the same principal."""
    cert = _issue(pki.ca, "cn-user", list(_general_names(*names))).cert_pem
    (tmp_path / "c.pem").write_bytes(cert)
    decode = getattr(_ssl, "_test_decode_cert", None)  # CPython's own test helper
    if decode is not None:
        assert peer_identity(certificate_fields(cert)) == peer_identity(
            decode(str(tmp_path / "c.pem"))
        )
    assert peer_identity(certificate_fields(cert)) == expected
    principals = CertPrincipals()
    assert principals.principal({"x509_pem_cert": [cert]}) == expected
    assert principals.principal({"x509_pem_cert": [cert]}) == expected  # remembered
    assert principals.principal({}) is None
    assert (
        certificate_fields(b"-----BEGIN CERTIFICATE-----\nnot\n-----END CERTIFICATE-----\n") is None
    )


async def test_required_mode_certificate_is_the_user(
    env: ProxyEnv, pki: Pki, auth_file: Path
) -> None:
    async with _proxy(
        env,
        tls_mode="required",
        tls_client_ca_file=str(auth_file.parent / "ca.pem"),
        acl_enabled=True,
        auth_file=str(auth_file),
    ) as proxy:
        assert await _send(proxy, pki.app, "MtlsA") == Code.OK
        assert await _send(proxy, pki.app, "MtlsB") == Code.FORBIDDEN  # RocketMQ's 40300
        assert await _send(proxy, pki.stranger, "MtlsA") == Code.UNAUTHORIZED
        # A signature decides, as on Remoting: a wrong one is refused despite the certificate,
        # and bob's right one is bob (Pub on MtlsB only), whatever the certificate says.
        assert await _send(proxy, pki.app, "MtlsA", signer="wrong") == Code.UNAUTHORIZED
        assert await _send(proxy, pki.app, "MtlsA", signer="bob") == Code.FORBIDDEN
        assert await _send(proxy, pki.app, "MtlsB", signer="bob") == Code.OK

        async def settings() -> AsyncIterator[svc.TelemetryCommand]:
            yield svc.TelemetryCommand(
                settings=pb.Settings(
                    client_type=pb.ClientType.PRODUCER,
                    publishing=pb.Publishing(topics=[res("MtlsB")]),
                )
            )

        async with _channel(proxy, pki.app) as channel:  # telemetry: the same principal
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            stream = stub.Telemetry(settings(), metadata=metadata(), timeout=10)
            first = await asyncio.wait_for(stream.read(), 10)
            assert first.status.code == Code.FORBIDDEN
        # A user disabled in the store is refused within a second (the file is re-read).
        AuthStore(auth_file).update_user("app-1", enabled=False)
        for _ in range(40):
            if await _send(proxy, pki.app, "MtlsA") == Code.UNAUTHORIZED:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("a disabled user's certificate still admitted after 2 s")


async def test_permissive_mode_certificate_or_signature(
    env: ProxyEnv, pki: Pki, auth_file: Path
) -> None:
    async with _proxy(
        env,
        tls_mode="permissive",
        tls_client_ca_file=str(auth_file.parent / "ca.pem"),
        acl_enabled=True,
        auth_file=str(auth_file),
    ) as proxy:
        assert await _send(proxy, pki.app, "MtlsA") == Code.OK  # TLS, through the splice
        assert await _send(proxy, pki.app, "MtlsB") == Code.FORBIDDEN
        assert await _send(proxy, None, "MtlsA") == Code.UNAUTHORIZED  # plaintext, unsigned
        assert await _send(proxy, None, "MtlsA", signer="app-1") == Code.OK  # plaintext, signed
        # Source ranges apply to certificate users too (matched against PortMux.peer_of).
        entry = PolicyEntry.make("Topic:MtlsB", ["Pub"], "Allow", source_ips=["127.0.0.1/32"])
        AuthStore(auth_file).put_entries("app-1", [entry], create=False)
        for _ in range(40):
            if await _send(proxy, pki.app, "MtlsB") == Code.OK:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("a new Allow from 127.0.0.1 not applied after 2 s")


async def test_without_mutual_tls_a_certificate_is_ignored(
    env: ProxyEnv, pki: Pki, auth_file: Path
) -> None:
    async with _proxy(
        env, tls_mode="required", acl_enabled=True, auth_file=str(auth_file)
    ) as proxy:
        assert proxy.servicer is not None and proxy.servicer.cert_principals is None
        assert await _send(proxy, pki.app, "MtlsA") == Code.UNAUTHORIZED
        assert await _send(proxy, pki.app, "MtlsA", signer="app-1") == Code.OK


def test_permissive_mutual_tls_needs_acl() -> None:
    with pytest.raises(ConfigError, match="acl_enabled"):
        ProxyConfig(tls_mode="permissive", tls_client_ca_file="ca.pem")
    with pytest.raises(ConfigError, match="tls_mode=required"):
        ProxyConfig(tls_mode="off", tls_client_ca_file="ca.pem")
    config = ProxyConfig(
        tls_mode="permissive", tls_client_ca_file="ca.pem", acl_enabled=True, auth_file="a.json"
    )
    assert config.tls_client_ca_file == "ca.pem"


def test_the_authenticator_takes_a_certificate_only_for_unsigned_calls() -> None:
    from orbitmq.proxy.auth import Authenticator, unsigned
    from orbitmq.proxy.status import ProxyError

    keys = Authenticator(True, {"app-1": SECRETS["app-1"]})  # the access_keys table, no store
    assert keys.check(metadata(), certificate="app-1") == "app-1"
    assert keys.check([], certificate="app-1") == "app-1"  # no header at all
    for headers, cert in (
        (metadata(), "nobody"),  # not a key of the table
        (metadata(), None),  # neither
        ([("authorization", "Basic abc")], "app-1"),  # another scheme is a signature: checked
    ):
        with pytest.raises(ProxyError) as info:
            keys.check(headers, certificate=cert)
        assert info.value.status_code == Code.UNAUTHORIZED
    assert unsigned("") and unsigned("MQv2-HMAC-SHA1 Credential=/scope, Signature=ab")
    assert not unsigned("MQv2-HMAC-SHA1 Credential=ak, Signature=ab")
    assert Authenticator(False, {}).check(metadata(), certificate="app-1") == ""

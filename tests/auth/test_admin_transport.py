"""Admin requests only over TLS (or mutual TLS) where a listener says so (``admin_transport``):
on a broker and a NameServer in permissive mode, plaintext admin requests get
ADMIN_REQUIRES_TLS and change nothing, ordinary requests still work in plaintext, and the
same admin requests over TLS succeed; ``mtls`` also wants a client certificate."""

from __future__ import annotations

import json
import ssl
from pathlib import Path

import pytest

from orbitmq.broker.config import BrokerConfig
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import ConfigError
from orbitmq.namesrv.config import NamesrvConfig
from orbitmq.net.client import RemotingClient
from orbitmq.net.tls import client_context
from orbitmq.protocol.bodies import TopicConfig, encode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame
from orbitmq.testing import small_broker_config
from orbitmq.testing.servers import run_broker, run_namesrv
from tests.net.pki import Ca

R = RequestCode
REFUSED = ResponseCode.ADMIN_REQUIRES_TLS


def _create(topic: str) -> Frame:
    return Frame(R.UPDATE_AND_CREATE_TOPIC, body=encode_body(TopicConfig(topic_name=topic)))


async def _code(addr: str, frame: Frame, ctx: ssl.SSLContext | None) -> int:
    client = RemotingClient(ssl_context=ctx)
    try:
        return (await client.invoke(addr, frame, 5.0)).code
    finally:
        await client.close()


@pytest.fixture
def pki(tmp_path: Path) -> tuple[Ca, Path, Path]:
    ca = Ca.make(tmp_path)
    cert, key = ca.issue(tmp_path, "localhost", ip="127.0.0.1")
    return ca, cert, key


async def test_plaintext_admin_refused_on_broker_and_namesrv(
    tmp_path: Path, pki: tuple[Ca, Path, Path]
) -> None:
    ca, cert, key = pki
    tls = {"tls_mode": "permissive", "tls_cert_file": str(cert), "tls_key_file": str(key)}
    ctx = client_context(ca_file=str(ca.file))
    async with run_namesrv(NamesrvConfig(port=0, **tls)) as ns:  # type: ignore[arg-type]
        cfg = small_broker_config(tmp_path / "b", namesrv_addrs=(ns.address,), **tls)
        async with run_broker(cfg) as broker:
            b, n = broker.address, ns.address
            # Broker: admin codes refused in plaintext, nothing created.
            assert await _code(b, _create("Plain"), None) == REFUSED
            assert await _code(b, Frame(R.GET_BROKER_CONFIG), None) == REFUSED
            assert await _code(b, Frame(R.DELETE_TOPIC_IN_BROKER, fields={"topic": "T"}), None) == (
                REFUSED
            )
            assert "Plain" not in broker.ctx.topics.topics
            # ... ordinary requests are not admin requests.
            runtime = await _code(b, Frame(R.GET_BROKER_RUNTIME_INFO), None)
            assert runtime == ResponseCode.SUCCESS
            # ... and over TLS the same admin requests go through.
            assert await _code(b, _create("Sealed"), ctx) == ResponseCode.SUCCESS
            assert "Sealed" in broker.ctx.topics.topics
            assert await _code(b, Frame(R.GET_BROKER_CONFIG), ctx) == ResponseCode.SUCCESS
            # NameServer: the same.
            delete = Frame(R.DELETE_TOPIC_IN_NAMESRV, fields={"topic": "Sealed"})
            assert await _code(n, delete, None) == REFUSED
            assert await _code(n, Frame(R.GET_NAMESRV_CONFIG), None) == REFUSED
            assert await _code(n, Frame(R.UPDATE_NAMESRV_CONFIG, body=b"a=b"), None) == REFUSED
            assert await _code(n, Frame(R.GET_BROKER_CLUSTER_INFO), None) == ResponseCode.SUCCESS
            assert await _code(n, Frame(R.GET_NAMESRV_CONFIG), ctx) == ResponseCode.SUCCESS
            audit = (tmp_path / "b" / "audit.jsonl").read_text().splitlines()
            denied = [json.loads(line) for line in audit]
            assert any("needs a TLS connection" in str(d) for d in denied)


async def test_mtls_admin_needs_a_client_certificate(pki: tuple[Ca, Path, Path]) -> None:
    ca, cert, key = pki
    config = NamesrvConfig(
        port=0,
        tls_mode="required",
        tls_cert_file=str(cert),
        tls_key_file=str(key),
        tls_ca_file=str(ca.file),
        tls_client_auth="optional",
        admin_transport="mtls",
    )
    no_cert = client_context(ca_file=str(ca.file))
    with_cert = client_context(ca_file=str(ca.file), cert_file=str(cert), key_file=str(key))
    async with run_namesrv(config) as ns:
        assert await _code(ns.address, Frame(R.GET_NAMESRV_CONFIG), no_cert) == REFUSED
        info = Frame(R.GET_BROKER_CLUSTER_INFO)
        assert await _code(ns.address, info, no_cert) == ResponseCode.SUCCESS
        got = await _code(ns.address, Frame(R.GET_NAMESRV_CONFIG), with_cert)
        assert got == ResponseCode.SUCCESS


def test_admin_transport_settings_that_cannot_work_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="admin_transport=tls needs TLS"):
        NamesrvConfig(port=0, admin_transport="tls")
    with pytest.raises(ConfigError, match="admin_transport=mtls needs"):
        NamesrvConfig(port=0, tls_mode="required", tls_cert_file="c.pem", admin_transport="mtls")
    assert NamesrvConfig(port=0).admin_transport_needed() == "any"  # make up: loopback, off
    on = BrokerConfig(tls_mode="permissive", tls_cert_file="c.pem")
    assert on.admin_transport_needed() == "tls"

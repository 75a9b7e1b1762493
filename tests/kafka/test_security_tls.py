"""TLS on the Kafka listener (the shared orbitmq.net listener and TLS helpers): SASL_SSL with the
real clients against a test CA, mutual TLS naming the ACL user (Kafka's SSL principal), required
mode closing a plaintext client before any Kafka byte, and permissive mode serving both on one
port. The PKI is made with ``cryptography`` (tests/net/pki.py); users as in test_security.py.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from orbitmq.kafka.config import KafkaConfig
from orbitmq.kafka.server import KafkaGateway
from orbitmq.protocol.kafka.connection import encode_request
from orbitmq.testing import run_broker, run_namesrv, small_broker_config
from tests.kafka.test_security import SECRETS, make_store, stored
from tests.net.pki import Ca

kafka = pytest.importorskip("kafka")
confluent = pytest.importorskip("confluent_kafka")

pytestmark = pytest.mark.timeout(90)


@asynccontextmanager
async def gateway(
    tmp_path: Path, mtls: bool = False, **tls: Any
) -> AsyncIterator[tuple[KafkaGateway, Ca]]:
    ca = Ca.make(tmp_path)
    cert, key = ca.issue(tmp_path, "localhost", ip="127.0.0.1")
    if mtls:
        tls |= {"tls_ca_file": str(ca.file), "tls_client_auth": "required"}
    make_store(tmp_path / "auth.json")
    async with run_namesrv() as ns:
        addr = f"127.0.0.1:{ns.port}"
        async with run_broker(small_broker_config(tmp_path / "store", namesrv_addrs=(addr,))):
            gw = KafkaGateway(KafkaConfig(
                namesrv_addrs=(addr,), port=0, default_partitions=1, auth_enabled=True,
                auth_file=str(tmp_path / "auth.json"), tls_cert_file=str(cert),
                tls_key_file=str(key), **tls,
            ))  # fmt: skip
            await gw.start()
            try:
                for topic in ("ok1", "secret1"):
                    assert await gw.control._create(topic, 1, 10_000) == 0
                yield gw, ca
            finally:
                await gw.stop()


def produce(conf: dict[str, Any], topic: str) -> list[Any]:
    """Deliver one record with confluent-kafka; the delivery errors (empty: delivered)."""
    errors: list[Any] = []

    def report(err: Any, _msg: Any) -> None:
        errors.append(err)

    p = confluent.Producer({**conf, "message.timeout.ms": 10_000, "error_cb": errors.append})
    p.produce(topic, b"over-tls", on_delivery=report)
    p.flush(20)
    return [e for e in errors if e is not None]


def first_bytes(port: int, wrap: Callable[[socket.socket], socket.socket] | None = None) -> bytes:
    """Send a plaintext ApiVersions and read what comes back until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        got = b""
        try:
            sock = wrap(raw) if wrap else raw
        except (ConnectionError, ssl.SSLError):
            return got
        try:
            sock.sendall(encode_request(18, 3, 1, "t", {}))
            while chunk := sock.recv(4096):
                got += chunk
                if len(got) >= 4 and len(got) >= 4 + int.from_bytes(got[:4], "big"):
                    break
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            sock.close()
        return got


def first_error(conf: dict[str, Any]) -> list[Any]:
    """The client errors within 10 s of trying to produce (stops at the first)."""
    errors: list[Any] = []
    p = confluent.Producer({**conf, "error_cb": errors.append})
    p.produce("ok1", b"never")
    end = time.monotonic() + 10
    while not errors and time.monotonic() < end:
        p.poll(0.1)
    p.purge()
    p.flush(1)
    return errors


async def test_sasl_ssl_with_both_clients_and_plaintext_refused(tmp_path: Path) -> None:
    async with gateway(tmp_path, tls_mode="required") as (gw, ca):
        bootstrap = f"127.0.0.1:{gw.port}"
        conf = {"bootstrap.servers": bootstrap, "security.protocol": "SASL_SSL",
                "ssl.ca.location": str(ca.file), "sasl.mechanism": "SCRAM-SHA-256",
                "sasl.username": "alice", "sasl.password": SECRETS["alice"]}  # fmt: skip
        assert await asyncio.to_thread(produce, conf, "ok1") == []

        def kafka_python() -> None:
            p = kafka.KafkaProducer(
                bootstrap_servers=bootstrap, security_protocol="SASL_SSL", ssl_cafile=str(ca.file),
                sasl_mechanism="PLAIN", sasl_plain_username="alice",
                sasl_plain_password=SECRETS["alice"],
            )  # fmt: skip
            p.send("ok1", b"kp-over-tls").get(20)
            p.close()

        await asyncio.to_thread(kafka_python)
        assert await stored(gw, "ok1") == 2
        # required: a plaintext client gets nothing, not even an ApiVersions answer
        assert await asyncio.to_thread(first_bytes, gw.port) == b""
        assert gw.refusals.counts["plaintext_refused"] == 1

        # a client that does not trust the CA is refused by its own verification
        other = tmp_path / "other"
        other.mkdir()
        untrusted = {**conf, "ssl.ca.location": str(Ca.make(other, "other-ca").file)}
        errors = await asyncio.to_thread(first_error, untrusted)
        assert errors and await stored(gw, "ok1") == 2


async def test_mutual_tls_names_the_user(tmp_path: Path) -> None:
    async with gateway(tmp_path, mtls=True, tls_mode="required") as (gw, ca):
        cert, key = ca.issue(tmp_path, "alice")
        conf = {"bootstrap.servers": f"127.0.0.1:{gw.port}", "security.protocol": "SSL",
                "ssl.ca.location": str(ca.file), "ssl.certificate.location": str(cert),
                "ssl.key.location": str(key)}  # fmt: skip
        assert await asyncio.to_thread(produce, conf, "ok1") == []
        errors = await asyncio.to_thread(produce, conf, "secret1")
        assert errors and errors[0].code() == confluent.KafkaError.TOPIC_AUTHORIZATION_FAILED
        assert await stored(gw, "ok1") == 1 and await stored(gw, "secret1") == 0

        def no_certificate() -> bytes:
            ctx = ssl.create_default_context(cafile=str(ca.file))
            return first_bytes(gw.port, lambda s: ctx.wrap_socket(s, server_hostname="localhost"))

        assert await asyncio.to_thread(no_certificate) == b""


async def test_permissive_serves_tls_and_plaintext_on_one_port(tmp_path: Path) -> None:
    async with gateway(tmp_path, tls_mode="permissive") as (gw, ca):
        plain = await asyncio.to_thread(first_bytes, gw.port)
        ctx = ssl.create_default_context(cafile=str(ca.file))
        tls = await asyncio.to_thread(
            first_bytes, gw.port, lambda s: ctx.wrap_socket(s, server_hostname="localhost")
        )
        assert len(plain) > 8 and len(tls) > 8  # an ApiVersions answer either way
        conf = {"bootstrap.servers": f"127.0.0.1:{gw.port}", "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "PLAIN", "sasl.username": "alice",
                "sasl.password": SECRETS["alice"]}  # fmt: skip
        assert await asyncio.to_thread(produce, conf, "ok1") == []
        started = time.monotonic()
        assert await stored(gw, "ok1") == 1 and time.monotonic() - started < 10


async def test_certificate_reload_applies_to_new_connections(tmp_path: Path) -> None:
    async with gateway(tmp_path, tls_mode="required", tls_reload_interval_s=0.1) as (gw, ca):
        assert gw.tls is not None
        cert_file, key_file = gw.config.tls_cert_file, gw.config.tls_key_file
        assert cert_file and key_file
        newer = tmp_path / "newer"
        newer.mkdir()
        ca2 = Ca.make(newer, "second-ca")
        cert2, key2 = ca2.issue(newer, "localhost", ip="127.0.0.1")

        def hello(trust: Ca) -> bytes:
            ctx = ssl.create_default_context(cafile=str(trust.file))
            return first_bytes(gw.port, lambda s: ctx.wrap_socket(s, server_hostname="localhost"))

        assert len(await asyncio.to_thread(hello, ca)) > 8
        Path(key_file).write_bytes(key2.read_bytes())
        Path(cert_file).write_bytes(cert2.read_bytes())
        end = time.monotonic() + 5
        while gw.tls.reloads == 0 and time.monotonic() < end:
            await asyncio.sleep(0.05)
        assert len(await asyncio.to_thread(hello, ca2)) > 8  # the new certificate, no restart
        assert await asyncio.to_thread(hello, ca) == b""  # the old chain no longer shown

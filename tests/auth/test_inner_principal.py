"""The inner Super principal only over mutual TLS (brief section 10, bootstrap; issue #16).

An inner user (``orbitmq user create inner-proxy -t Super --inner mtls``: the identity the gRPC
proxy signs its broker and NameServer requests with) is admitted only when the connection shows
a verified client certificate naming it; its secret alone, from any host, is refused (answered
as any failed authentication, NO_PERMISSION, and audited with the reason). ``--inner loopback``
(what ``orbitmq up`` and ``cluster up`` give their brokers' fresh in-memory users) also admits a
loopback source address. Live: a plaintext NameServer, a NameServer and a broker requiring TLS
with optional client certificates, a proxy whose client certificate names its inner user."""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from pathlib import Path

import grpc
import pytest

from orbitmq.auth.audit import AuditLog
from orbitmq.auth.guard import AUTH_FAILED, Guard
from orbitmq.auth.model import User, UserType, inner_refusal
from orbitmq.auth.store import AuthStore
from orbitmq.broker.controller import BrokerController
from orbitmq.client import AdminConfig, AsyncAdminClient
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MQError
from orbitmq.namesrv.config import NamesrvConfig
from orbitmq.namesrv.controller import NamesrvController
from orbitmq.net.client import RemotingClient, set_default_ssl_context
from orbitmq.net.tls import client_context
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.signature import Signer
from orbitmq.proxy.auth import Authenticator
from orbitmq.proxy.config import ProxyConfig
from orbitmq.proxy.grpc_v2 import service_pb2 as svc
from orbitmq.proxy.grpc_v2 import service_pb2_grpc
from orbitmq.proxy.server import ProxyServer
from orbitmq.proxy.status import ProxyError
from orbitmq.testing import small_broker_config
from tests.auth.conftest import SECRETS, Cluster
from tests.net.pki import Ca
from tests.proxy.conftest import metadata
from tests.proxy.test_broker_tls import TOPIC, _message

INNER, INNER_SECRET = "inner-proxy", "inner-proxy-secret-1"
ADMIN, ADMIN_SECRET = "admin", "admin-secret-0"


def _store(path: Path) -> AuthStore:
    store = AuthStore(path)
    store.create_user(ADMIN, ADMIN_SECRET, UserType.SUPER)
    store.create_user(INNER, INNER_SECRET, UserType.SUPER, inner="mtls")
    store.create_user("inner-local", "inner-local-secret", UserType.SUPER, inner="loopback")
    store.create_user("alice", "alice-secret-1")
    return store


def test_the_rule_and_its_storage(tmp_path: Path) -> None:
    store = _store(tmp_path / "auth.json")
    inner, local = store.user(INNER), store.user("inner-local")
    assert inner is not None and inner.inner == "mtls" and inner.type is UserType.SUPER
    assert local is not None and local.inner == "loopback"
    assert inner_refusal(inner, INNER, "10.1.2.3") is None  # a certificate naming it
    assert inner_refusal(inner, None, "127.0.0.1")  # mtls: loopback is not enough
    assert inner_refusal(inner, "alice", "10.1.2.3")  # another name's certificate
    assert inner_refusal(local, None, "127.0.0.1") is None
    assert inner_refusal(local, None, "::1") is None
    assert inner_refusal(local, None, "10.1.2.3")
    # update keeps or clears the mark, as asked; the document survives a re-read
    store.update_user(INNER, enabled=True)
    store.update_user("inner-local", inner="none")
    again = AuthStore(tmp_path / "auth.json")
    assert [again.user(n).inner for n in (INNER, "inner-local") if again.user(n)] == ["mtls", ""]


class _Conn:
    """A server connection as the Guard sees it: a peer, no TLS."""

    def __init__(self, peer: str) -> None:
        self.peer = peer
        self.attributes: dict[str, object] = {}


def test_guard_refuses_the_inner_secret_from_another_host_and_audits_why(tmp_path: Path) -> None:
    store = _store(tmp_path / "auth.json")
    guard = Guard(store, AuditLog(tmp_path / "audit.jsonl", "t"), cluster="DefaultCluster")
    frame = Frame(RequestCode.GET_BROKER_RUNTIME_INFO)
    Signer("inner-local", "inner-local-secret", version=1)(frame)
    answer = guard.admit(frame, _Conn("10.0.0.7:4000"))
    assert isinstance(answer, Frame) and answer.code == ResponseCode.NO_PERMISSION
    assert answer.remark == AUTH_FAILED  # no hint that the user exists
    assert guard.admit(frame, _Conn("127.0.0.1:4000")) == "inner-local"
    lines = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [x["principal"] for x in lines] == ["inner-local"]
    assert "loopback or over mutual TLS" in lines[0]["reason"]
    assert lines[0]["source"] == "10.0.0.7:4000"


def test_grpc_proxy_admits_the_inner_user_only_with_its_certificate(tmp_path: Path) -> None:
    from orbitmq.proxy.auth import HEADER_AUTHORIZATION, HEADER_DATE_TIME, sign

    auth = Authenticator(True, {}, store=_store(tmp_path / "auth.json"))
    date = "20261126T120000Z"
    md = [
        (
            HEADER_AUTHORIZATION,
            f"MQv2-HMAC-SHA1 Credential={INNER}, SignedHeaders=x-mq-date-time, "
            f"Signature={sign(INNER_SECRET, date)}",
        ),
        (HEADER_DATE_TIME, date),
    ]
    with pytest.raises(ProxyError):
        auth.check(md, None, "127.0.0.1")
    with pytest.raises(ProxyError):  # the verified-and-cached signature is not enough either
        auth.check(md, "alice", "10.0.0.1")
    assert auth.check(md, INNER, "10.0.0.1") == INNER


def _audit(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines()]


async def _ask(addr: str, who: Signer, ctx: ssl.SSLContext | None = None) -> int:
    client = RemotingClient(signer=who, ssl_context=ctx)
    try:
        return (await client.invoke(addr, Frame(RequestCode.GET_BROKER_RUNTIME_INFO), 5.0)).code
    finally:
        await client.close()


async def test_live_inner_user_refused_in_plaintext_and_with_a_wrong_certificate_proxy_works(
    tmp_path: Path,
) -> None:
    auth_file = tmp_path / "auth.json"
    _store(auth_file)
    ca = Ca.make(tmp_path, "ca")
    s_cert, s_key = ca.issue(tmp_path, "localhost", ip="127.0.0.1")
    p_cert, p_key = ca.issue(tmp_path, INNER)
    a_cert, a_key = ca.issue(tmp_path, "alice")
    tls = {
        "tls_mode": "required",
        "tls_cert_file": str(s_cert),
        "tls_key_file": str(s_key),
        "tls_ca_file": str(ca.file),
        "tls_client_auth": "optional",
    }
    audits = {name: tmp_path / f"{name}-audit.jsonl" for name in ("plain", "ns", "broker")}
    plain = NamesrvController(
        NamesrvConfig(
            port=0, auth_enabled=True, auth_file=str(auth_file), audit_file=str(audits["plain"])
        )
    )
    ns = NamesrvController(
        NamesrvConfig(
            port=0,
            auth_enabled=True,
            auth_file=str(auth_file),
            audit_file=str(audits["ns"]),
            **tls,  # type: ignore[arg-type]  # the TLS settings above
        )
    )
    broker: BrokerController | None = None
    try:
        await plain.start()
        await ns.start()
        inner = Signer(INNER, INNER_SECRET, version=2)
        # 1. plaintext, from loopback, the right secret: refused and audited
        assert await _ask(plain.address, inner) == ResponseCode.NO_PERMISSION
        # every Remoting client of this process (the proxy's too) shows the inner certificate
        set_default_ssl_context(
            client_context(ca_file=str(ca.file), cert_file=str(p_cert), key_file=str(p_key))
        )
        broker = BrokerController(
            small_broker_config(
                tmp_path / "store",
                namesrv_addrs=(ns.address,),
                auth_enabled=True,
                auth_file=str(auth_file),
                audit_file=str(audits["broker"]),
                access_key=ADMIN,
                secret_key=ADMIN_SECRET,
                tls_outbound=True,
                **tls,  # type: ignore[arg-type]  # the TLS settings above
            )
        )
        await broker.start()
        # 2. TLS with a verified certificate naming another user: refused and audited
        alice_ctx = client_context(ca_file=str(ca.file), cert_file=str(a_cert), key_file=str(a_key))
        assert await _ask(broker.address, inner, alice_ctx) == ResponseCode.NO_PERMISSION
        # 3. TLS without a client certificate: refused and audited
        assert (
            await _ask(broker.address, inner, client_context(ca_file=str(ca.file)))
            == ResponseCode.NO_PERMISSION
        )
        # 4. the certificate naming it: admitted
        assert await _ask(broker.address, inner) == ResponseCode.SUCCESS
        for name in ("plain", "broker"):
            # repeats of one (principal, resource, action) within 1 s share a line (audit.py)
            refused = [x for x in _audit(audits[name]) if x.get("principal") == INNER]
            assert len(refused) == 1, (name, refused)
            assert all("mutual TLS" in x["reason"] for x in refused)
            assert all(INNER_SECRET not in json.dumps(x) for x in refused)
        # 5. the proxy -> broker path over mutual TLS, signed as the inner user
        admin_cfg = AdminConfig(access_key=ADMIN, secret_key=ADMIN_SECRET)
        async with AsyncAdminClient([ns.address], admin_cfg) as admin:
            await admin.create_topic(TOPIC, read_queue_nums=1, write_queue_nums=1)
            deadline = time.monotonic() + 10
            while not await _routed(admin):
                assert time.monotonic() < deadline, "topic not routed"
                await asyncio.sleep(0.05)
            proxy = await ProxyServer(
                ProxyConfig(
                    namesrv_addrs=(ns.address,),
                    port=0,
                    access_key=INNER,
                    secret_key=INNER_SECRET,
                )
            ).start()
            try:
                async with grpc.aio.insecure_channel(proxy.address) as channel:
                    stub = service_pb2_grpc.MessagingServiceStub(channel)
                    reply = await stub.SendMessage(
                        svc.SendMessageRequest(messages=[_message(b"inner-mtls")]),
                        metadata=metadata("inner-proxy-test"),
                        timeout=15,
                    )
                    assert reply.status.code == 20000, reply.status
            finally:
                await proxy.stop(0)
            queue = (await admin.queues(TOPIC))[0]
            assert await admin.max_offset(queue) == 1
    finally:
        set_default_ssl_context(None)
        if broker is not None:
            await broker.stop()
        await ns.stop()
        await plain.stop()


async def _routed(admin: AsyncAdminClient) -> bool:
    try:
        return bool(await admin.queues(TOPIC))
    except Exception:  # noqa: BLE001 - not registered yet
        return False


def test_mqtt_login_with_an_inner_users_secret_needs_its_certificate(tmp_path: Path) -> None:
    """The MQTT gateway takes the brokers' users too: an inner user's password (its secret)
    is refused without a client certificate naming it, and SCRAM never gets its secret."""
    from orbitmq.auth.server import ServerAuth
    from orbitmq.mqtt.auth import Authenticator as MqttAuth

    _store(tmp_path / "auth.json")
    acl = ServerAuth.open(
        enabled=True, auth_file=tmp_path / "auth.json", audit_file=tmp_path / "audit.jsonl",
        cluster="DefaultCluster", node="t",
    )  # fmt: skip
    mqtt = MqttAuth(False, None, acl)
    secret = INNER_SECRET.encode()
    assert mqtt.login(INNER, secret, None, "10.0.0.9:1883") is None
    assert mqtt.login(INNER, secret, "alice", "10.0.0.9:1883") is None
    assert mqtt.login(INNER, secret, INNER, "10.0.0.9:1883") == INNER
    assert mqtt.login("inner-local", b"inner-local-secret", None, "127.0.0.1:5") == "inner-local"
    assert mqtt.login("inner-local", b"inner-local-secret", None, "10.0.0.9:5") is None
    assert mqtt.login("alice", b"alice-secret-1", None, "10.0.0.9:5") == "alice"
    assert mqtt.scram_secret(INNER) is None and mqtt.scram_secret("alice") == "alice-secret-1"
    reasons = [json.loads(x)["reason"] for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert any("mutual TLS" in r for r in reasons)


async def test_user_commands_set_and_clear_the_inner_mark(cluster: Cluster) -> None:
    """Over the wire (AUTH_CREATE_USER / AUTH_UPDATE_USER ``inner``), as ``orbitmq user create
    --inner mtls`` sends it; a bad value is refused and changes nothing."""
    cfg = AdminConfig(access_key="admin", secret_key=SECRETS["admin"])
    async with AsyncAdminClient([cluster.namesrv.address], cfg) as admin:
        await admin.create_user("inner-p2", "inner-p2-secret", "Super", inner="mtls")
        assert (await admin.get_user("inner-p2"))["inner"] == "mtls"
        with pytest.raises(MQError):
            await admin.update_user("inner-p2", inner="sometimes")
        assert (await admin.get_user("inner-p2"))["inner"] == "mtls"
        await admin.update_user("inner-p2", inner="none")
        assert "inner" not in await admin.get_user("inner-p2")
        await admin.update_user("inner-p2", inner="loopback")
        assert AuthStore(cluster.auth_file).user("inner-p2") == User(
            "inner-p2", UserType.SUPER, True, "loopback"
        )

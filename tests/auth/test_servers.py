"""Authentication and authorization on a live broker and NameServer (brief T1-T5 over Remoting)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pytest

from orbitmq.auth.audit import verify as verify_chain
from orbitmq.client import AdminConfig, AsyncAdminClient
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import NoPermissionError
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.bodies import TopicConfig, encode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.messages import encode_send_body
from orbitmq.protocol.signature import Signer
from tests.auth.conftest import SECRETS, Cluster

R = RequestCode


def signer(user: str, version: int = 2, secret: str | None = None) -> Signer:
    return Signer(user, secret or SECRETS[user], version=version)


def send(topic: str) -> Frame:
    return Frame(
        R.SEND_MESSAGE, fields={"topic": topic, "queue_id": 0}, body=encode_send_body([b"m"], [b""])
    )


def pull(topic: str, group: str) -> Frame:
    return Frame(
        R.PULL_MESSAGE, fields={"topic": topic, "queue_id": 0, "queue_offset": 0, "group": group}
    )


def route(topic: str) -> Frame:
    return Frame(R.GET_ROUTEINFO_BY_TOPIC, fields={"topic": topic})


def create_topic(topic: str) -> Frame:
    return Frame(R.UPDATE_AND_CREATE_TOPIC, body=encode_body(TopicConfig(topic_name=topic)))


def delete_topic(topic: str) -> Frame:
    return Frame(R.DELETE_TOPIC_IN_BROKER, fields={"topic": topic})


def runtime() -> Frame:
    return Frame(R.GET_BROKER_RUNTIME_INFO)


async def ask(addr: str, frame: Frame, who: Signer | None) -> int:
    client = RemotingClient(signer=who)
    try:
        return (await client.invoke(addr, frame, 5.0)).code
    finally:
        await client.close()


async def test_unsigned_wrong_secret_and_unknown_user_get_no_permission(cluster: Cluster) -> None:
    b, n = cluster.broker.address, cluster.namesrv.address
    for addr, frame in ((b, send("orders")), (n, route("orders"))):
        assert await ask(addr, frame, None) == ResponseCode.NO_PERMISSION
        for version in (1, 2):
            wrong = signer("alice", version, secret="wrong-secret-9")
            assert await ask(addr, frame, wrong) == ResponseCode.NO_PERMISSION
            ghost = Signer("ghost", "ghost-secret-1", version=version)
            assert await ask(addr, frame, ghost) == ResponseCode.NO_PERMISSION
    assert await ask(b, send("orders"), signer("alice", 1)) == ResponseCode.SUCCESS
    assert await ask(b, send("orders"), signer("alice", 2)) == ResponseCode.SUCCESS


# user -> (request, server, allowed); the expected cells are written out from the ACLs of
# conftest.seed and section 2.4's rules, not computed by the code under test.
MATRIX: list[tuple[str, str, Any, bool]] = [
    ("admin", "b", send("anything"), True),
    ("admin", "b", delete_topic("orders-x"), True),
    ("alice", "b", send("orders"), True),
    ("alice", "b", send("orders2"), False),
    ("alice", "b", pull("orders", "g1"), True),
    ("alice", "b", pull("orders", "g2"), False),
    ("alice", "b", pull("%RETRY%g1", "g1"), True),
    ("alice", "n", route("orders"), True),
    ("alice", "n", route("payments"), False),
    ("alice", "b", create_topic("orders"), False),
    ("alice", "b", delete_topic("orders"), False),
    ("alice", "b", runtime(), False),
    ("bob", "b", send("orders"), True),
    ("bob", "b", send("ordinal"), True),
    ("bob", "b", send("orders-secret"), False),
    ("bob", "b", pull("orders-secret", "g1"), False),
    ("bob", "b", pull("order", "g7"), True),
    ("bob", "b", pull("order", "h1"), False),
    ("bob", "n", route("orders-secret"), False),
    ("bob", "n", route("ordx"), True),
    ("bob", "b", send("payments"), False),
    ("bob", "b", create_topic("ordnew"), False),
    ("carol", "b", send("orders"), False),
    ("carol", "b", pull("orders", "g1"), False),
    ("carol", "n", route("orders"), False),
    ("carol", "b", runtime(), False),
]


async def test_authorization_matrix(cluster: Cluster) -> None:
    addrs = {"b": cluster.broker.address, "n": cluster.namesrv.address}
    wrong: list[str] = []
    for user, server, frame, allowed in MATRIX:
        copy = Frame(frame.code, fields=dict(frame.fields), body=frame.body)
        code = await ask(addrs[server], copy, signer(user))
        if (code != ResponseCode.NO_PERMISSION) != allowed:
            wrong.append(f"{user} {R(frame.code).name} {frame.fields}: got {code}")
    assert not wrong, wrong


CODES = (
    range(65536)
    if os.environ.get("ORBITMQ_TEST_ALL_CODES")
    else sorted({*range(4096), *range(4096, 65536, 13), *map(int, R), 65535})
)
"""Every code with ORBITMQ_TEST_ALL_CODES=1 (about 8 s); else every code below 4096, every
named code and one in 13 above (about a second)."""


class _Peer:
    peer = "127.0.0.1:40000"
    transport = None


async def test_no_code_reaches_a_handler_for_a_user_without_acl(cluster: Cluster) -> None:
    """Every code 0-65535 from carol (Normal, no ACL), and every unmapped code from a user
    allowed everything on every resource: refused before any handler."""
    broker, namesrv = cluster.broker, cluster.namesrv
    calls: list[int] = []

    def counting(code: int, handler: Any) -> Any:
        async def wrapped(frame: Frame, conn: Any) -> Any:
            if frame.fields.get("AccessKey") == "carol":
                calls.append(code)
            return await handler(frame, conn)

        return wrapped

    broker.dispatcher.routes = {c: counting(c, h) for c, h in broker.dispatcher.routes.items()}
    ns_handlers = namesrv.processor._handlers
    namesrv.processor._handlers = {
        c: (
            lambda f, conn, c=c, h=h: (
                f.fields.get("AccessKey") == "carol" and calls.append(c),
                h(f, conn),
            )[1]
        )
        for c, h in ns_handlers.items()
    }
    sign = signer("carol", 1)
    started = time.monotonic()
    for code in CODES:
        frame = Frame(code, fields={"topic": "orders", "group": "g1", "cluster": "DefaultCluster"})
        sign(frame)
        answer = await broker.dispatcher.handle(frame, _Peer())  # type: ignore[arg-type]
        assert answer is not None and not isinstance(answer, tuple)
        assert answer.code == ResponseCode.NO_PERMISSION, (code, answer)
        assert namesrv.processor.process(frame, _Peer()).code == ResponseCode.NO_PERMISSION
    assert calls == []
    print(f"{len(CODES)} codes x 2 servers in {time.monotonic() - started:.1f}s")
    # A Normal user allowed All on every resource still cannot use an unmapped code.
    admin = AsyncAdminClient(
        namesrv.address, AdminConfig(access_key="admin", secret_key=SECRETS["admin"])
    )
    async with admin:
        await admin.create_acl("User:carol", ["*"], ["All"])
    await asyncio.sleep(0.3)
    from orbitmq.auth.actions import RULES

    for code in CODES:
        if code in RULES:
            continue
        frame = Frame(code)
        sign(frame)
        answer = await broker.dispatcher.handle(frame, _Peer())  # type: ignore[arg-type]
        assert not isinstance(answer, tuple) and answer is not None
        assert answer.code == ResponseCode.NO_PERMISSION, code
    assert calls == []


async def test_revocation_holds_everywhere_within_a_second(cluster: Cluster) -> None:
    b = cluster.broker.address
    alice = RemotingClient(signer=signer("alice"))
    admin = AsyncAdminClient(
        cluster.namesrv.address, AdminConfig(access_key="admin", secret_key=SECRETS["admin"])
    )
    try:
        assert (await alice.invoke(b, send("orders"), 5.0)).code == ResponseCode.SUCCESS
        async with admin:
            await admin.update_user("alice", user_status="disable")  # answered by the NameServer
            started = time.monotonic()
            while (await alice.invoke(b, send("orders"), 5.0)).code == ResponseCode.SUCCESS:
                assert time.monotonic() - started < 1.0, "the broker still serves a disabled user"
                await asyncio.sleep(0.05)
            await admin.update_user("alice", user_status="enable")
            await asyncio.sleep(0.35)
            assert (await alice.invoke(b, send("orders"), 5.0)).code == ResponseCode.SUCCESS
            await admin.delete_acl("User:alice", ["Topic:orders"])
            started = time.monotonic()
            while (await alice.invoke(b, send("orders"), 5.0)).code == ResponseCode.SUCCESS:
                assert time.monotonic() - started < 1.0, "a deleted entry still grants"
                await asyncio.sleep(0.05)
    finally:
        await alice.close()


async def test_a_refused_send_stores_nothing(cluster: Cluster) -> None:
    b = cluster.broker.address
    assert await ask(b, send("orders-secret"), signer("admin")) == ResponseCode.SUCCESS
    max_offset = Frame(R.GET_MAX_OFFSET, fields={"topic": "orders-secret", "queue_id": 0})
    admin = RemotingClient(signer=signer("admin"))
    for _ in range(100):  # bounded: a send is answered before its ConsumeQueue entry is dispatched
        before = await admin.invoke(b, max_offset, 5.0)
        if before.fields["offset"] >= 1:
            break
        await asyncio.sleep(0.02)
    batch = Frame(
        R.SEND_BATCH_MESSAGE,
        fields={"topic": "orders-secret", "queue_id": 0},
        body=encode_send_body([b"a", b"b"], [b"", b""]),
    )
    assert await ask(b, batch, signer("bob")) == ResponseCode.NO_PERMISSION
    max_offset = Frame(R.GET_MAX_OFFSET, fields={"topic": "orders-secret", "queue_id": 0})
    after = await RemotingClient(signer=signer("admin")).invoke(b, max_offset, 5.0)
    assert after.fields["offset"] == before.fields["offset"]


async def test_v2_signature_cannot_be_replayed(cluster: Cluster) -> None:
    frame = send("orders")
    signer("alice")(frame)
    dispatcher = cluster.broker.dispatcher
    first = await dispatcher.handle(
        Frame(frame.code, fields=dict(frame.fields), body=frame.body), _Peer()
    )  # type: ignore[arg-type]
    again = await dispatcher.handle(
        Frame(frame.code, fields=dict(frame.fields), body=frame.body), _Peer()
    )  # type: ignore[arg-type]
    assert not isinstance(first, tuple) and first is not None and first.code == ResponseCode.SUCCESS
    assert (
        not isinstance(again, tuple)
        and again is not None
        and again.code == ResponseCode.NO_PERMISSION
    )


async def test_user_admin_rules_and_audit(cluster: Cluster, tmp_path: Any) -> None:
    n = cluster.namesrv.address
    admin = AsyncAdminClient(n, AdminConfig(access_key="admin", secret_key=SECRETS["admin"]))
    bob = AsyncAdminClient(n, AdminConfig(access_key="bob", secret_key=SECRETS["bob"]))
    async with admin, bob:
        await admin.create_user("dave", "dave-secret-4")
        users = await admin.list_users()
        assert {u["username"] for u in users} == {"admin", "alice", "bob", "carol", "dave"}
        assert all(set(u) == {"username", "user_type", "user_status"} for u in users)
        with pytest.raises(NoPermissionError):
            await bob.create_user("eve", "eve-secret-55")  # bob lacks Cluster Update
        await admin.create_acl("User:bob", ["Cluster:DefaultCluster"], ["Update", "Get", "List"])
        await asyncio.sleep(0.3)
        await bob.create_user("eve", "eve-secret-55")
        with pytest.raises(NoPermissionError):
            await bob.create_user("mallory", "mallory-secret", "Super")
        with pytest.raises(NoPermissionError):
            await bob.update_user("admin", secret="taken-over-1")
        assert (await admin.get_acl("User:bob"))["subject"] == "User:bob"
        await admin.delete_user("dave")
    audit = tmp_path / "namesrv-audit.jsonl"
    text = audit.read_text()
    assert verify_chain(audit).broken_at is None
    assert '"principal": "bob"' in text and '"AUTH_CREATE_USER"' in text
    for secret in (*SECRETS.values(), "dave-secret-4", "eve-secret-55", "taken-over-1"):
        assert secret not in text


async def test_a_connection_is_closed_after_five_failed_authentications(cluster: Cluster) -> None:
    client = RemotingClient(signer=signer("alice", secret="wrong-secret-9"))
    try:
        conn = await client.connection(cluster.broker.address)
        for _ in range(5):
            resp = await conn.request(send("orders"), 5.0)
            assert resp.code == ResponseCode.NO_PERMISSION
        await asyncio.wait_for(conn.closed.wait(), 5.0)
    finally:
        await client.close()


def test_every_code_a_server_answers_is_mapped(cluster: Cluster) -> None:
    """A handler without a (resource, action) rule would be refused to everyone, Super users
    included: every route of the broker and the NameServer must have a rule."""
    from orbitmq.auth.actions import RULES

    broker_codes = set(cluster.broker.dispatcher.routes) | set(cluster.broker.auth.codes)
    namesrv_codes = set(cluster.namesrv.processor.codes)
    assert broker_codes - set(RULES) == set()
    assert namesrv_codes - set(RULES) == set()

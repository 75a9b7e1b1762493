"""ACL: the MQv2-HMAC-SHA1 Authorization header, parsed and verified; refusals in the body."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orbitmq.auth.audit import AuditLog
from orbitmq.auth.model import PolicyEntry
from orbitmq.auth.store import AuthStore
from orbitmq.proxy.auth import Authenticator, parse_authorization, sign
from orbitmq.proxy.authz import Authorizer
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.grpc_v2 import service_pb2 as svc
from orbitmq.proxy.grpc_v2 import service_pb2_grpc
from orbitmq.proxy.status import ProxyError
from tests.proxy.conftest import ProxyEnv, endpoints_pb, metadata, proxy_env_fixture, res
from tests.proxy.conftest import sign as brief_sign

AK, SK = "orbit-ak", "orbit-sk"
env = proxy_env_fixture(
    {"PaTopic": "NORMAL"}, proxy_options={"acl_enabled": True, "access_keys": {AK: SK}}
)
Code = pb.Code


def test_signature_matches_the_brief() -> None:
    """hex(HMAC-SHA1(key = SK, msg = x-mq-date-time)), lowercase; computed independently."""
    assert sign(SK, "20261121T233428Z") == brief_sign(SK, "20261121T233428Z")
    assert sign("", "x") == brief_sign("", "x")  # the empty-credential header clients send


def test_parse_authorization_variants() -> None:
    cred = parse_authorization(
        "MQv2-HMAC-SHA1 Credential=AK/20261121/scope, SignedHeaders=x-mq-date-time, Signature=ab12"
    )
    assert (cred.access_key, cred.signature, cred.signed_headers) == (
        "AK",
        "ab12",
        "x-mq-date-time",
    )
    for bad in ("Basic abc", "MQv2-HMAC-SHA1 Credential=, Signature=x", "MQv2-HMAC-SHA1 ", ""):
        with pytest.raises(ProxyError) as info:
            parse_authorization(bad)
        assert info.value.status_code == Code.UNAUTHORIZED


def test_authenticator_rules() -> None:
    off = Authenticator(False, {})
    assert off.check(metadata(ak="whoever", sk="wrong")) == ""  # ACL off: anonymous is fine
    on = Authenticator(True, {AK: SK})
    assert on.check(metadata(ak=AK, sk=SK)) == AK
    stamp = "20261121T233428Z"
    upper = f"MQv2-HMAC-SHA1 Credential={AK}, SignedHeaders=x-mq-date-time, Signature={sign(SK, stamp).upper()}"
    assert on.check([("authorization", upper), ("x-mq-date-time", stamp)]) == AK  # hex case-free
    for headers in (
        metadata(ak=AK, sk="wrong"),
        metadata(ak="unknown", sk=SK),
        metadata(),  # the empty credential clients send without keys
        [h for h in metadata(ak=AK, sk=SK) if h[0] != "authorization"],
        [h for h in metadata(ak=AK, sk=SK) if h[0] != "x-mq-date-time"],
    ):
        with pytest.raises(ProxyError) as info:
            on.check(headers)
        assert info.value.status_code == Code.UNAUTHORIZED


def test_a_remembered_pass_is_bound_to_its_header_and_the_store_version(tmp_path: Path) -> None:
    stamp = "20261121T233428Z"
    on = Authenticator(True, {AK: SK})
    good = metadata(ak=AK, sk=SK, date_time=stamp)
    assert on.check(good) == AK and on.check(good) == AK  # the second from memory
    with pytest.raises(ProxyError):  # same date-time, wrong signature: checked, refused
        on.check(metadata(ak=AK, sk="wrong", date_time=stamp))

    store = AuthStore(tmp_path / "auth.json")
    store.create_user("alice", "alice-secret")
    backed = Authenticator(True, {}, store=store, refresh_interval_s=0.0)
    signed = metadata(ak="alice", sk="alice-secret", date_time=stamp)
    assert backed.check(signed) == "alice" and backed.check(signed) == "alice"
    AuthStore(tmp_path / "auth.json").update_user("alice", enabled=False)  # another process
    with pytest.raises(ProxyError) as info:  # the same header, a new store version: refused
        backed.check(signed)
    assert info.value.status_code == Code.UNAUTHORIZED


def test_a_remembered_send_verdict_ends_with_the_acl_that_allowed_it(tmp_path: Path) -> None:
    store = AuthStore(tmp_path / "auth.json")
    store.create_user("bob", "bob-secret")
    store.put_entries("bob", [PolicyEntry.make("Topic:orders", ["Pub"], "Allow")], create=True)
    authz = Authorizer(store, AuditLog(None, "proxy"))
    peer = "ipv4:127.0.0.1:5000"
    send = svc.SendMessageRequest(messages=[pb.Message(topic=res("orders"), body=b"x")])
    authz.check("bob", send, peer)
    authz.check("bob", send, peer)  # from memory
    other = svc.SendMessageRequest(messages=[pb.Message(topic=res("audit"), body=b"x")])
    with pytest.raises(ProxyError):  # another topic is decided, and refused
        authz.check("bob", other, peer)
    AuthStore(tmp_path / "auth.json").delete_entries("bob", None)  # another process
    store.refresh()  # what the authenticator does before every call
    with pytest.raises(ProxyError) as info:
        authz.check("bob", send, peer)
    assert info.value.status_code == Code.FORBIDDEN


@given(st.text(max_size=300), st.text(max_size=40))
def test_authenticator_never_crashes_on_garbage(header: str, stamp: str) -> None:
    on = Authenticator(True, {AK: SK})
    try:
        on.check([("authorization", header), ("x-mq-date-time", stamp)])
    except ProxyError as exc:
        assert exc.status_code == Code.UNAUTHORIZED
    else:  # only a correct signature passes
        assert header.split("Signature=")[-1].strip().lower() == sign(SK, stamp)


async def test_signed_calls_pass(
    env: ProxyEnv, stub: service_pb2_grpc.MessagingServiceStub
) -> None:
    resp = await stub.QueryRoute(
        svc.QueryRouteRequest(topic=res("PaTopic"), endpoints=endpoints_pb(env.endpoint)),
        metadata=metadata(ak=AK, sk=SK),
        timeout=10,
    )
    assert resp.status.code == Code.OK


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param(lambda: metadata(ak=AK, sk="bad-secret"), id="bad-signature"),
        pytest.param(lambda: metadata(ak="stranger", sk=SK), id="unknown-key"),
        pytest.param(lambda: metadata(), id="anonymous"),
    ],
)
async def test_refused_calls_say_unauthorized_in_the_body(
    env: ProxyEnv, stub: service_pb2_grpc.MessagingServiceStub, headers: Any
) -> None:
    route = await stub.QueryRoute(
        svc.QueryRouteRequest(topic=res("PaTopic"), endpoints=endpoints_pb(env.endpoint)),
        metadata=headers(),
        timeout=10,
    )
    assert route.status.code == Code.UNAUTHORIZED and not route.message_queues
    send = await stub.SendMessage(
        svc.SendMessageRequest(
            messages=[
                pb.Message(
                    topic=res("PaTopic"),
                    body=b"x",
                    system_properties=pb.SystemProperties(
                        message_id="01AB", message_type=pb.NORMAL
                    ),
                )
            ]
        ),
        metadata=headers(),
        timeout=10,
    )
    assert send.status.code == Code.UNAUTHORIZED
    # A stream answers with one response carrying the status.
    receive = stub.ReceiveMessage(
        svc.ReceiveMessageRequest(group=res("PaGroup")), metadata=headers(), timeout=10
    )
    answers = [r async for r in receive]
    assert len(answers) == 1 and answers[0].status.code == Code.UNAUTHORIZED

    async def settings() -> Any:
        yield svc.TelemetryCommand(settings=pb.Settings(client_type=pb.ClientType.PRODUCER))

    telemetry = stub.Telemetry(settings(), metadata=headers(), timeout=10)
    first = await asyncio.wait_for(telemetry.read(), 10)
    assert first.status.code == Code.UNAUTHORIZED

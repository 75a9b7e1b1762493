"""Malformed input at the proxy's entry points: random bytes for every RPC, well-formed but
wrong requests, oversized messages. Each gets a clear answer and the proxy stays up."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.grpc_v2 import service_pb2 as svc
from orbitmq.proxy.grpc_v2 import service_pb2_grpc
from tests.proxy.conftest import ProxyEnv, endpoints_pb, metadata, proxy_env_fixture, res

env = proxy_env_fixture({"PbTopic": "NORMAL", "PbTx": "TRANSACTION"})
Code = pb.Code
SERVICE = "/apache.rocketmq.v2.MessagingService/"
UNARY = {
    "QueryRoute": svc.QueryRouteResponse,
    "Heartbeat": svc.HeartbeatResponse,
    "SendMessage": svc.SendMessageResponse,
    "QueryAssignment": svc.QueryAssignmentResponse,
    "AckMessage": svc.AckMessageResponse,
    "ForwardMessageToDeadLetterQueue": svc.ForwardMessageToDeadLetterQueueResponse,
    "UpdateOffset": svc.UpdateOffsetResponse,
    "GetOffset": svc.GetOffsetResponse,
    "QueryOffset": svc.QueryOffsetResponse,
    "EndTransaction": svc.EndTransactionResponse,
    "NotifyClientTermination": svc.NotifyClientTerminationResponse,
    "ChangeInvisibleDuration": svc.ChangeInvisibleDurationResponse,
    "RecallMessage": svc.RecallMessageResponse,
}
STREAMING = {"ReceiveMessage": svc.ReceiveMessageResponse, "PullMessage": svc.PullMessageResponse}


@pytest.fixture(scope="module")
def channel(env: ProxyEnv) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(env.endpoint, options=[("grpc.max_send_message_length", -1)]) as ch:
        yield ch


def _alive(channel: grpc.Channel, env: ProxyEnv) -> None:
    stub = service_pb2_grpc.MessagingServiceStub(channel)
    resp = stub.QueryRoute(
        svc.QueryRouteRequest(topic=res("PbTopic"), endpoints=endpoints_pb(env.endpoint)),
        metadata=metadata(),
        timeout=10,
    )
    assert resp.status.code == Code.OK


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(method=st.sampled_from(sorted(UNARY)), data=st.binary(max_size=512))
def test_random_bytes_to_unary_rpcs(
    channel: grpc.Channel, env: ProxyEnv, method: str, data: bytes
) -> None:
    """Bytes that do not parse answer BAD_REQUEST in the body; bytes that happen to parse get
    a normal answer. Never a transport error, never a crash."""
    call = channel.unary_unary(SERVICE + method)  # raw bytes in, raw bytes out
    raw = call(data, metadata=metadata("fuzz"), timeout=10)
    resp = UNARY[method].FromString(raw)
    assert resp.status.code != Code.CODE_UNSPECIFIED
    assert resp.status.code != Code.INTERNAL_ERROR, resp.status


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(method=st.sampled_from(sorted(STREAMING)), data=st.binary(max_size=256))
def test_random_bytes_to_streaming_rpcs(
    channel: grpc.Channel, env: ProxyEnv, method: str, data: bytes
) -> None:
    call = channel.unary_stream(SERVICE + method)
    answers = [
        STREAMING[method].FromString(r) for r in call(data, metadata=metadata("fuzz"), timeout=15)
    ]
    statuses = [a.status for a in answers if a.HasField("status")]
    assert len(statuses) == 1
    assert statuses[0].code != Code.INTERNAL_ERROR, statuses[0]


def test_proxy_survives_the_fuzzing(channel: grpc.Channel, env: ProxyEnv) -> None:
    _alive(channel, env)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    topic=st.text(max_size=20),
    msg_id=st.text(max_size=40),
    body=st.binary(max_size=64),
    kind=st.integers(min_value=0, max_value=9),
    tag=st.none() | st.text(max_size=10),
    keys=st.lists(st.text(max_size=8), max_size=3),
    group=st.none() | st.text(max_size=70),
    props=st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=3),
    encoding=st.integers(min_value=0, max_value=4),
    delivery_s=st.none() | st.integers(min_value=0, max_value=2**40),
)
def test_wrong_send_requests_get_a_status(
    channel: grpc.Channel,
    env: ProxyEnv,
    topic: str,
    msg_id: str,
    body: bytes,
    kind: int,
    tag: str | None,
    keys: list[str],
    group: str | None,
    props: dict[str, str],
    encoding: int,
    delivery_s: int | None,
) -> None:
    sp = pb.SystemProperties(
        message_id=msg_id, message_type=kind, body_encoding=encoding, keys=keys
    )  # type: ignore[arg-type]
    if tag is not None:
        sp.tag = tag
    if group is not None:
        sp.message_group = group
    if delivery_s is not None:
        sp.delivery_timestamp.seconds = delivery_s
    m = pb.Message(topic=res(topic), body=body, system_properties=sp, user_properties=props)
    stub = service_pb2_grpc.MessagingServiceStub(channel)
    resp = stub.SendMessage(
        svc.SendMessageRequest(messages=[m]), metadata=metadata("fuzz"), timeout=10
    )
    assert resp.status.code != Code.CODE_UNSPECIFIED
    assert resp.status.code != Code.INTERNAL_ERROR, resp.status
    assert len(resp.entries) == 1


def test_wrong_end_transactions(channel: grpc.Channel, env: ProxyEnv) -> None:
    stub = service_pb2_grpc.MessagingServiceStub(channel)
    tx = res("PbTx")
    cases = [
        (svc.EndTransactionRequest(), Code.ILLEGAL_TOPIC),
        (svc.EndTransactionRequest(topic=tx), Code.ILLEGAL_MESSAGE_ID),
        (svc.EndTransactionRequest(topic=tx, message_id="01", transaction_id="t1|x|zz"), Code.INVALID_TRANSACTION_ID),
        # A broker that serves no queue of the topic: the id cannot be ours.
        (svc.EndTransactionRequest(topic=tx, message_id="01", transaction_id="t1|nobroker|10"), Code.INVALID_TRANSACTION_ID),
    ]  # fmt: skip
    for request, code in cases:
        assert stub.EndTransaction(request, metadata=metadata(), timeout=10).status.code == code
    _alive(channel, env)


def test_oversized_request_is_refused_by_grpc_and_proxy_stays_up(
    channel: grpc.Channel, env: ProxyEnv
) -> None:
    call = channel.unary_unary(SERVICE + "SendMessage")
    with pytest.raises(grpc.RpcError) as info:
        call(b"\x0a" + b"\xff" * (8 * 1024 * 1024), metadata=metadata(), timeout=20)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
    _alive(channel, env)


def test_unknown_method_is_unimplemented(channel: grpc.Channel, env: ProxyEnv) -> None:
    with pytest.raises(grpc.RpcError) as info:
        channel.unary_unary(SERVICE + "NoSuchRpc")(b"", timeout=10)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED  # type: ignore[attr-defined]
    _alive(channel, env)

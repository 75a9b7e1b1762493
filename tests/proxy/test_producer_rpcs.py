"""SendMessage, EndTransaction, RecallMessage and transaction check-back through the proxy,
with OrbitMQ's own generated stubs; results are checked with the native admin client."""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

import grpc
import pytest

from orbitmq.client import AsyncAdminClient
from orbitmq.common.record import StoredMessage
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.grpc_v2 import service_pb2 as svc
from orbitmq.proxy.grpc_v2 import service_pb2_grpc
from tests.proxy.conftest import ProxyEnv, endpoints_pb, metadata, proxy_env_fixture, res

TOPICS = {
    "PpNormal": "NORMAL",
    "PpFifo": "FIFO",
    "PpDelay": "DELAY",
    "PpTx": "TRANSACTION",
    "PpCheck": "TRANSACTION",
    "PpMixed": "MIXED",
    "nsA%PpNs": "NORMAL",
}
env = proxy_env_fixture(
    TOPICS,
    broker_options={"transaction_timeout_ms": 300, "transaction_check_interval_ms": 300},
    proxy_options={"transaction_heartbeat_s": 0.5},
)
Code = pb.Code
MT = pb.MessageType


def new_id() -> str:
    return "01" + secrets.token_hex(16).upper()


def message(
    topic: str,
    body: bytes = b"hello",
    *,
    kind: int = MT.NORMAL,
    msg_id: str | None = None,
    **system: Any,
) -> pb.Message:
    sp = pb.SystemProperties(
        message_id=new_id() if msg_id is None else msg_id,
        message_type=kind,  # type: ignore[arg-type]
        body_encoding=pb.Encoding.IDENTITY,
        born_host="127.0.0.1",
        **system,
    )
    sp.born_timestamp.GetCurrentTime()
    return pb.Message(topic=res(topic), system_properties=sp, body=body)


async def send(
    stub: service_pb2_grpc.MessagingServiceStub, *msgs: pb.Message, client_id: str = "p1"
) -> svc.SendMessageResponse:
    return await stub.SendMessage(
        svc.SendMessageRequest(messages=list(msgs)), metadata=metadata(client_id), timeout=10
    )


async def stored(env: ProxyEnv, topic: str, msg_id: str, wait_s: float = 5.0) -> StoredMessage:
    """The message as the broker stores it, looked up natively by its id."""
    deadline = time.monotonic() + wait_s
    async with AsyncAdminClient([env.ns]) as admin:
        while True:
            found = await admin.get_message_by_id(topic, msg_id)
            if found is not None or time.monotonic() > deadline:
                assert found is not None, f"{msg_id} not found in {topic}"
                return found
            await asyncio.sleep(0.1)


async def wait_count(env: ProxyEnv, topic: str, want: int, wait_s: float = 5.0) -> int:
    """Messages visible in ``topic`` once it reaches ``want`` (dispatch trails the append)."""
    deadline = time.monotonic() + wait_s
    while (n := await visible_count(env, topic)) != want and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return n


async def visible_count(env: ProxyEnv, topic: str) -> int:
    async with AsyncAdminClient([env.ns]) as admin:
        total = 0
        for mq in await admin.queues(topic):
            total += await admin.max_offset(mq) - await admin.min_offset(mq)
        return total


async def test_normal_send_keeps_id_tag_keys_and_properties(
    env: ProxyEnv, stub: service_pb2_grpc.MessagingServiceStub
) -> None:
    m = message("PpNormal", b"payload", tag="TagA", keys=["k1", "k2"])
    m.user_properties["color"] = "blue"
    resp = await send(stub, m)
    assert resp.status.code == Code.OK, resp.status
    assert len(resp.entries) == 1
    entry = resp.entries[0]
    assert entry.message_id == m.system_properties.message_id  # echoed, not replaced
    assert entry.offset >= 0 and not entry.transaction_id
    got = await stored(env, "PpNormal", entry.message_id)
    assert got.body == b"payload"
    assert got.tags == "TagA" and got.keys == ["k1", "k2"]
    assert got.properties["color"] == "blue"


async def test_fifo_group_goes_to_one_queue_and_is_stored_as_sharding_key(
    env: ProxyEnv, stub: service_pb2_grpc.MessagingServiceStub
) -> None:
    msgs = [message("PpFifo", f"m{i}".encode(), kind=MT.FIFO, message_group="g1") for i in range(4)]
    queues = set()
    for m in msgs:
        resp = await send(stub, m)
        assert resp.status.code == Code.OK, resp.status
        got = await stored(env, "PpFifo", resp.entries[0].message_id)
        assert got.properties["__SHARDINGKEY"] == "g1"
        queues.add(got.queue_id)
    assert len(queues) == 1


@pytest.mark.parametrize(
    ("topic", "kind", "extra"),
    [
        ("PpNormal", MT.FIFO, {"message_group": "g"}),
        ("PpFifo", MT.NORMAL, {}),
        ("PpNormal", MT.TRANSACTION, {}),
        ("PpTx", MT.NORMAL, {}),
    ],
)
async def test_message_type_must_match_the_topic(
    stub: service_pb2_grpc.MessagingServiceStub, topic: str, kind: int, extra: dict[str, Any]
) -> None:
    resp = await send(stub, message(topic, kind=kind, **extra))
    assert resp.status.code == Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, resp.status
    assert resp.entries[0].status.code == Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE


async def test_mixed_topic_accepts_every_type(stub: service_pb2_grpc.MessagingServiceStub) -> None:
    future = pb.SystemProperties().delivery_timestamp
    future.FromSeconds(int(time.time()) + 60)
    for m in (
        message("PpMixed"),
        message("PpMixed", kind=MT.FIFO, message_group="g"),
        message("PpMixed", kind=MT.DELAY, delivery_timestamp=future),
    ):
        resp = await send(stub, m)
        assert resp.status.code == Code.OK, resp.status


async def test_delay_becomes_a_timer_and_can_be_recalled(
    env: ProxyEnv, stub: service_pb2_grpc.MessagingServiceStub
) -> None:
    due = pb.SystemProperties().delivery_timestamp
    due.FromSeconds(int(time.time()) + 30)
    m = message("PpDelay", kind=MT.DELAY, delivery_timestamp=due)
    resp = await send(stub, m)
    assert resp.status.code == Code.OK, resp.status
    entry = resp.entries[0]
    assert entry.recall_handle
    recall = await stub.RecallMessage(
        svc.RecallMessageRequest(topic=res("PpDelay"), recall_handle=entry.recall_handle),
        metadata=metadata(),
        timeout=10,
    )
    assert recall.status.code == Code.OK, recall.status
    assert recall.message_id == entry.message_id
    bad = await stub.RecallMessage(
        svc.RecallMessageRequest(topic=res("PpDelay"), recall_handle="nonsense"),
        metadata=metadata(),
        timeout=10,
    )
    assert bad.status.code == Code.BAD_REQUEST


async def test_delivery_time_in_milliseconds_is_refused(
    stub: service_pb2_grpc.MessagingServiceStub,
) -> None:
    due = pb.SystemProperties().delivery_timestamp
    due.seconds = int(time.time() * 1000)  # the ms-for-seconds mistake (clients set it raw)
    resp = await send(stub, message("PpDelay", kind=MT.DELAY, delivery_timestamp=due))
    assert resp.status.code == Code.ILLEGAL_DELIVERY_TIME


@pytest.mark.parametrize(
    ("build", "code"),
    [
        (lambda: message("PpNormal", b""), Code.MESSAGE_BODY_EMPTY),
        (lambda: message("PpNormal", msg_id=""), Code.ILLEGAL_MESSAGE_ID),
        (lambda: message("PpNormal", tag="a|b"), Code.ILLEGAL_MESSAGE_TAG),
        (lambda: message("PpNormal", keys=[" "]), Code.ILLEGAL_MESSAGE_KEY),
        (lambda: message("Pp Bad"), Code.ILLEGAL_TOPIC),
        (lambda: message("PpNormal", kind=MT.FIFO), Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        (lambda: message("PpNoSuchTopic"), Code.TOPIC_NOT_FOUND),
    ],
)
async def test_bad_messages_get_precise_codes(
    stub: service_pb2_grpc.MessagingServiceStub, build: Any, code: int
) -> None:
    resp = await send(stub, build())
    assert resp.status.code == code, resp.status
    assert len(resp.entries) == 1


async def test_reserved_property_key_is_refused(
    stub: service_pb2_grpc.MessagingServiceStub,
) -> None:
    m = message("PpNormal")
    m.user_properties["TRAN_MSG"] = "true"
    resp = await send(stub, m)
    assert resp.status.code == Code.ILLEGAL_MESSAGE_PROPERTY_KEY


async def test_several_messages_in_one_request(
    stub: service_pb2_grpc.MessagingServiceStub,
) -> None:
    ok = await send(stub, message("PpNormal"), message("PpNormal"))
    assert ok.status.code == Code.OK and len(ok.entries) == 2
    mixed = await send(stub, message("PpNormal"), message("PpNormal", b""))
    assert mixed.status.code == Code.MULTIPLE_RESULTS
    assert [e.status.code for e in mixed.entries] == [Code.OK, Code.MESSAGE_BODY_EMPTY]


async def _end(
    stub: service_pb2_grpc.MessagingServiceStub,
    topic: str,
    entry: svc.SendResultEntry,
    resolution: int,
    source: int = pb.TransactionSource.SOURCE_CLIENT,
) -> svc.EndTransactionResponse:
    return await stub.EndTransaction(
        svc.EndTransactionRequest(
            topic=res(topic),
            message_id=entry.message_id,
            transaction_id=entry.transaction_id,
            resolution=resolution,  # type: ignore[arg-type]
            source=source,  # type: ignore[arg-type]
        ),
        metadata=metadata(),
        timeout=10,
    )


async def test_transaction_commit_and_rollback(
    env: ProxyEnv, stub: service_pb2_grpc.MessagingServiceStub
) -> None:
    before = await visible_count(env, "PpTx")
    commit = (await send(stub, message("PpTx", b"c", kind=MT.TRANSACTION))).entries[0]
    rollback = (await send(stub, message("PpTx", b"r", kind=MT.TRANSACTION))).entries[0]
    assert commit.status.code == Code.OK and commit.transaction_id
    assert await visible_count(env, "PpTx") == before  # half messages are invisible
    assert (
        await _end(stub, "PpTx", commit, pb.TransactionResolution.COMMIT)
    ).status.code == Code.OK
    done = await _end(stub, "PpTx", rollback, pb.TransactionResolution.ROLLBACK)
    assert done.status.code == Code.OK
    assert await wait_count(env, "PpTx", before + 1) == before + 1
    got = await stored(env, "PpTx", commit.message_id)
    assert got.body == b"c"
    # A contradicting decision, and a made-up transaction id, are refused in the body.
    again = await _end(stub, "PpTx", rollback, pb.TransactionResolution.COMMIT)
    assert again.status.code == Code.PRECONDITION_FAILED, again.status
    fake = svc.SendResultEntry(message_id=commit.message_id, transaction_id="junk")
    bad = await _end(stub, "PpTx", fake, pb.TransactionResolution.COMMIT)
    assert bad.status.code == Code.INVALID_TRANSACTION_ID


async def test_check_back_reaches_the_producer_over_telemetry(
    env: ProxyEnv, stub: service_pb2_grpc.MessagingServiceStub
) -> None:
    """An undecided half message is checked back: the broker asks the proxy, the proxy writes a
    RecoverOrphanedTransactionCommand on the publishing client's Telemetry stream, and the
    client's EndTransaction (source SERVER_CHECK) commits it."""
    client_id = "tx-client"
    outbox: asyncio.Queue[svc.TelemetryCommand | None] = asyncio.Queue()
    settings = pb.Settings(
        client_type=pb.ClientType.PRODUCER,
        access_point=endpoints_pb(env.endpoint),
        publishing=pb.Publishing(topics=[res("PpCheck")], max_body_size=1 << 20),
    )

    async def commands() -> Any:
        yield svc.TelemetryCommand(settings=settings)
        while (cmd := await outbox.get()) is not None:
            yield cmd

    call = stub.Telemetry(commands(), metadata=metadata(client_id))
    try:
        first = await asyncio.wait_for(call.read(), 10)
        assert first.status.code == Code.OK and first.HasField("settings")
        before = await visible_count(env, "PpCheck")
        entry = (
            await send(stub, message("PpCheck", b"tx", kind=MT.TRANSACTION), client_id=client_id)
        ).entries[0]
        unknown = await _end(
            stub, "PpCheck", entry, pb.TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED
        )
        assert unknown.status.code == Code.OK
        cmd = await asyncio.wait_for(call.read(), 20)
        assert cmd.HasField("recover_orphaned_transaction_command"), cmd
        check = cmd.recover_orphaned_transaction_command
        assert check.message.system_properties.message_id == entry.message_id
        assert check.message.topic.name == "PpCheck" and check.message.body == b"tx"
        assert check.message.system_properties.body_encoding == pb.Encoding.IDENTITY
        answer = svc.SendResultEntry(
            message_id=entry.message_id, transaction_id=check.transaction_id
        )
        done = await _end(
            stub,
            "PpCheck",
            answer,
            pb.TransactionResolution.COMMIT,
            pb.TransactionSource.SOURCE_SERVER_CHECK,
        )
        assert done.status.code == Code.OK, done.status
        assert await wait_count(env, "PpCheck", before + 1) == before + 1
    finally:
        await outbox.put(None)
        call.cancel()


async def test_body_over_grpc_default_limit_reaches_the_proxy(
    stub: service_pb2_grpc.MessagingServiceStub,
) -> None:
    """gRPC's 4 MiB receive default is raised: a 5 MiB request is answered in the body
    (MESSAGE_BODY_TOO_LARGE against the 4 MiB limit), not refused by gRPC."""
    resp = await send(stub, message("PpNormal", b"x" * (5 * 1024 * 1024 // 1 - 1024 * 1024 + 1)))
    assert resp.status.code == Code.MESSAGE_BODY_TOO_LARGE, resp.status
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await send(stub, message("PpNormal", b"x" * (6 * 1024 * 1024)))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (await send(stub, message("PpNormal"))).status.code == Code.OK  # still up


async def test_namespace_wraps_the_topic_name(
    env: ProxyEnv, stub: service_pb2_grpc.MessagingServiceStub
) -> None:
    """A namespaced resource is RocketMQ's ``namespace%name`` topic; routes echo the resource."""
    m = message("PpNs")
    m.topic.resource_namespace = "nsA"
    resp = await send(stub, m)
    assert resp.status.code == Code.OK, resp.status
    got = await stored(env, "nsA%PpNs", resp.entries[0].message_id)
    assert got.topic == "nsA%PpNs"
    route = await stub.QueryRoute(
        svc.QueryRouteRequest(topic=res("PpNs", "nsA"), endpoints=endpoints_pb(env.endpoint)),
        metadata=metadata(),
        timeout=10,
    )
    assert route.status.code == Code.OK
    assert route.message_queues[0].topic == res("PpNs", "nsA")

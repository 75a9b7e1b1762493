"""Malformed consumer-side requests: a clear error code each, never a dead broker, a closed
connection, or changed data (stored messages, another group's offsets, members and locks)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orbitmq.broker.controller import BrokerController
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import ProtocolError
from orbitmq.net.client import RemotingClient
from orbitmq.net.loop import new_event_loop
from orbitmq.protocol.bodies import encode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.consumer import (
    ConsumerData,
    HeartbeatData,
    LockBatchBody,
    QueueRef,
    SubscriptionData,
)
from orbitmq.protocol.frame import Frame, FrameDecoder, encode_bytes
from orbitmq.protocol.messages import decode_records, encode_send_body
from tests.broker.conftest import broker_config

GUARD_GROUP = "Guard"
GUARD_CLIENT = "guard-client"
CODES = [
    RequestCode.HEART_BEAT,
    RequestCode.UNREGISTER_CLIENT,
    RequestCode.GET_CONSUMER_LIST_BY_GROUP,
    RequestCode.QUERY_CONSUMER_OFFSET,
    RequestCode.UPDATE_CONSUMER_OFFSET,
    RequestCode.LOCK_BATCH_MQ,
    RequestCode.UNLOCK_BATCH_MQ,
    RequestCode.CONSUMER_SEND_MSG_BACK,
    RequestCode.GET_CONSUMER_CONNECTION_LIST,
    RequestCode.GET_CONSUME_STATS,
    RequestCode.GET_CONSUMER_GROUP_LIST,
    RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
    RequestCode.PULL_MESSAGE,
]


class Shared:
    """One broker for the module on its own loop thread (hypothesis runs many examples), with a
    guard member in a guard group that holds an offset and a lock nothing may touch."""

    def __init__(self, broker: BrokerController, loop: asyncio.AbstractEventLoop) -> None:
        self.broker = broker
        self.loop = loop
        self.client = RemotingClient()

    def run(self, coro: Any, timeout: float = 10) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, frame: Frame) -> Frame:
        return self.run(self.client.invoke(self.broker.address, frame))  # type: ignore[no-any-return]

    def exchange(self, frame: Frame) -> tuple[list[Frame], bool]:
        return self.run(_raw_exchange(self.broker.address, encode_bytes(frame)))  # type: ignore[no-any-return]

    def check_intact(self) -> None:
        b = self.broker
        pull = Frame(
            RequestCode.PULL_MESSAGE,
            fields={"topic": "Safe", "queue_id": 0, "queue_offset": 0, "max_msg_nums": 8},
        )
        resp = self.call(pull)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert [m.body for m in decode_records(resp.body)] == [b"precious", b"more"]
        assert b.offsets.query(GUARD_GROUP, "Safe", 0) == 1
        group = b.consumers.get(GUARD_GROUP)
        assert group is not None and list(group.members) == [GUARD_CLIENT]
        assert b.locks.holder(GUARD_GROUP, "Safe", 0) == GUARD_CLIENT


async def _raw_exchange(addr: str, data: bytes, wait: float = 2.0) -> tuple[list[Frame], bool]:
    """Send raw bytes on a fresh connection; the frames that came back, and whether it closed."""
    host, port = addr.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    frames: list[Frame] = []
    closed = False
    try:
        writer.write(data)
        await writer.drain()
        decoder = FrameDecoder()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                while not frames:
                    chunk = await reader.read(65536)
                    if not chunk:
                        closed = True
                        break
                    frames += [f for f in decoder.feed(chunk) if f.is_response]
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    return frames, closed


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    loop = new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    broker = BrokerController(
        broker_config(
            tmp_path_factory.mktemp("consumer-bad") / "store",
            rebalance_lock_ttl_s=3600,
            consumer_expiry_s=3600,
        )
    )
    s = Shared(broker, loop)
    s.run(broker.start(), 30)
    guard = RemotingClient(name="guard")  # stays connected: its member must survive everything
    try:
        send = Frame(
            RequestCode.SEND_BATCH_MESSAGE,
            fields={"topic": "Safe", "queue_id": 0},
            body=encode_send_body([b"precious", b"more"], [b"", b""]),
        )
        assert s.call(send).code == ResponseCode.SUCCESS
        s.run(asyncio.to_thread(broker.store.wait_for_dispatch))
        hb = HeartbeatData(
            client_id=GUARD_CLIENT,
            consumers=[
                ConsumerData(group=GUARD_GROUP, subscriptions=[SubscriptionData(topic="Safe")])
            ],
        )
        beat = Frame(RequestCode.HEART_BEAT, body=encode_body(hb))
        assert s.run(guard.invoke(broker.address, beat)).code == ResponseCode.SUCCESS
        commit = Frame(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            fields={"group": GUARD_GROUP, "topic": "Safe", "queue_id": 0, "offset": 1},
        )
        assert s.call(commit).code == ResponseCode.SUCCESS
        lock = LockBatchBody(
            group=GUARD_GROUP,
            client_id=GUARD_CLIENT,
            queues=[QueueRef(topic="Safe", broker_name="broker-a", queue_id=0)],
        )
        assert s.call(Frame(RequestCode.LOCK_BATCH_MQ, body=encode_body(lock))).code == 0
        s.check_intact()
        yield s
    finally:
        s.run(guard.close())
        s.run(s.client.close())
        s.run(broker.stop(), 30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def _check_answer(shared: Shared, frame: Frame) -> Frame:
    frames, closed = shared.exchange(frame)
    assert not closed, "the broker closed the connection"
    assert len(frames) == 1 and frames[0].opaque == frame.opaque
    answer = frames[0]
    assert answer.code != ResponseCode.SYSTEM_ERROR, answer.remark
    if answer.code != ResponseCode.SUCCESS:
        assert answer.remark, f"code {answer.code} without a remark"
    return answer


# ---------------------------------------------------------------------------- hand-picked cases


def _hb(**consumer: Any) -> bytes:
    subs = consumer.pop("subscriptions", [SubscriptionData(topic="Safe")])
    return encode_body(
        HeartbeatData(client_id="c", consumers=[ConsumerData(subscriptions=subs, **consumer)])
    )


def _lock(**kw: Any) -> bytes:
    body = {"group": "G1", "client_id": "c", "queues": []}
    body.update(kw)
    return msgspec.msgpack.encode(body)


CASES: list[tuple[int, dict[str, Any], bytes, int]] = [
    (RequestCode.HEART_BEAT, {}, b"", ResponseCode.MESSAGE_ILLEGAL),
    (RequestCode.HEART_BEAT, {}, b"\xc1", ResponseCode.MESSAGE_ILLEGAL),
    (RequestCode.HEART_BEAT, {}, msgspec.msgpack.encode({"consumers": []}), ResponseCode.MESSAGE_ILLEGAL),
    (RequestCode.HEART_BEAT, {}, msgspec.msgpack.encode({"client_id": ""}), ResponseCode.MESSAGE_ILLEGAL),
    (RequestCode.HEART_BEAT, {}, _hb(group="G1", consume_type="LAZY"), ResponseCode.MESSAGE_ILLEGAL),
    (RequestCode.HEART_BEAT, {}, _hb(group="x" * 200), ResponseCode.MESSAGE_ILLEGAL),
    (RequestCode.HEART_BEAT, {}, _hb(group="G1", subscriptions=[SubscriptionData(topic="bad topic")]), ResponseCode.MESSAGE_ILLEGAL),
    (RequestCode.HEART_BEAT, {}, _hb(group="G1", subscriptions=[SubscriptionData(topic="Safe", expression_type="SQL92", expression="((((")]), ResponseCode.SUBSCRIPTION_PARSE_FAILED),
    (RequestCode.HEART_BEAT, {}, _hb(group="G1", subscriptions=[SubscriptionData(topic="Safe", expression="||")]), ResponseCode.SUBSCRIPTION_PARSE_FAILED),
    (RequestCode.HEART_BEAT, {}, _hb(group="G1", subscriptions=[SubscriptionData(topic="Safe", expression_type="SQL92", expression="a = 1 OR " * 600 + "a = 2")]), ResponseCode.SUBSCRIPTION_PARSE_FAILED),
    (RequestCode.UNREGISTER_CLIENT, {}, b"", ResponseCode.MESSAGE_ILLEGAL),
    (RequestCode.UNREGISTER_CLIENT, {"client_id": "c", "group": 5}, b"", ResponseCode.MESSAGE_ILLEGAL),
    (RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"group": "Nobody"}, b"", ResponseCode.CONSUMER_NOT_ONLINE),
    (RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"group": "a b"}, b"", ResponseCode.MESSAGE_ILLEGAL),
    (RequestCode.GET_CONSUMER_CONNECTION_LIST, {"group": "Nobody"}, b"", ResponseCode.CONSUMER_NOT_ONLINE),
    (RequestCode.QUERY_CONSUMER_OFFSET, {"group": "G1", "topic": "Safe", "queue_id": -1}, b"", ResponseCode.MESSAGE_ILLEGAL),
    (RequestCode.QUERY_CONSUMER_OFFSET, {"group": "G1", "topic": "Safe", "queue_id": 0, "set_zero_if_not_found": False}, b"", ResponseCode.QUERY_NOT_FOUND),
    (RequestCode.UPDATE_CONSUMER_OFFSET, {"group": "G1", "topic": "Safe", "queue_id": 0, "offset": 3}, b"", ResponseCode.OFFSET_ILLEGAL),
    (RequestCode.UPDATE_CONSUMER_OFFSET, {"group": "G1", "topic": "Safe", "queue_id": 0, "offset": -1}, b"", ResponseCode.OFFSET_ILLEGAL),
    (RequestCode.UPDATE_CONSUMER_OFFSET, {"group": "G1", "topic": "Safe", "queue_id": 99999, "offset": 0}, b"", ResponseCode.MESSAGE_ILLEGAL),
    (RequestCode.UPDATE_CONSUMER_OFFSET, {"group": "G1", "topic": "No", "queue_id": 0, "offset": 0}, b"", ResponseCode.TOPIC_NOT_EXIST),
    (RequestCode.UPDATE_CONSUMER_OFFSET, {}, msgspec.msgpack.encode({"group": "G1", "offsets": [{"topic": "Safe"}]}), ResponseCode.MESSAGE_ILLEGAL),
    (RequestCode.UPDATE_CONSUMER_OFFSET, {"group": "G2"}, msgspec.msgpack.encode({"group": "G1", "offsets": []}), ResponseCode.MESSAGE_ILLEGAL),
    (RequestCode.LOCK_BATCH_MQ, {}, b"", ResponseCode.MESSAGE_ILLEGAL),
    (RequestCode.LOCK_BATCH_MQ, {}, _lock(queues=[{"topic": "Safe", "broker_name": "b", "queue_id": -3}]), ResponseCode.MESSAGE_ILLEGAL),
    (RequestCode.LOCK_BATCH_MQ, {}, _lock(queues=[{"topic": "S S", "broker_name": "b", "queue_id": 0}]), ResponseCode.MESSAGE_ILLEGAL),
    (RequestCode.LOCK_BATCH_MQ, {}, _lock(client_id=""), ResponseCode.MESSAGE_ILLEGAL),
    (RequestCode.UNLOCK_BATCH_MQ, {}, _lock(queues="all"), ResponseCode.MESSAGE_ILLEGAL),
    (RequestCode.CONSUMER_SEND_MSG_BACK, {"group": "G1"}, b"", ResponseCode.MESSAGE_ILLEGAL),
    (RequestCode.CONSUMER_SEND_MSG_BACK, {"group": "G1", "offset": 3}, b"", ResponseCode.QUERY_NOT_FOUND),
    (RequestCode.CONSUMER_SEND_MSG_BACK, {"group": "G1", "offset": 2**62}, b"", ResponseCode.QUERY_NOT_FOUND),
    (RequestCode.CONSUMER_SEND_MSG_BACK, {"group": "G1", "offset": 0, "origin_topic": "Else"}, b"", ResponseCode.MESSAGE_ILLEGAL),
    (RequestCode.CONSUMER_SEND_MSG_BACK, {"group": "x" * 121, "offset": 0}, b"", ResponseCode.MESSAGE_ILLEGAL),
    (RequestCode.GET_CONSUME_STATS, {"group": "Nobody"}, b"", ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST),
    (RequestCode.GET_CONSUME_STATS, {}, b"", ResponseCode.MESSAGE_ILLEGAL),
    (RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, {"group": "Nobody", "topic": "Safe", "position": "latest"}, b"", ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST),
    (RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, {"group": GUARD_GROUP, "topic": "Safe", "position": "now"}, b"", ResponseCode.MESSAGE_ILLEGAL),
    (RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, {"group": GUARD_GROUP, "topic": "Safe", "position": "timestamp", "timestamp_ms": -1}, b"", ResponseCode.MESSAGE_ILLEGAL),
    (RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, {"group": GUARD_GROUP, "topic": "Absent", "position": "latest"}, b"", ResponseCode.TOPIC_NOT_EXIST),
    (RequestCode.PULL_MESSAGE, {"topic": "Safe", "queue_id": 0, "queue_offset": 0, "expression_type": "SQL92", "expression": "a = "}, b"", ResponseCode.SUBSCRIPTION_PARSE_FAILED),
    (RequestCode.PULL_MESSAGE, {"topic": "Safe", "queue_id": 0, "queue_offset": 0, "expression_type": "JSONPATH"}, b"", ResponseCode.SUBSCRIPTION_PARSE_FAILED),
    (RequestCode.PULL_MESSAGE, {"topic": "Safe", "queue_id": 0, "queue_offset": 0, "expression": 7}, b"", ResponseCode.MESSAGE_ILLEGAL),
    (RequestCode.PULL_MESSAGE, {"topic": "Safe", "queue_id": 0, "queue_offset": 0, "commit_offset": 1}, b"", ResponseCode.MESSAGE_ILLEGAL),
    (RequestCode.PULL_MESSAGE, {"topic": "Safe", "queue_id": 0, "queue_offset": 0, "group": "", "commit_offset": 1}, b"", ResponseCode.MESSAGE_ILLEGAL),
    (RequestCode.PULL_MESSAGE, {"topic": "Safe", "queue_id": 0, "queue_offset": 0, "group": "a b"}, b"", ResponseCode.MESSAGE_ILLEGAL),
]  # fmt: skip


@pytest.mark.parametrize(("code", "fields", "body", "expected"), CASES)
def test_bad_request_gets_its_code(
    shared: Shared, code: int, fields: dict[str, Any], body: bytes, expected: int
) -> None:
    answer = _check_answer(shared, Frame(code, 41, fields=fields, body=body))
    assert answer.code == expected, answer.remark
    shared.check_intact()


# ---------------------------------------------------------------------------- fuzzing

_FIELD_NAMES = [
    "group", "client_id", "topic", "queue_id", "offset", "origin_topic", "max_reconsume_times",
    "position", "timestamp_ms", "queue_offset", "expression_type", "expression",
    "commit_offset", "max_msg_nums", "tags",
]  # fmt: skip
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.integers(-3, 10),
    st.text(max_size=24),
    st.sampled_from(["G1", "Safe", "c", "%RETRY%G1", "earliest", "latest", "timestamp", "SQL92", "TAG", "*", "a > 1", "a >"]),
    st.binary(max_size=8),
    st.floats(allow_nan=True),
)  # fmt: skip
_values = st.one_of(
    _scalars,
    st.lists(_scalars, max_size=3),
    st.dictionaries(st.text(max_size=5), _scalars, max_size=3),
)
_sub = st.fixed_dictionaries(
    {},
    optional={
        "topic": st.one_of(st.sampled_from(["Safe", "X"]), _scalars),
        "expression_type": st.one_of(st.sampled_from(["TAG", "SQL92"]), _scalars),
        "expression": st.one_of(
            st.sampled_from(["*", "a || b", "a > 1 AND b IS NULL", "("]), st.text(max_size=40)
        ),
        "sub_version": _scalars,
    },
)
_consumer = st.fixed_dictionaries(
    {},
    optional={
        "group": st.one_of(st.sampled_from(["G1", "G2"]), _scalars),
        "consume_type": st.one_of(st.sampled_from(["PUSH", "PULL", "POP"]), _scalars),
        "message_model": st.one_of(st.sampled_from(["CLUSTERING", "BROADCASTING"]), _scalars),
        "consume_from_where": _scalars,
        "subscriptions": st.one_of(st.lists(_sub, max_size=3), _scalars),
    },
)
_queue = st.fixed_dictionaries(
    {},
    optional={
        "topic": st.one_of(st.just("Safe"), _scalars),
        "broker_name": _scalars,
        "queue_id": _scalars,
    },
)
_structured = st.one_of(
    st.fixed_dictionaries(  # HeartbeatData-like
        {},
        optional={
            "client_id": st.one_of(st.just("c"), _scalars),
            "language": _scalars,
            "producer_groups": st.one_of(st.lists(st.one_of(st.just("PG"), _scalars), max_size=3), _scalars),
            "consumers": st.one_of(st.lists(_consumer, max_size=3), _scalars),
        },
    ),
    st.fixed_dictionaries(  # LockBatchBody-like
        {},
        optional={
            "group": st.one_of(st.just("G1"), _scalars),
            "client_id": st.one_of(st.just("c"), _scalars),
            "queues": st.one_of(st.lists(_queue, max_size=4), _scalars),
        },
    ),
    st.fixed_dictionaries(  # OffsetsBody-like
        {},
        optional={
            "group": st.one_of(st.just("G1"), _scalars),
            "offsets": st.one_of(
                st.lists(st.fixed_dictionaries({}, optional={"topic": st.one_of(st.just("Safe"), _scalars), "queue_id": _scalars, "offset": _scalars}), max_size=3),
                _scalars,
            ),
        },
    ),
)  # fmt: skip


def _packable(value: Any) -> bytes | None:
    try:
        return msgspec.msgpack.encode(value)
    except (OverflowError, TypeError, ValueError):
        return None


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    code=st.sampled_from(CODES),
    fields=st.dictionaries(st.sampled_from(_FIELD_NAMES), _values, max_size=6),
    body=st.one_of(
        st.just(b""), st.binary(max_size=64), _structured.map(_packable), _values.map(_packable)
    ),
)
def test_fuzzed_consumer_requests(
    shared: Shared, code: int, fields: dict[str, Any], body: bytes | None
) -> None:
    frame = Frame(code, 9, fields=fields, body=body or b"")
    try:
        encode_bytes(frame)
    except (OverflowError, ProtocolError):  # a header the frame cannot carry: nothing to send
        return
    _check_answer(shared, frame)
    shared.check_intact()

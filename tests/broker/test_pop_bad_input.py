"""Malformed Pop requests: a clear error code each, the broker stays up, no state changes."""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orbitmq.broker.controller import BrokerController
from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from orbitmq.net.loop import new_event_loop
from orbitmq.protocol.bodies import encode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.consumer import ReceiptHandleList
from orbitmq.protocol.frame import Frame
from tests.broker.conftest import broker_config
from tests.broker.test_pop import ack, call, make_topic, pop, send

T = TypeVar("T")
CANARY = "Canary"


class Shared:
    """One broker for the module on its own loop thread (hypothesis runs many examples)."""

    def __init__(self, broker: BrokerController, loop: asyncio.AbstractEventLoop) -> None:
        self.broker = broker
        self.loop = loop
        self.client = RemotingClient()
        self.handles: list[str] = []

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 10) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def request(self, frame: Frame) -> Frame:
        return self.run(call(self.client, self.broker, frame))

    def canary_unchanged(self) -> None:
        assert self.broker.pop.inflight(CANARY, "Safe", 0) == len(self.handles)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    loop = new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    broker = BrokerController(broker_config(tmp_path_factory.mktemp("popbad") / "store"))
    s = Shared(broker, loop)
    s.run(broker.start(), 30)
    make_topic(broker, "Safe")
    s.run(send(s.client, broker, "Safe", [b"precious-1", b"precious-2"]))
    _, msgs, s.handles = s.run(pop(s.client, broker, "Safe", group=CANARY))
    assert len(msgs) == 2
    yield s
    s.run(s.client.close())
    s.run(broker.stop(), 30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=80),
    st.binary(max_size=40),
    st.lists(st.text(max_size=10), max_size=3),
    st.sampled_from(["Safe", CANARY, "G", "", "*", "LAST_OFFSET", "SQL92", "TAG", "a > 1"]),
)
POP_FIELDS = [
    "group", "topic", "queue_id", "max_msg_nums", "invisible_time_ms", "poll_time_ms",
    "expression_type", "expression", "consume_from_where", "client_id",
]  # fmt: skip
ACK_FIELDS = ["group", "topic", "handle", "invisible_time_ms"]
HANDLE_ERRORS = {ResponseCode.RECEIPT_HANDLE_INVALID, ResponseCode.RECEIPT_HANDLE_EXPIRED}


def _fields(names: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.sampled_from(names), values, max_size=len(names))


def _no_long_poll(fields: dict[str, Any]) -> dict[str, Any]:
    if fields.get("poll_time_ms") not in (None, 0):
        fields["poll_time_ms"] = 0  # a valid long poll would only make the example slow
    if fields.get("group") == CANARY:
        fields["group"] = "NotCanary"
    return fields


SLOW = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SLOW
@given(fields=_fields(POP_FIELDS))
def test_pop_fields(shared: Shared, fields: dict[str, Any]) -> None:
    resp = shared.request(Frame(RequestCode.POP_MESSAGE, fields=_no_long_poll(fields)))
    assert resp.code in {
        ResponseCode.SUCCESS,
        ResponseCode.PULL_NOT_FOUND,
        ResponseCode.MESSAGE_ILLEGAL,
        ResponseCode.TOPIC_NOT_EXIST,
        ResponseCode.SUBSCRIPTION_PARSE_FAILED,
    }, (resp.code, resp.remark)
    assert resp.code == ResponseCode.SUCCESS or resp.remark
    shared.canary_unchanged()


@SLOW
@given(
    fields=_fields(ACK_FIELDS),
    code=st.sampled_from(
        [int(RequestCode.ACK_MESSAGE), int(RequestCode.CHANGE_MESSAGE_INVISIBLETIME)]
    ),
)
def test_ack_and_change_fields(shared: Shared, fields: dict[str, Any], code: int) -> None:
    resp = shared.request(Frame(code, fields=_no_long_poll(fields)))
    assert resp.code in {ResponseCode.MESSAGE_ILLEGAL, *HANDLE_ERRORS}, (resp.code, resp.remark)
    assert resp.remark
    shared.canary_unchanged()


@SLOW
@given(body=st.one_of(st.binary(max_size=200), st.builds(
    lambda g, t, h: encode_body(ReceiptHandleList(group=g, topic=t, handles=h)),
    st.text(max_size=20), st.text(max_size=20), st.lists(st.text(max_size=60), max_size=5),
)))  # fmt: skip
def test_batch_ack_bodies(shared: Shared, body: bytes) -> None:
    resp = shared.request(Frame(RequestCode.BATCH_ACK_MESSAGE, body=body))
    assert resp.code in {ResponseCode.SUCCESS, ResponseCode.MESSAGE_ILLEGAL}, resp.remark
    shared.canary_unchanged()


@SLOW
@given(data=st.data())
def test_mutated_handles_are_invalid(shared: Shared, data: st.DataObject) -> None:
    """Any change to a real handle fails its MAC: INVALID, never acked."""
    good = shared.handles[0]
    pos = data.draw(st.integers(0, len(good) - 1))
    alphabet = st.sampled_from(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_+/="
    )
    char = data.draw(alphabet.filter(lambda c: c != good[pos]))
    mutated = good[:pos] + char + good[pos + 1 :]
    for code in (RequestCode.ACK_MESSAGE, RequestCode.CHANGE_MESSAGE_INVISIBLETIME):
        fields = {"group": CANARY, "topic": "Safe", "handle": mutated, "invisible_time_ms": 1000}
        resp = shared.request(Frame(code, fields=fields))
        assert resp.code == ResponseCode.RECEIPT_HANDLE_INVALID, resp.remark
    shared.canary_unchanged()


def test_truncated_and_padded_handles(shared: Shared) -> None:
    good = shared.handles[0]
    raw = base64.urlsafe_b64decode(good)
    for bad in (good[:-4], good + "AAAA", good + "=", base64.b64encode(raw).decode() + " "):
        resp = shared.run(ack(shared.client, shared.broker, "Safe", bad, group=CANARY))
        assert resp.code == ResponseCode.RECEIPT_HANDLE_INVALID
    shared.canary_unchanged()

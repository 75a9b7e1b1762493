"""The producer reads the error registry's policy (orbitmq.common.errors), one test per code.

- A *stored* answer (FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE) means the
  message is stored, less safely than asked: the send returns a SendResult with that status and
  nothing is sent again, whatever the send mode (RocketMQ does the same unless asked with
  retryAnotherBrokerWhenNotStoreOK).
- NO_PERMISSION refreshes the route but is not retried: sending again cannot succeed there.
- Retriable answers go to the other broker; the rest are raised at once.
"""

from __future__ import annotations

import pytest

from orbitmq.client import Message, SendStatus
from orbitmq.client.producer.types import STATUS_BY_CODE
from orbitmq.client.route import _namesrv_unwell
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import NoPermissionError, RemoteError, error_class, registered_codes
from tests.client.conftest import FakeCluster, MakeProducer

STORED = [
    ResponseCode.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE,
]


def all_bodies(cluster: FakeCluster) -> list[bytes]:
    return [b for broker in cluster.brokers for b in broker.bodies("T")]


def sends(cluster: FakeCluster) -> int:
    return sum(len(b.sends) for b in cluster.brokers)


def test_every_stored_code_has_a_send_status() -> None:
    stored = {c for c, cls in registered_codes().items() if cls.stored}
    assert stored == set(STORED)
    for code in STORED:
        assert STATUS_BY_CODE[code] is SendStatus[ResponseCode(code).name]
        assert not error_class(code).retriable


@pytest.mark.parametrize("code", STORED, ids=[ResponseCode(c).name for c in STORED])
async def test_stored_answer_is_a_send_result_never_a_resend(
    cluster: FakeCluster, make_producer: MakeProducer, code: int
) -> None:
    p = await make_producer(retry_times_when_send_failed=5, linger_ms=0)
    status = SendStatus[ResponseCode(code).name]
    for broker in cluster.brokers:
        broker.fail_next = [(code, {"stored": True})] * 10
    r = await p.send(Message("T", b"one"))
    assert r.status is status
    assert sends(cluster) == 1
    r = await p.send_batch([Message("T", b"b1"), Message("T", b"b2")])
    assert r.status is status
    assert sends(cluster) == 2
    r = await p.send_async(Message("T", b"async"))
    assert r.status is status
    assert sends(cluster) == 3
    assert sorted(b for broker in cluster.brokers for b in broker.bodies("T")) == sorted(
        [b"one", b"b1", b"b2", b"async"]
    )  # each stored once


@pytest.mark.parametrize("code", STORED, ids=[ResponseCode(c).name for c in STORED])
async def test_stored_answer_without_offsets_is_raised_not_resent(
    cluster: FakeCluster, make_producer: MakeProducer, code: int
) -> None:
    p = await make_producer(retry_times_when_send_failed=5)
    for broker in cluster.brokers:
        broker.fail_next = [(code, {})] * 10
    with pytest.raises(RemoteError) as info:
        await p.send(Message("T", b"x"))
    assert info.value.code == code and info.value.stored
    assert sends(cluster) == 1


async def test_no_permission_refreshes_the_route_and_is_not_retried(
    cluster: FakeCluster, make_producer: MakeProducer, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = await make_producer(retry_times_when_send_failed=5)
    refreshed: list[str] = []
    monkeypatch.setattr(p.routes, "refresh_soon", refreshed.append)
    for broker in cluster.brokers:
        broker.fail_next = [(ResponseCode.NO_PERMISSION, {})] * 10
    with pytest.raises(NoPermissionError) as info:
        await p.send(Message("T", b"x"))
    assert isinstance(info.value, RemoteError) and info.value.code == ResponseCode.NO_PERMISSION
    assert sends(cluster) == 1
    assert refreshed == ["T"]


@pytest.mark.parametrize(
    "code",
    [
        ResponseCode.SYSTEM_ERROR,
        ResponseCode.SYSTEM_BUSY,
        ResponseCode.SERVICE_NOT_AVAILABLE,
        ResponseCode.STORE_IO_ERROR,
        ResponseCode.STORE_CLOSED,
    ],
    ids=lambda c: ResponseCode(c).name,
)
async def test_retriable_answer_goes_to_the_other_broker(
    cluster: FakeCluster, make_producer: MakeProducer, code: int
) -> None:
    p = await make_producer()
    cluster.a.fail_next = [(code, {})]
    cluster.b.fail_next = [(code, {})]
    r = await p.send(Message("T", b"x"))
    assert r.status is SendStatus.SEND_OK
    assert sends(cluster) == 3  # each broker refused once (one after the other); then stored
    assert all_bodies(cluster) == [b"x"]


def test_a_nameserver_is_skipped_only_for_an_unwell_answer() -> None:
    assert _namesrv_unwell(ResponseCode.SYSTEM_BUSY)
    assert _namesrv_unwell(ResponseCode.SYSTEM_ERROR)
    assert not _namesrv_unwell(ResponseCode.TOPIC_NOT_EXIST)  # a real answer about the topic
    assert not _namesrv_unwell(ResponseCode.SUCCESS)
    assert not _namesrv_unwell(ResponseCode.NO_PERMISSION)

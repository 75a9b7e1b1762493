"""A held pull answered on arrival, in the dispatch round that made the message readable
(broker/long_polling.py), and the cases left to the pull's own task."""

from __future__ import annotations

import asyncio

import pytest

from orbitmq.broker.controller import BrokerController
from orbitmq.broker.long_polling import LongPolling
from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.group_config import SubscriptionGroupConfig
from orbitmq.protocol.messages import decode_records
from tests.broker.test_broker import pull_frame, send_frame

WAIT_S = 5.0


async def _held(
    broker: BrokerController, client: RemotingClient, frame: Frame
) -> asyncio.Future[Frame]:
    """Send a pull and return once the broker holds it (bounded wait)."""
    held = broker.long_polling.held
    pending = asyncio.ensure_future(client.invoke(broker.address, frame, timeout=10))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while broker.long_polling.held <= held:
        assert loop.time() < deadline, "the pull was never held"
        assert not pending.done(), pending.result()
        await asyncio.sleep(0.01)
    return pending


def _out(broker: BrokerController) -> float:
    return float(broker.metrics.messages_out._value.get())


async def test_a_held_pull_is_answered_on_arrival_once(
    broker: BrokerController, client: RemotingClient
) -> None:
    await client.invoke(broker.address, send_frame("T", [b"first"]))
    await asyncio.to_thread(broker.store.wait_for_dispatch)
    out_before = _out(broker)
    pending = await _held(broker, client, pull_frame("T", 0, 1, suspend_timeout_ms=5000))
    resp = await client.invoke(broker.address, send_frame("T", [b"second", b"third"]))
    assert resp.code == ResponseCode.SUCCESS
    resp = await asyncio.wait_for(pending, WAIT_S)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert [m.body for m in decode_records(resp.body)] == [b"second", b"third"]
    assert resp.fields["next_begin_offset"] == 3 and resp.fields["max_offset"] == 3
    assert broker.long_polling.answered == 1
    assert broker.store.dispatcher.recent.served == 1  # from the round's records (recent.py)
    info = await client.invoke(broker.address, Frame(RequestCode.GET_BROKER_RUNTIME_INFO))
    assert info.code == ResponseCode.SUCCESS and info.fields["pulls_answered_on_arrival"] == 1
    assert _out(broker) - out_before == 2  # counted once: the task did not answer again
    # the connection goes on answering in order
    resp = await client.invoke(broker.address, pull_frame("T", 0, 0))
    assert [m.body for m in decode_records(resp.body)] == [b"first", b"second", b"third"]


async def test_a_tag_that_does_not_match_is_left_to_the_task(
    broker: BrokerController, client: RemotingClient
) -> None:
    await client.invoke(broker.address, send_frame("T", [b"first"], TAGS="a"))
    await asyncio.to_thread(broker.store.wait_for_dispatch)
    frame = pull_frame("T", 0, 1, suspend_timeout_ms=5000, tags=["b"])
    pending = await _held(broker, client, frame)
    await client.invoke(broker.address, send_frame("T", [b"second"], TAGS="a"))
    resp = await asyncio.wait_for(pending, WAIT_S)
    assert resp.code == ResponseCode.PULL_RETRY_IMMEDIATELY
    assert resp.fields["next_begin_offset"] == 2
    assert broker.long_polling.answered == 0


async def test_a_group_disabled_while_held_gets_its_error(
    broker: BrokerController, client: RemotingClient
) -> None:
    await client.invoke(broker.address, send_frame("T", [b"first"]))
    await asyncio.to_thread(broker.store.wait_for_dispatch)
    frame = pull_frame("T", 0, 1, suspend_timeout_ms=5000, group="G")
    pending = await _held(broker, client, frame)
    broker.groups.upsert(SubscriptionGroupConfig(group_name="G", consume_enable=False))
    await client.invoke(broker.address, send_frame("T", [b"second"]))
    resp = await asyncio.wait_for(pending, WAIT_S)
    assert resp.code == ResponseCode.NO_PERMISSION
    assert broker.long_polling.answered == 0


@pytest.mark.parametrize("outcome", ["declines", "raises"])
async def test_the_task_wakes_when_the_answer_does_not_answer(outcome: str) -> None:
    polling = LongPolling()
    polling.bind(asyncio.get_running_loop())

    def answer() -> bool:
        if outcome == "raises":
            raise RuntimeError("boom")
        return False

    waiter = asyncio.ensure_future(polling.wait("T", 0, 4, WAIT_S, None, answer))
    await asyncio.sleep(0)
    polling.on_arrival("T", 0, 4)  # not past the waiter's offset: nobody wakes
    await asyncio.sleep(0)
    assert not waiter.done()
    polling.on_arrival("T", 0, 5)
    assert await asyncio.wait_for(waiter, WAIT_S) is True
    assert polling.answered == 0 and not polling.waiters and polling.held == 0


async def test_held_pulls_are_long_polling_in_rpc_latency(
    broker: BrokerController, client: RemotingClient
) -> None:
    """rocketmq_rpc_latency{is_long_polling}: "true" for a pull held until a message arrived
    (answered on arrival) and for one held until its time was up; "false" for one answered at
    once. No frame is left marked."""
    await client.invoke(broker.address, send_frame("T", [b"first"]))
    await asyncio.to_thread(broker.store.wait_for_dispatch)
    reg = broker.metrics.registry

    def count(held: str, response: str) -> float:
        labels = {"request_code": "pull_message", "response_code": response,
                  "is_long_polling": held, "protocol_type": "remoting", "result": "success",
                  "cluster": broker.config.cluster, "node_type": "broker",
                  "node_id": broker.config.broker_name}  # fmt: skip
        return reg.get_sample_value("rocketmq_rpc_latency_count", labels) or 0.0

    assert (await client.invoke(broker.address, pull_frame("T", 0, 0))).code == 0
    pending = await _held(broker, client, pull_frame("T", 0, 1, suspend_timeout_ms=5000))
    await client.invoke(broker.address, send_frame("T", [b"second"]))
    assert (await asyncio.wait_for(pending, WAIT_S)).code == ResponseCode.SUCCESS
    timed_out = await client.invoke(broker.address, pull_frame("T", 0, 2, suspend_timeout_ms=50))
    assert timed_out.code == ResponseCode.PULL_NOT_FOUND
    assert count("false", "success") == 1
    assert count("true", "success") == 1
    assert count("true", "pull_not_found") == 1
    assert not broker.metrics.rmq.suspended

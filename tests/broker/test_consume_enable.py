"""consume_enable (RocketMQ's consumeEnable) on every consuming path of the broker.

Handing messages out is refused (NO_PERMISSION) for a disabled group: a pull naming the group and
a pop, also when they were held (long polling) before the group was disabled (RocketMQ answers a
held request as a new one when it wakes). Finishing or inspecting what was handed out is not:
ack, batch ack, change invisible time and QUERY_CONSUMER_OFFSET work, as on RocketMQ. The
proxy's ReceiveMessage/PullMessage (tests/proxy) and the lite-pull client (tests/client) go
through these paths. Pull ones naming the group elsewhere: tests/broker/test_broker.py."""

from __future__ import annotations

import asyncio

from orbitmq.broker.controller import BrokerController
from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.group_config import SubscriptionGroupConfig
from tests.broker.test_broker import pull_frame
from tests.broker.test_pop import GROUP, ack, change, make_topic, pop, send


def enable(broker: BrokerController, group: str, on: bool) -> None:
    broker.groups.upsert(SubscriptionGroupConfig(group_name=group, consume_enable=on))


async def test_a_held_pull_of_a_group_disabled_meanwhile_gets_nothing(
    broker: BrokerController, client: RemotingClient
) -> None:
    make_topic(broker, "HP")
    held = asyncio.ensure_future(
        client.invoke(
            broker.address,
            pull_frame("HP", 0, 0, group="GH", suspend_timeout_ms=5_000),
            timeout=10,
        )
    )
    await asyncio.sleep(0.3)  # the pull is held
    enable(broker, "GH", False)
    await send(client, broker, "HP", [b"a"])
    resp = await held
    assert resp.code == ResponseCode.NO_PERMISSION and "consume_enable" in (resp.remark or "")
    enable(broker, "GH", True)
    resp = await client.invoke(broker.address, pull_frame("HP", 0, 0, group="GH"))
    assert resp.code == ResponseCode.SUCCESS


async def test_a_held_pop_of_a_group_disabled_meanwhile_gets_nothing(
    broker: BrokerController, client: RemotingClient
) -> None:
    make_topic(broker, "HQ")
    held = asyncio.ensure_future(pop(client, broker, "HQ", poll_time_ms=5_000))
    await asyncio.sleep(0.3)
    enable(broker, GROUP, False)
    await send(client, broker, "HQ", [b"a"])
    resp, msgs, _ = await held
    assert resp.code == ResponseCode.NO_PERMISSION and not msgs
    assert broker.pop.state.open_entries(GROUP) == 0  # nothing handed out
    enable(broker, GROUP, True)
    _, msgs, _ = await pop(client, broker, "HQ")
    assert [m.body for m in msgs] == [b"a"]


async def test_acks_changes_and_offset_queries_still_work_while_disabled(
    broker: BrokerController, client: RemotingClient
) -> None:
    make_topic(broker, "AK")
    await send(client, broker, "AK", [b"a", b"b"])
    _, msgs, handles = await pop(client, broker, "AK")
    assert len(msgs) == 2
    enable(broker, GROUP, False)
    assert (await ack(client, broker, "AK", handles[0])).code == ResponseCode.SUCCESS
    changed = await change(client, broker, "AK", handles[1], 60_000)
    assert changed.code == ResponseCode.SUCCESS, changed.remark
    q = Frame(
        RequestCode.QUERY_CONSUMER_OFFSET, fields={"group": GROUP, "topic": "AK", "queue_id": 0}
    )
    resp = await client.invoke(broker.address, q)
    assert resp.code == ResponseCode.SUCCESS and resp.fields["offset"] == 2
    assert broker.pop.state.open_entries(GROUP) == 1

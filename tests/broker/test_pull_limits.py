"""How many records one pull may return: many without a filter (bounded by max_bytes), at
most MAX_PULL_MESSAGES with one (a filtered read scans a multiple of what is asked)."""

from __future__ import annotations

import asyncio

from orbitmq.broker.controller import BrokerController
from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.limits import MAX_PULL_MESSAGES, MAX_PULL_MESSAGES_UNFILTERED
from orbitmq.protocol.messages import decode_records
from tests.broker.test_broker import pull_frame, send_frame

COUNT = 2 * MAX_PULL_MESSAGES + 100


async def _fill(broker: BrokerController, client: RemotingClient) -> None:
    for first in range(0, COUNT, 512):
        bodies = [str(i).encode() for i in range(first, min(COUNT, first + 512))]
        resp = await client.invoke(broker.address, send_frame("Big", bodies, TAGS="t"))
        assert resp.code == ResponseCode.SUCCESS, resp.remark
    await asyncio.to_thread(broker.store.wait_for_dispatch)


async def test_unfiltered_pull_returns_more_than_the_filtered_cap(
    broker: BrokerController, client: RemotingClient
) -> None:
    await _fill(broker, client)
    resp = await client.invoke(broker.address, pull_frame("Big", 0, 0, max_msg_nums=COUNT))
    assert resp.code == ResponseCode.SUCCESS
    assert [m.body for m in decode_records(resp.body)] == [str(i).encode() for i in range(COUNT)]
    assert resp.fields["next_begin_offset"] == COUNT
    # Still bounded by max_bytes (at least one record).
    resp = await client.invoke(
        broker.address, pull_frame("Big", 0, 0, max_msg_nums=COUNT, max_bytes=1000)
    )
    got = decode_records(resp.body)
    assert 1 <= len(got) < 20 and resp.fields["next_begin_offset"] == len(got)


async def test_filtered_pull_is_capped_not_refused(
    broker: BrokerController, client: RemotingClient
) -> None:
    await _fill(broker, client)
    for extra in ({"tags": ["t"]}, {"expression_type": "SQL92", "expression": "TRUE"}):
        resp = await client.invoke(
            broker.address, pull_frame("Big", 0, 0, max_msg_nums=COUNT, **extra)
        )
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        got = decode_records(resp.body)
        assert [m.body for m in got] == [str(i).encode() for i in range(len(got))]
        assert len(got) == MAX_PULL_MESSAGES == resp.fields["next_begin_offset"]


async def test_over_the_cap_is_a_field_error(
    broker: BrokerController, client: RemotingClient
) -> None:
    await _fill(broker, client)
    resp = await client.invoke(
        broker.address, pull_frame("Big", 0, 0, max_msg_nums=MAX_PULL_MESSAGES_UNFILTERED + 1)
    )
    assert resp.code != ResponseCode.SUCCESS
    assert "max_msg_nums" in (resp.remark or "")

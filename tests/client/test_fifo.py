"""Message groups on the producer side: a message's group picks its queue, in every send mode."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orbitmq.client import (
    Message,
    MessageQueue,
    fifo_message,
    hash_selector,
    message_group_selector,
    set_message_group,
)
from orbitmq.client.fifo import MAX_MESSAGE_GROUP_LENGTH, message_group_of, selector_for
from orbitmq.common.errors import ClientError, MessageIllegalError
from orbitmq.common.message import PROPERTY_SHARDING_KEY
from orbitmq.common.record import decode
from tests.client.conftest import FakeCluster, MakeProducer

QUEUES = [MessageQueue("T", b, i) for b in ("broker-a", "broker-b") for i in range(4)]


def test_fifo_message_and_group_property() -> None:
    msg = fifo_message("T", b"x", message_group="order-1", tags="t", keys=["k"])
    assert msg.properties == {PROPERTY_SHARDING_KEY: "order-1"}
    assert message_group_of(msg) == "order-1" and msg.tags == "t"
    assert selector_for(msg) is message_group_selector
    assert selector_for(Message("T", b"x")) is None
    plain = set_message_group(Message("T", b"y"), "g")
    assert plain.properties[PROPERTY_SHARDING_KEY] == "g"


@pytest.mark.parametrize("bad", ["", "x" * (MAX_MESSAGE_GROUP_LENGTH + 1), "a\nb", None, 3])
def test_bad_message_groups(bad: object) -> None:
    with pytest.raises(MessageIllegalError):
        fifo_message("T", b"x", message_group=bad)  # type: ignore[arg-type]


@given(st.text(min_size=1, max_size=MAX_MESSAGE_GROUP_LENGTH))
def test_group_selector_is_the_hash_selector_of_the_group(group: str) -> None:
    msg = Message("T", b"x", properties={PROPERTY_SHARDING_KEY: group})
    assert message_group_selector(QUEUES, msg, None) == hash_selector(QUEUES, msg, group)


def test_group_selector_is_pinned() -> None:
    msg = fifo_message("T", b"x", message_group="order-1")
    # CRC32C("order-1") % 8, the same in every process and run (see test_producer).
    assert message_group_selector(QUEUES, msg, None) == QUEUES[4]
    with pytest.raises(ClientError):
        message_group_selector(QUEUES, Message("T", b"x"), None)
    with pytest.raises(ClientError):
        message_group_selector([], msg, None)


async def test_groups_keep_their_queue_in_every_send_mode(
    cluster: FakeCluster, make_producer: MakeProducer
) -> None:
    p = await make_producer(linger_ms=5)
    groups = [f"order-{i}" for i in range(6)]
    where: dict[str, set[MessageQueue]] = {g: set() for g in groups}
    for i in range(24):
        g = groups[i % 6]
        r = await p.send(fifo_message("T", f"{g}:s{i}".encode(), message_group=g))
        where[g].add(r.message_queue)
    futs = [
        p.send_async(
            fifo_message("T", f"{groups[i % 6]}:a{i}".encode(), message_group=groups[i % 6])
        )
        for i in range(60)
    ]
    for i, r in enumerate(await asyncio.gather(*futs)):
        where[groups[i % 6]].add(r.message_queue)
    for i in range(6):
        g = groups[i]
        await p.send_oneway(fifo_message("T", f"{g}:o{i}".encode(), message_group=g))
        r = await p.send_batch(
            [fifo_message("T", f"{g}:b{i}.{j}".encode(), message_group=g) for j in range(3)]
        )
        where[g].add(r.message_queue)
    for g, queues in where.items():
        assert queues == {
            message_group_selector(QUEUES, fifo_message("T", b"-", message_group=g), None)
        }
    await asyncio.sleep(0.1)  # the oneway sends
    # Each group's messages are in its queue in the order they were sent.
    for g in groups:
        (mq,) = where[g]
        broker = cluster.a if mq.broker_name == "broker-a" else cluster.b
        got = [decode(r.raw).body.decode() for r in broker.queues[("T", mq.queue_id)]]
        mine = [b.split(":", 1)[1] for b in got if b.split(":", 1)[0] == g]
        i = groups.index(g)
        expected = [f"s{n}" for n in range(i, 24, 6)] + [f"a{n}" for n in range(i, 60, 6)]
        assert mine[: len(expected)] == expected
        assert sorted(mine[len(expected) :]) == sorted([f"o{i}"] + [f"b{i}.{j}" for j in range(3)])


async def test_explicit_queue_or_selector_wins(
    cluster: FakeCluster, make_producer: MakeProducer
) -> None:
    p = await make_producer()
    mq = MessageQueue("T", "broker-b", 3)
    r = await p.send(fifo_message("T", b"x", message_group="order-1"), queue=mq)
    assert r.message_queue == mq
    r = await p.send(
        fifo_message("T", b"x", message_group="order-1"), selector=hash_selector, arg="order-2"
    )
    assert r.message_queue == hash_selector(QUEUES, Message("T", b""), "order-2")


async def test_a_batch_holds_one_group(cluster: FakeCluster, make_producer: MakeProducer) -> None:
    p = await make_producer()
    with pytest.raises(ClientError, match="message groups"):
        await p.send_batch(
            [
                fifo_message("T", b"1", message_group="a"),
                fifo_message("T", b"2", message_group="b"),
            ]
        )
    with pytest.raises(ClientError, match="message groups"):
        await p.send_batch([fifo_message("T", b"1", message_group="a"), Message("T", b"2")])

"""RocketMQ's first-consume rule (docs/consumer-groups.md): a group with no offset reads a young
queue from 0 (QUERY_CONSUMER_OFFSET answers 0; Pop's first offset is 0); a queue whose start is
gone or not in memory starts at the end (Pop: at its last message); a switch turns it off."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from orbitmq.broker.config import BrokerConfig
from orbitmq.broker.controller import BrokerController
from orbitmq.broker.first_consume import FirstConsume
from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame
from tests.broker.conftest import broker_config
from tests.broker.test_pop import make_topic, pop, send

ALL_HOURS = ";".join(str(h) for h in range(24))
SEG = 128 * 1024


async def started(path: Path, **overrides: Any) -> BrokerController:
    b = BrokerController(broker_config(path, **overrides))
    await b.start()
    return b


@pytest.fixture
async def small_segments(tmp_path: Path) -> AsyncIterator[BrokerController]:
    """A broker whose CommitLog rolls every 128 KiB and deletes expired segments at any hour."""
    b = await started(
        tmp_path / "store",
        store={"mapped_file_size_commit_log": SEG, "max_message_size": 32 * 1024,
               "delete_when": ALL_HOURS},
    )  # fmt: skip
    try:
        yield b
    finally:
        await b.stop()


async def query(
    client: RemotingClient, broker: BrokerController, group: str, topic: str, **extra: Any
) -> Frame:
    fields = {"group": group, "topic": topic, "queue_id": 0, **extra}
    return await client.invoke(
        broker.address, Frame(RequestCode.QUERY_CONSUMER_OFFSET, fields=fields)
    )


async def test_new_group_on_a_young_queue_starts_at_zero(
    broker: BrokerController, client: RemotingClient
) -> None:
    make_topic(broker, "Young")
    resp = await query(client, broker, "G-new", "Young")
    assert resp.code == ResponseCode.QUERY_NOT_FOUND  # an empty queue: nothing to start from
    await send(client, broker, "Young", [f"m{i}".encode() for i in range(10)])
    resp = await query(client, broker, "G-new", "Young")
    assert resp.code == ResponseCode.SUCCESS and resp.fields["offset"] == 0, resp.remark
    # The stored offset only (tools, the proxy's GetOffset): none for another new group...
    resp = await query(client, broker, "G-other", "Young", set_zero_if_not_found=False)
    assert resp.code == ResponseCode.QUERY_NOT_FOUND
    # ... while the 0 answered is recorded as the group's offset (its client takes it as
    # stored and commits only what it consumes).
    resp = await query(client, broker, "G-new", "Young", set_zero_if_not_found=False)
    assert resp.code == ResponseCode.SUCCESS and resp.fields["offset"] == 0
    assert broker.offsets.query("G-new", "Young", 0) == 0
    # A committed offset wins.
    commit = Frame(RequestCode.UPDATE_CONSUMER_OFFSET,
                   fields={"group": "G-new", "topic": "Young", "queue_id": 0, "offset": 7})  # fmt: skip
    assert (await client.invoke(broker.address, commit)).code == ResponseCode.SUCCESS
    resp = await query(client, broker, "G-new", "Young")
    assert resp.code == ResponseCode.SUCCESS and resp.fields["offset"] == 7


async def test_new_pop_group_gets_what_was_sent_before(
    broker: BrokerController, client: RemotingClient
) -> None:
    make_topic(broker, "PopYoung")
    sent = [f"m{i}".encode() for i in range(10)]
    await send(client, broker, "PopYoung", sent)
    _, msgs, _ = await pop(
        client, broker, "PopYoung", group="G-pop", consume_from_where="LAST_OFFSET"
    )
    assert [m.body for m in msgs] == sent


@pytest.mark.parametrize(
    "overrides",
    [{"first_consume_from_start_in_memory": False}, {"access_message_in_memory_max_ratio": 0}],
    ids=["switch-off", "not-in-memory"],
)
async def test_switch_off_or_not_in_memory_starts_at_the_end(
    tmp_path: Path, client: RemotingClient, overrides: dict[str, Any]
) -> None:
    broker = await started(tmp_path / "store", **overrides)
    try:
        make_topic(broker, "T")
        await send(client, broker, "T", [b"a", b"b", b"c"])
        resp = await query(client, broker, "G", "T")
        assert resp.code == ResponseCode.QUERY_NOT_FOUND  # the client then starts at max
        _, msgs, _ = await pop(client, broker, "T", group="GP", consume_from_where="LAST_OFFSET")
        assert [m.body for m in msgs] == [b"c"]  # RocketMQ's max - 1
    finally:
        await broker.stop()


def age_and_delete(broker: BrokerController) -> None:
    """Make every CommitLog segment 100 h old and run retention (the active one stays)."""
    past = time.time() - 100 * 3600
    for seg in broker.store.commit_log.segments.segments:
        os.utime(seg.path, (past, past))
    broker.store.retention.run()


async def test_start_deleted_by_retention_starts_at_the_end(
    small_segments: BrokerController, client: RemotingClient
) -> None:
    broker = small_segments
    make_topic(broker, "Old")
    body = b"x" * 8 * 1024
    for _ in range(6):
        await send(client, broker, "Old", [body] * 8)
    assert len(broker.store.commit_log.segments.segments) >= 3
    age_and_delete(broker)
    low, high = broker.store.min_offset("Old", 0), broker.store.max_offset("Old", 0)
    assert 0 < low < high
    resp = await query(client, broker, "G", "Old")
    assert resp.code == ResponseCode.QUERY_NOT_FOUND
    _, msgs, _ = await pop(client, broker, "Old", group="GP", consume_from_where="LAST_OFFSET")
    assert len(msgs) == 1 and msgs[0].queue_offset == high - 1


def test_in_memory_is_the_newest_bytes_of_the_commit_log(tmp_path: Path) -> None:
    """The queue's first record counts as in memory while the CommitLog's head is at most the
    in-memory budget past it (RocketMQ's checkInMemByConsumeOffset)."""
    from orbitmq.common.message import MessageBatch
    from orbitmq.store.message_store import MessageStore

    config: BrokerConfig = broker_config(tmp_path / "s")
    with MessageStore(config.store) as store:
        store.put(MessageBatch.of("A", 0, [b"first"]))
        store.put(MessageBatch.of("B", 0, [b"y" * 4000] * 10))
        assert store.wait_for_dispatch()
        head = store.commit_log.max_offset
        assert FirstConsume(config, store, memory=100 * head).starts_at_zero("A", 0)
        # 40 % of "memory" is less than what was written after A's first message.
        assert not FirstConsume(config, store, memory=head).first_in_memory("A", 0)
        assert not FirstConsume(config, store, memory=100 * head).starts_at_zero("Nope", 0)

"""FIFO Pop on an in-process broker: one message per message group in flight, retried in place,
dead-lettered after the retry limit, and all of it rebuilt after a restart."""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

import pytest

from orbitmq.broker.controller import BrokerController
from orbitmq.broker.pop.fifo import FifoWindow, message_group, with_attempt
from orbitmq.common.clock import now_ms
from orbitmq.common.codes import ResponseCode
from orbitmq.common.message import PROPERTY_SHARDING_KEY
from orbitmq.common.record import StoredMessage, decode
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.bodies import TopicConfig
from orbitmq.protocol.consumer import dlq_topic, pop_retry_topic
from orbitmq.protocol.messages import decode_records
from orbitmq.store.message_store import GetResult, GetStatus
from tests.broker.conftest import broker_config
from tests.broker.test_pop import GROUP, ack, change, pop, send

TOPIC = "F"


def make_fifo_topic(broker: BrokerController, topic: str = TOPIC, queues: int = 1) -> None:
    broker.topics.upsert(
        TopicConfig(
            topic_name=topic, read_queue_nums=queues, write_queue_nums=queues, message_type="FIFO"
        )
    )


async def send_groups(
    client: RemotingClient,
    broker: BrokerController,
    items: list[tuple[str, str]],
    queue_id: int = 0,
    topic: str = TOPIC,
    tags: str | None = None,
) -> None:
    """Send (message group, body) pairs, in order, to one queue."""
    props = []
    for group, _ in items:
        p = {PROPERTY_SHARDING_KEY: group} if group else {}
        if tags:
            p["TAGS"] = tags
        props.append(p)
    await send(client, broker, topic, [b.encode() for _, b in items], queue_id, props)


def bodies(msgs: list[StoredMessage]) -> list[str]:
    return [m.body.decode() for m in msgs]


async def expire(broker: BrokerController, ahead_ms: int = 60_000) -> int:
    """Run a FIFO expiry pass as if ``ahead_ms`` had passed."""
    return await broker.pop.expire_fifo(now_ms() + ahead_ms)


def read_all(broker: BrokerController, topic: str) -> list[StoredMessage]:
    broker.store.wait_for_dispatch()
    res = broker.store.get_messages(topic, 0, 0, 1000)
    return [decode(v) for v in res.messages] if res.status is GetStatus.FOUND else []


# ---------------------------------------------------------------------- units


def test_window_moves_over_the_finished_prefix_only() -> None:
    win = FifoWindow(base=10)
    win.deliver(10, 1, 0, 1)
    win.deliver(11, 1, 1, 1)
    win.deliver(12, 2, 0, 3)
    assert win.ack(11, 1, 1) and win.advance() == 10  # 10 still in flight
    assert not win.ack(10, 9, 0)  # not the entry holding it
    assert win.release(10, 1, 0) and 10 not in win.inflight
    win.deliver(10, 3, 0, 2)  # redelivered by a newer CK
    assert not win.ack(10, 1, 0)  # the old CK's ack does not count
    assert win.ack(10, 3, 0) and win.advance() == 12
    assert win.attempts == {12: 3}
    win.skip(13)
    assert win.ack(12, 2, 0) and win.advance() == 14 and not win.done
    win.rebase(5)  # an admin moved it back: consume again
    assert win.base == 5 and not win.done


@pytest.mark.parametrize("attempt", [2, 17])
async def test_redelivery_copy_carries_the_attempt(
    broker: BrokerController, client: RemotingClient, attempt: int
) -> None:
    make_fifo_topic(broker)
    await send_groups(client, broker, [("g1", "x")])
    view = broker.store.get_messages(TOPIC, 0, 0, 1).messages[0]
    assert message_group(view) == b"g1"
    copy = with_attempt(view, attempt)
    (msg,) = decode_records(copy)  # the CRC is right
    assert msg.reconsume_times == attempt - 1 and msg.body == b"x"
    await send(client, broker, TOPIC, [b"y"])
    assert message_group(broker.store.get_messages(TOPIC, 0, 1, 1).messages[0]) == b""


# ---------------------------------------------------------------------- pops


async def test_one_message_per_group_in_flight(
    broker: BrokerController, client: RemotingClient
) -> None:
    make_fifo_topic(broker)
    await send_groups(
        client, broker,
        [("A", "a1"), ("B", "b1"), ("A", "a2"), ("C", "c1"), ("B", "b2"), ("A", "a3")],
    )  # fmt: skip
    resp, msgs, handles = await pop(client, broker, TOPIC)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert bodies(msgs) == ["a1", "b1", "c1"]
    h = dict(zip(bodies(msgs), handles, strict=True))
    resp, _, _ = await pop(client, broker, TOPIC)
    assert resp.code == ResponseCode.PULL_NOT_FOUND  # every group has one in flight
    # Acking b1 frees B only; the offset stays at a1 (still in flight).
    assert (await ack(client, broker, TOPIC, h["b1"])).code == ResponseCode.SUCCESS
    assert broker.offsets.query(GROUP, TOPIC, 0) == 0
    _, msgs, handles = await pop(client, broker, TOPIC)
    assert bodies(msgs) == ["b2"]
    h.update(zip(bodies(msgs), handles, strict=True))
    assert (await ack(client, broker, TOPIC, h["a1"])).code == ResponseCode.SUCCESS
    assert broker.offsets.query(GROUP, TOPIC, 0) == 2  # a1, b1 done; a2 is next
    _, msgs, handles = await pop(client, broker, TOPIC)
    assert bodies(msgs) == ["a2"]
    h.update(zip(bodies(msgs), handles, strict=True))
    for name in ("a2", "c1", "b2"):
        assert (await ack(client, broker, TOPIC, h[name])).code == ResponseCode.SUCCESS
    _, msgs, handles = await pop(client, broker, TOPIC)
    assert bodies(msgs) == ["a3"]
    assert (await ack(client, broker, TOPIC, handles[0])).code == ResponseCode.SUCCESS
    assert broker.offsets.query(GROUP, TOPIC, 0) == 6
    assert not broker.pop.state.cks and broker.pop.inflight(GROUP, TOPIC, 0) == 0
    # Another consumer group has its own window.
    _, msgs, _ = await pop(client, broker, TOPIC, group="G2")
    assert bodies(msgs) == ["a1", "b1", "c1"]


async def test_messages_without_a_group_keep_queue_order(
    broker: BrokerController, client: RemotingClient
) -> None:
    make_fifo_topic(broker)
    await send_groups(client, broker, [("", "n1"), ("A", "a1"), ("", "n2")])
    _, msgs, handles = await pop(client, broker, TOPIC)
    assert bodies(msgs) == ["n1", "a1"]
    assert (await ack(client, broker, TOPIC, handles[0])).code == ResponseCode.SUCCESS
    _, msgs, _ = await pop(client, broker, TOPIC)
    assert bodies(msgs) == ["n2"]


async def test_max_msg_nums_and_several_queues(
    broker: BrokerController, client: RemotingClient
) -> None:
    make_fifo_topic(broker, queues=2)
    await send_groups(client, broker, [("A", "a1"), ("B", "b1"), ("A", "a2")], queue_id=0)
    await send_groups(client, broker, [("C", "c1"), ("C", "c2")], queue_id=1)
    _, first, _ = await pop(client, broker, TOPIC, max_msg_nums=1)
    _, rest, _ = await pop(client, broker, TOPIC)
    got = sorted(bodies(first) + bodies(rest))
    assert got == ["a1", "b1", "c1"]


async def test_unacked_message_is_retried_in_place(
    broker: BrokerController, client: RemotingClient
) -> None:
    make_fifo_topic(broker)
    await send_groups(client, broker, [("A", "a1"), ("A", "a2"), ("B", "b1")])
    _, msgs, handles = await pop(client, broker, TOPIC, invisible_time_ms=100)
    assert bodies(msgs) == ["a1", "b1"]
    assert (await ack(client, broker, TOPIC, handles[1])).code == ResponseCode.SUCCESS
    assert await expire(broker) == 1
    # a1 is visible again, in place: never copied to the retry topic, a2 still waits.
    assert broker.topics.get(pop_retry_topic(GROUP, TOPIC)) is None
    resp = await ack(client, broker, TOPIC, handles[0])
    assert resp.code == ResponseCode.RECEIPT_HANDLE_EXPIRED
    _, msgs, handles = await pop(client, broker, TOPIC)
    assert [(m.body, m.reconsume_times) for m in msgs] == [(b"a1", 1)]  # delivery attempt 2
    assert (await ack(client, broker, TOPIC, handles[0])).code == ResponseCode.SUCCESS
    _, msgs, _ = await pop(client, broker, TOPIC)
    assert [(m.body, m.reconsume_times) for m in msgs] == [(b"a2", 0)]


async def test_change_invisible_time_keeps_the_group_blocked(
    broker: BrokerController, client: RemotingClient
) -> None:
    make_fifo_topic(broker)
    await send_groups(client, broker, [("A", "a1"), ("A", "a2")])
    _, msgs, handles = await pop(client, broker, TOPIC, invisible_time_ms=100)
    resp = await change(client, broker, TOPIC, handles[0], 60_000)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    new = resp.fields["handle"]
    await asyncio.sleep(0.15)
    await broker.pop.expire_fifo()
    resp, _, _ = await pop(client, broker, TOPIC)
    assert resp.code == ResponseCode.PULL_NOT_FOUND  # a1 is still in flight under its new handle
    assert (await ack(client, broker, TOPIC, handles[0])).code != ResponseCode.SUCCESS
    assert (await ack(client, broker, TOPIC, new)).code == ResponseCode.SUCCESS
    _, msgs, _ = await pop(client, broker, TOPIC)
    assert bodies(msgs) == ["a2"]


async def test_dead_letter_after_the_last_attempt(
    broker: BrokerController, client: RemotingClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(broker.pop, "retry_max_times", lambda group: 1)
    make_fifo_topic(broker)
    await send_groups(client, broker, [("A", "a1"), ("A", "a2"), ("B", "b1")])
    _, msgs, handles = await pop(client, broker, TOPIC, invisible_time_ms=100)
    assert bodies(msgs) == ["a1", "b1"]
    await ack(client, broker, TOPIC, handles[1])
    await expire(broker)  # attempt 1 un-acked: retried
    _, msgs, _ = await pop(client, broker, TOPIC, invisible_time_ms=100)
    assert [(m.body, m.reconsume_times) for m in msgs] == [(b"a1", 1)]
    await expire(broker)  # attempt 2 = 1 + retry_max_times un-acked: dead-lettered
    assert broker.pop.fifo_dead_lettered == 1
    (dead,) = read_all(broker, dlq_topic(GROUP))
    assert dead.body == b"a1" and dead.properties[PROPERTY_SHARDING_KEY] == "A"
    assert dead.reconsume_times == 1
    # The group moves on; the offset passes a1 and b1.
    _, msgs, handles = await pop(client, broker, TOPIC)
    assert bodies(msgs) == ["a2"]
    assert broker.offsets.query(GROUP, TOPIC, 0) == 1
    await ack(client, broker, TOPIC, handles[0])
    assert broker.offsets.query(GROUP, TOPIC, 0) == 3


async def test_window_bounds_the_look_ahead(tmp_path: Path, client: RemotingClient) -> None:
    b = BrokerController(broker_config(tmp_path / "s", pop_fifo_window=3))
    await b.start()
    try:
        make_fifo_topic(b)
        await send_groups(client, b, [("A", "a1"), ("A", "a2"), ("B", "b1"), ("C", "c1")])
        _, msgs, handles = await pop(client, b, TOPIC)
        assert bodies(msgs) == ["a1", "b1"]  # c1 is 3 past the oldest unfinished message
        await ack(client, b, TOPIC, handles[1])
        resp, _, _ = await pop(client, b, TOPIC)
        assert resp.code == ResponseCode.PULL_NOT_FOUND
        await ack(client, b, TOPIC, handles[0])
        _, msgs, _ = await pop(client, b, TOPIC)
        assert bodies(msgs) == ["a2", "c1"]
    finally:
        await b.stop()


async def test_filters_consume_what_they_reject(
    broker: BrokerController, client: RemotingClient
) -> None:
    make_fifo_topic(broker)
    await send_groups(client, broker, [("A", "a1")], tags="x")
    await send_groups(client, broker, [("A", "a2"), ("B", "b1")], tags="y")
    await send_groups(client, broker, [("A", "a3")], tags="x")
    _, msgs, handles = await pop(client, broker, TOPIC, expression="x")
    assert bodies(msgs) == ["a1"]
    await ack(client, broker, TOPIC, handles[0])
    _, msgs, handles = await pop(client, broker, TOPIC, expression="x")
    assert bodies(msgs) == ["a3"]
    await ack(client, broker, TOPIC, handles[0])
    assert broker.offsets.query(GROUP, TOPIC, 0) == 4
    _, msgs, handles = await pop(
        client, broker, TOPIC, group="G3", expression_type="SQL92", expression="TAGS = 'y'"
    )
    assert bodies(msgs) == ["a2", "b1"]


async def test_long_poll_wakes_when_the_group_is_freed(
    broker: BrokerController, client: RemotingClient
) -> None:
    make_fifo_topic(broker)
    await send_groups(client, broker, [("A", "a1"), ("A", "a2")])
    _, _, handles = await pop(client, broker, TOPIC)
    waiting = asyncio.create_task(pop(client, broker, TOPIC, poll_time_ms=3000))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await ack(client, broker, TOPIC, handles[0])
    async with asyncio.timeout(1.5):
        _, msgs, _ = await waiting
    assert bodies(msgs) == ["a2"]


async def test_normal_topic_is_not_fifo(broker: BrokerController, client: RemotingClient) -> None:
    broker.topics.upsert(TopicConfig(topic_name="N", read_queue_nums=1, write_queue_nums=1))
    await send_groups(client, broker, [("A", "a1"), ("A", "a2")], topic="N")
    _, msgs, _ = await pop(client, broker, "N")
    assert bodies(msgs) == ["a1", "a2"]


# ---------------------------------------------------------------------- restart


async def test_restart_keeps_the_windows(tmp_path: Path, client: RemotingClient) -> None:
    config = broker_config(tmp_path / "s", pop_revive_interval_ms=50)
    b = BrokerController(config)
    await b.start()
    try:
        make_fifo_topic(b)
        await send_groups(
            client, b, [("A", "a1"), ("B", "b1"), ("A", "a2"), ("C", "c1"), ("C", "c2")]
        )
        _, msgs, handles = await pop(client, b, TOPIC, invisible_time_ms=60_000)
        assert bodies(msgs) == ["a1", "b1", "c1"]
        h = dict(zip(bodies(msgs), handles, strict=True))
        await ack(client, b, TOPIC, h["b1"])
        await ack(client, b, TOPIC, h["c1"])
        # c2 is handed out and expires un-acked: attempt 2 next time.
        _, msgs, handles = await pop(client, b, TOPIC, invisible_time_ms=100)
        assert bodies(msgs) == ["c2"]
        await expire(b)
    finally:
        await b.stop()

    b = BrokerController(config)
    await b.start()
    try:
        # The offset is a1's (still in flight), not past every replayed CK.
        assert b.offsets.query(GROUP, TOPIC, 0) == 0
        # (c2's CK is replayed with its real deadline, made visible again once it passed.)
        _, msgs, _ = await pop(client, b, TOPIC, poll_time_ms=2000)
        assert [(m.body, m.reconsume_times) for m in msgs] == [(b"c2", 1)]  # b1, c1 stay acked
        assert (await ack(client, b, TOPIC, h["a1"])).code == ResponseCode.SUCCESS
        _, msgs, _ = await pop(client, b, TOPIC)
        assert bodies(msgs) == ["a2"]
    finally:
        await b.stop()


async def test_restart_without_persisted_offsets(tmp_path: Path, client: RemotingClient) -> None:
    """Killed before the offsets were written: the window starts at its oldest CK."""
    config = broker_config(tmp_path / "s")
    b = BrokerController(config)
    await b.start()
    make_fifo_topic(b)
    await send_groups(client, b, [("A", "a1"), ("A", "a2"), ("B", "b1")])
    _, msgs, handles = await pop(client, b, TOPIC, invisible_time_ms=60_000)
    await ack(client, b, TOPIC, handles[1])  # b1
    # Simulate a crash: drop the offset, lose the revive checkpoint and the offsets file.
    b.offsets.delete_group(GROUP)
    b.pop.reviver.write_checkpoint = _nothing  # type: ignore[method-assign]
    await b.stop()
    for name in ("pop_revive.json", "consumerOffset.json"):
        (tmp_path / "s" / "config" / name).unlink(missing_ok=True)
    b = BrokerController(config)
    await b.start()
    try:
        assert b.offsets.query(GROUP, TOPIC, 0) == 0
        resp, _, _ = await pop(client, b, TOPIC)
        assert resp.code == ResponseCode.PULL_NOT_FOUND  # a1 in flight, b1 acked
        await ack(client, b, TOPIC, handles[0])
        _, msgs, _ = await pop(client, b, TOPIC)
        assert bodies(msgs) == ["a2"]
    finally:
        await b.stop()


async def _nothing(*_args: object, **_kwargs: object) -> None:
    return None


# ---------------------------------------------------------------------- randomized


async def test_random_acks_and_expiries_keep_group_order(
    broker: BrokerController, client: RemotingClient
) -> None:
    seed = int(os.environ.get("ORBITMQ_SEED", random.randrange(1 << 30)))
    print(f"seed {seed}")
    rnd = random.Random(seed)
    make_fifo_topic(broker, queues=2)
    groups = [f"g{i}" for i in range(6)]
    sent: dict[str, list[str]] = {g: [] for g in groups}
    for q in range(2):
        items = []
        for _ in range(40):
            g = rnd.choice(groups[q * 3 : q * 3 + 3])
            body = f"{g}-{len(sent[g])}"
            sent[g].append(body)
            items.append((g, body))
        await send_groups(client, broker, items, queue_id=q)
    done: dict[str, list[str]] = {g: [] for g in groups}
    out: dict[str, tuple[str, str]] = {}  # group -> (body, handle) in flight
    for _ in range(400):
        if sum(map(len, done.values())) == 80:
            break
        _, msgs, handles = await pop(
            client, broker, TOPIC, max_msg_nums=rnd.randint(1, 4), invisible_time_ms=60_000
        )
        for m, h in zip(msgs, handles, strict=True):
            g = m.properties[PROPERTY_SHARDING_KEY]
            assert g not in out, f"{g}: {m.body!r} handed out while {out.get(g)} in flight"
            body = m.body.decode()
            assert body == sent[g][len(done[g])], f"{g}: got {body}, expected the next one"
            out[g] = (body, h)
        for g in list(out):
            if rnd.random() < 0.5:
                body, h = out.pop(g)
                assert (await ack(client, broker, TOPIC, h)).code == ResponseCode.SUCCESS
                done[g].append(body)
        if rnd.random() < 0.2:
            await expire(broker)
            out.clear()  # everything in flight became visible again
    assert done == sent, f"seed {seed}"
    assert broker.offsets.query(GROUP, TOPIC, 0) == 40
    assert broker.offsets.query(GROUP, TOPIC, 1) == 40


async def test_dead_lettering_that_fails_keeps_the_message(
    broker: BrokerController, client: RemotingClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(broker.pop, "retry_max_times", lambda group: 0)
    make_fifo_topic(broker)
    await send_groups(client, broker, [("A", "a1"), ("A", "a2")])
    await pop(client, broker, TOPIC, invisible_time_ms=100)
    broker.topics.upsert(
        TopicConfig(topic_name=dlq_topic(GROUP), read_queue_nums=1, write_queue_nums=1, perm=4)
    )  # read-only: the copy cannot be stored
    assert await expire(broker) == 0
    resp, _, _ = await pop(client, broker, TOPIC)
    assert resp.code == ResponseCode.PULL_NOT_FOUND  # a1 held, a2 waits
    broker.topics.upsert(
        TopicConfig(topic_name=dlq_topic(GROUP), read_queue_nums=1, write_queue_nums=1, perm=6)
    )
    assert await broker.pop.expire_fifo(now_ms() + 120_000) == 1
    _, msgs, _ = await pop(client, broker, TOPIC)
    assert bodies(msgs) == ["a2"]


async def test_ack_during_a_scan_does_not_hand_the_message_out_again(
    broker: BrokerController, client: RemotingClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pop reads the window, an ack moves the base past a message meanwhile: the pop must
    not take the acked message for a visible one."""
    make_fifo_topic(broker)
    await send_groups(client, broker, [("A", "a1"), ("B", "b1")])
    _, msgs, handles = await pop(client, broker, TOPIC, max_msg_nums=1)
    assert bodies(msgs) == ["a1"]
    bridge = broker.bridge
    real_read = bridge.read
    gate = asyncio.Event()

    async def slow_read(fn, *args):  # type: ignore[no-untyped-def]
        result = await real_read(fn, *args)
        await gate.wait()
        return result

    monkeypatch.setattr(bridge, "read", slow_read)
    scanning = asyncio.create_task(pop(client, broker, TOPIC))
    await asyncio.sleep(0.1)
    monkeypatch.setattr(bridge, "read", real_read)
    assert (await ack(client, broker, TOPIC, handles[0])).code == ResponseCode.SUCCESS
    assert broker.offsets.query(GROUP, TOPIC, 0) == 1
    gate.set()
    _, msgs, _ = await scanning
    assert bodies(msgs) == ["b1"]


# ---------------------------------------------------------------------- scan cost


async def test_fifo_pops_do_not_rescan_what_is_in_flight(
    broker: BrokerController, client: RemotingClient
) -> None:
    """600 messages of 600 message groups popped 32 at a time, none acked: each pop reads on
    from where the last one stopped instead of rescanning every in-flight message above the
    window's base (quadratic: about 5,900 records read for these 19 pops). An ack makes its
    group's next message eligible again, wherever the scan had got to."""
    make_fifo_topic(broker)
    n = 600
    await send_groups(client, broker, [(f"g{i}", f"m{i}") for i in range(n)])
    read = 0
    real = broker.store.get_messages

    def counting(topic: str, *args: object, **kw: object) -> GetResult:
        nonlocal read
        res = real(topic, *args, **kw)  # type: ignore[arg-type]  # passed through as given
        if topic == TOPIC and res.status is GetStatus.FOUND:
            read += len(res.messages)
        return res

    # A counting wrapper on this store instance only (the processor looks the method up per call).
    broker.store.get_messages = counting  # type: ignore[method-assign]
    got: list[StoredMessage] = []
    handles: list[str] = []
    started = time.perf_counter()
    for _ in range(n // 32 + 2):
        _, msgs, hs = await pop(client, broker, TOPIC, max_msg_nums=32)
        got += msgs
        handles += hs
    elapsed = time.perf_counter() - started
    print(f"\nFIFO pop of {n} in-flight groups, 32 a pop: {read} records read, {elapsed:.3f} s")
    assert sorted(bodies(got)) == sorted(f"m{i}" for i in range(n))
    assert read <= 2 * n
    # An ack in the middle lets that group go on: its next message is found.
    await send_groups(client, broker, [("g7", "m7-next")])
    _, msgs, _ = await pop(client, broker, TOPIC)
    assert msgs == []  # g7 is still in flight
    assert (await ack(client, broker, TOPIC, handles[7])).code == ResponseCode.SUCCESS
    _, msgs, _ = await pop(client, broker, TOPIC)
    assert bodies(msgs) == ["m7-next"]


def test_window_scan_position_moves_back_when_a_message_ends() -> None:
    win = FifoWindow(base=0)
    win.rebase(0)
    assert win.scan_start() == 0
    win.deliver(3, 1, 0, 1)
    win.note_group(3, b"a")
    win.deliver(5, 1, 1, 1)
    win.note_group(5, b"b")
    win.scanned_to(10)
    assert win.next_scan() == 10 and set(win.busy) == {b"a", b"b"}
    # An ack during a walk: the walk's end does not move the start past it.
    assert win.scan_start() == 10
    assert win.ack(5, 1, 1)
    win.scanned_to(12)
    assert win.next_scan() == 5 and set(win.busy) == {b"a"}
    assert win.release(3, 1, 0) and win.next_scan() == 3 and not win.busy
    assert win.scan_start() == 3
    win.scanned_to(12)
    # In flight with no known group (replayed at restart): the walk starts at the lowest.
    win.deliver(7, 2, 0, 1)
    assert win.next_scan() == 7
    win.note_group(7, b"c")
    assert win.next_scan() == 12
    win.rebase(2)  # moved back (a reset): everything from the new base again
    assert win.next_scan() == 2

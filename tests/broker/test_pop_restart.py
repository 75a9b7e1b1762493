"""Pop state survives restarts and crashes: it lives in the revive log, not in memory."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from orbitmq.broker.controller import BrokerController
from orbitmq.broker.pop.records import REVIVE_TOPIC
from orbitmq.common.codes import ResponseCode
from orbitmq.common.message import MessageBatch
from orbitmq.common.record import StoredMessage
from orbitmq.net.client import RemotingClient
from tests.broker.conftest import broker_config
from tests.broker.test_pop import (
    GROUP,
    NEEDS_POP_RETRY_TOPIC,
    ack,
    make_topic,
    no_pop_backoff,
    pop,
    send,
)


async def _drain(
    client: RemotingClient, b: BrokerController, topic: str, want: int, wait_s: float = 4.0
) -> list[StoredMessage]:
    """Pop (and ack) until ``want`` messages came or ``wait_s`` passed; then one more short
    pop must find nothing."""
    got: list[StoredMessage] = []
    async with asyncio.timeout(wait_s + 2):
        while len(got) < want:
            resp, msgs, handles = await pop(client, b, topic, poll_time_ms=1000)
            assert resp.code in (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND), resp.remark
            got += msgs
            for h in handles:
                assert (await ack(client, b, topic, h)).code == ResponseCode.SUCCESS
    resp, _, _ = await pop(client, b, topic, poll_time_ms=300)
    assert resp.code == ResponseCode.PULL_NOT_FOUND
    return got


@NEEDS_POP_RETRY_TOPIC
async def test_restart_keeps_pop_state(tmp_path: Path, client: RemotingClient) -> None:
    config = broker_config(tmp_path / "s", pop_revive_interval_ms=50)
    b = BrokerController(config)
    await b.start()
    try:
        no_pop_backoff(b)  # persisted: it holds after the restart too
        make_topic(b, "T", 2)
        await send(client, b, "T", [b"a0", b"a1", b"a2"], queue_id=0)
        await send(client, b, "T", [b"b0", b"b1", b"b2"], queue_id=1)
        _, first, h1 = await pop(client, b, "T", queue_id=0, invisible_time_ms=1500)
        assert [m.body for m in first] == [b"a0", b"a1", b"a2"]
        for h in h1[:2]:
            assert (await ack(client, b, "T", h)).code == ResponseCode.SUCCESS
        _, second, h2 = await pop(client, b, "T", queue_id=1, invisible_time_ms=30_000)
        assert [m.body for m in second] == [b"b0", b"b1", b"b2"]
    finally:
        await b.stop()
    saved = json.loads((tmp_path / "s" / "config" / "pop_revive.json").read_text())
    assert saved["revive_offset"] == 0  # the first CK is still open

    b = BrokerController(config)
    await b.start()
    try:
        assert b.pop.inflight(GROUP, "T", 0) == 1 and b.pop.inflight(GROUP, "T", 1) == 3
        # Handles from before the restart: still valid, or still expired.
        assert (await ack(client, b, "T", h2[0])).code == ResponseCode.SUCCESS
        assert (await ack(client, b, "T", h1[0])).code == ResponseCode.RECEIPT_HANDLE_EXPIRED
        # Offsets were kept: nothing is handed out again as new; a2 comes back once revived.
        resp, again, h3 = await pop(client, b, "T", poll_time_ms=4000)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert [(m.body, m.reconsume_times) for m in again] == [(b"a2", 1)]
        assert (await ack(client, b, "T", h3[0])).code == ResponseCode.SUCCESS
        resp, _, _ = await pop(client, b, "T")
        assert resp.code == ResponseCode.PULL_NOT_FOUND  # b1, b2 are still invisible
        for h in h2[1:]:
            assert (await ack(client, b, "T", h)).code == ResponseCode.SUCCESS
        assert not b.pop.state.cks
    finally:
        await b.stop()
    # Nothing is open: the next start replays nothing before the end of the log.
    saved = json.loads((tmp_path / "s" / "config" / "pop_revive.json").read_text())
    b = BrokerController(config)
    await b.start()
    try:
        assert saved["revive_offset"] == b.store.max_offset(REVIVE_TOPIC, 0)
        assert not b.pop.state.cks
        resp, _, _ = await pop(client, b, "T", poll_time_ms=200)
        assert resp.code == ResponseCode.PULL_NOT_FOUND
    finally:
        await b.stop()


@NEEDS_POP_RETRY_TOPIC
async def test_deadline_passed_while_stopped(tmp_path: Path, client: RemotingClient) -> None:
    config = broker_config(tmp_path / "s", pop_revive_interval_ms=50)
    b = BrokerController(config)
    await b.start()
    try:
        no_pop_backoff(b)  # persisted: it holds after the restart too
        make_topic(b, "Z")
        await send(client, b, "Z", [b"z"])
        _, msgs, _ = await pop(client, b, "Z", invisible_time_ms=200)
        assert len(msgs) == 1
    finally:
        await b.stop()
    await asyncio.sleep(0.3)
    b = BrokerController(config)
    await b.start()
    try:
        got = await _drain(client, b, "Z", 1)
        assert [(m.body, m.reconsume_times) for m in got] == [(b"z", 1)]
    finally:
        await b.stop()


@NEEDS_POP_RETRY_TOPIC
async def test_crash_before_offsets_are_written(tmp_path: Path, client: RemotingClient) -> None:
    """A kill after the pop answered: the CKs are in the log (page cache), the consumer offsets
    and the revive checkpoint on disk are older. Nothing is lost, nothing handed out twice as
    new; the un-acked message comes back once, as a retry."""
    config = broker_config(tmp_path / "s", pop_revive_interval_ms=50)
    cfg_dir = tmp_path / "s" / "config"
    b = BrokerController(config)
    await b.start()
    try:
        no_pop_backoff(b)  # persisted: it holds after the restart too
        make_topic(b, "K")
        await send(client, b, "K", [b"k0", b"k1", b"k2", b"k3"])
        await b.offsets.persist()
        await b.pop.reviver.write_checkpoint(force=True)
        before = {p.name: p.read_bytes() for p in cfg_dir.iterdir() if p.suffix == ".json"}
        _, msgs, handles = await pop(client, b, "K", max_msg_nums=2, invisible_time_ms=400)
        assert [m.body for m in msgs] == [b"k0", b"k1"]
        assert (await ack(client, b, "K", handles[0])).code == ResponseCode.SUCCESS
        b.store.crash_for_test()
    finally:
        await b.stop()
    for name in ("consumerOffset.json", "pop_revive.json"):
        path = cfg_dir / name
        if name in before:
            path.write_bytes(before[name])
        else:
            path.unlink(missing_ok=True)

    b = BrokerController(config)
    await b.start()
    try:
        assert b.offsets.query(GROUP, "K", 0) == 2  # moved past the CK's run by the replay
        got = await _drain(client, b, "K", 3)
        assert sorted((m.body, m.reconsume_times) for m in got) == [
            (b"k1", 1),
            (b"k2", 0),
            (b"k3", 0),
        ]
    finally:
        await b.stop()


async def test_foreign_and_damaged_entries_are_ignored(
    tmp_path: Path, client: RemotingClient
) -> None:
    config = broker_config(tmp_path / "s")
    b = BrokerController(config)
    await b.start()
    try:
        make_topic(b, "E")
        await send(client, b, "E", [b"e"])
        _, _, handles = await pop(client, b, "E")
        # Someone with store access writes garbage and a copy with a wrong MAC to the log.
        forged = b"\x92\x01\x90" + bytes(16)  # msgpack [1, []] and a wrong MAC
        await b.bridge.put(MessageBatch(REVIVE_TOPIC, 0, [b"junk", forged], [b"", b""]))
    finally:
        await b.stop()
    (tmp_path / "s" / "config" / "pop_revive.json").write_text("{not json")
    b = BrokerController(config)
    await b.start()
    try:
        assert b.pop.inflight(GROUP, "E", 0) == 1
        assert (await ack(client, b, "E", handles[0])).code == ResponseCode.SUCCESS
    finally:
        await b.stop()


@NEEDS_POP_RETRY_TOPIC
async def test_revive_log_compaction_moves_replay_past_an_old_open_checkpoint(
    tmp_path: Path, client: RemotingClient
) -> None:
    """A CK held open while the revive log grows is written again at the head (with its acks)
    once it is pop_revive_compact_lag entries behind: the revive checkpoint moves past its
    first entry, so a restart replays from the copy, and the CK is intact (handles valid, its
    acked message not revived, the other revived at its deadline)."""
    config = broker_config(tmp_path / "s", pop_revive_interval_ms=50, pop_revive_compact_lag=5)
    b = BrokerController(config)
    await b.start()
    try:
        no_pop_backoff(b)
        make_topic(b, "K")
        make_topic(b, "N")
        await send(client, b, "K", [b"k0", b"k1", b"k2"])
        _, held, handles = await pop(client, b, "K", invisible_time_ms=6_000)
        assert [m.body for m in held] == [b"k0", b"k1", b"k2"]
        assert (await ack(client, b, "K", handles[0])).code == ResponseCode.SUCCESS
        await send(client, b, "N", [f"n{i}".encode() for i in range(12)])
        for _ in range(12):  # revive-log traffic: a CK and an ACK each
            _, _, hs = await pop(client, b, "N", max_msg_nums=1)
            assert (await ack(client, b, "N", hs[0])).code == ResponseCode.SUCCESS
        async with asyncio.timeout(5):
            while b.pop.reviver.compacted == 0:
                await asyncio.sleep(0.05)
        assert b.pop.checkpoint_floor() > 1  # the CK's first entry (0) and its ack (1)
    finally:
        await b.stop()
    saved = json.loads((tmp_path / "s" / "config" / "pop_revive.json").read_text())
    assert saved["revive_offset"] > 1

    b = BrokerController(config)
    await b.start()
    try:
        assert b.pop.inflight(GROUP, "K", 0) == 2
        assert (await ack(client, b, "K", handles[0])).code == ResponseCode.RECEIPT_HANDLE_EXPIRED
        assert (await ack(client, b, "K", handles[1])).code == ResponseCode.SUCCESS
        got = await _drain(client, b, "K", 1, wait_s=10)
        assert [(m.body, m.reconsume_times) for m in got] == [(b"k2", 1)]
    finally:
        await b.stop()


def test_compaction_takes_only_old_ordinary_checkpoints_no_append_is_touching() -> None:
    from orbitmq.broker.pop.records import CkRecord
    from orbitmq.broker.pop.state import PopState

    def ck(ck_id: int, fifo: bool = False) -> CkRecord:
        return CkRecord(ck_id=ck_id, group="g", topic="t", origin_topic="t", queue_id=0,
                        offsets=[ck_id], phys=[ck_id], pop_time_ms=0, deadline_ms=10**12,
                        fifo_attempts=[1] if fifo else None)  # fmt: skip

    state = PopState()
    a, busy, fifo, new = (state.add(ck(1), 0), state.add(ck(2), 1), state.add(ck(3, True), 2),
                          state.add(ck(4), 50))  # fmt: skip
    busy.pending = 1
    assert state.stale(10, 100) == [a]  # busy is left for later; the FIFO CK stops the walk
    assert state.revive_floor() == 1
    state.moved(a, 60)
    busy.pending = 0
    assert state.stale(10, 100) == [busy]
    state.unmoved([busy])  # its append failed: the floor is its entry again
    assert state.revive_floor() == 1
    assert new.log_offset == 50 and fifo.log_offset == 2

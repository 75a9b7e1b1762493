"""Replica appends: a master's log replayed chunk by chunk gives a byte-identical slave."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from orbitmq.common.errors import DiskFullError, StoreError
from orbitmq.store.message_store import MessageStore
from orbitmq.store.replica import ReplicaDataError, ReplicaOffsetError, check_chunk
from tests.store.hastore import QUEUES, Writer, ha_config, read_all


def _log_bytes(store: MessageStore) -> bytes:
    cl = store.commit_log
    out = bytearray()
    for seg in cl.segments.segments:
        out += seg.view[: max(0, min(seg.size, cl.max_offset - seg.start))]
    return bytes(out)


def _replay(master: MessageStore, slave: MessageStore, rng: random.Random) -> int:
    chunks = 0
    while slave.commit_log.max_offset < master.commit_log.max_offset:
        at = slave.commit_log.max_offset
        chunk = master.read_replication(at, rng.choice([1, 300, 4096, 32 * 1024]))
        assert len(chunk) > 0
        assert slave.append_replicated(at, bytes(chunk)) == at + len(chunk)
        chunks += 1
    return chunks


def _same(master: MessageStore, slave: MessageStore, w: Writer) -> None:
    assert master.wait_for_dispatch() and slave.wait_for_dispatch()
    assert _log_bytes(slave) == _log_bytes(master)
    assert read_all(slave) == read_all(master) == w.expected()
    for topic, qid in QUEUES:
        assert slave.max_offset(topic, qid) == master.max_offset(topic, qid)
        mcq, scq = master.queues.get(topic, qid), slave.queues.get(topic, qid)
        if mcq is None:
            assert scq is None
            continue
        assert scq is not None
        assert bytes(scq.entries(0, 10**6)) == bytes(mcq.entries(0, 10**6))
    for s in w.sent[-40:]:
        got = [m.body for m in slave.query_by_key(s.topic, s.key)]
        assert got == [m.body for m in master.query_by_key(s.topic, s.key)]
    assert slave.commit_log.queue_offsets == master.commit_log.queue_offsets


def test_replayed_chunk_by_chunk_is_identical(tmp_path: Path) -> None:
    rng = random.Random(11)
    master = MessageStore(ha_config(tmp_path / "master"))
    slave = MessageStore(ha_config(tmp_path / "slave"))
    master.open()
    slave.open()
    w = Writer(rng)
    for _ in range(6):
        for _ in range(rng.randint(10, 40)):
            w.append(master)
        _replay(master, slave, rng)
    assert len(master.commit_log.segments.segments) >= 3  # several segment rolls
    _same(master, slave, w)
    # The slave, restarted, is still the same; and could take over: its next appends continue
    # every queue where the master's would have.
    slave.close()
    slave = MessageStore(ha_config(tmp_path / "slave"))
    slave.open()
    _same(master, slave, w)
    sent = w.append(slave, 3)
    assert sent[0].qoff == master.commit_log.queue_offsets[(sent[0].topic, sent[0].qid)]
    master.close()
    slave.close()


def test_bad_chunks_write_nothing(tmp_path: Path) -> None:
    rng = random.Random(5)
    master = MessageStore(ha_config(tmp_path / "master"))
    slave = MessageStore(ha_config(tmp_path / "slave"))
    master.open()
    slave.open()
    w = Writer(rng)
    for _ in range(5):
        w.append(master)
    chunk = bytes(master.read_replication(0, 1 << 20))
    with pytest.raises(ReplicaOffsetError):
        slave.append_replicated(100, chunk)
    for i in (0, 5, 30, 90, len(chunk) // 2, len(chunk) - 1):  # header, crc, body ...
        bad = bytearray(chunk)
        bad[i] ^= 0x01
        with pytest.raises(ReplicaDataError):
            slave.append_replicated(0, bytes(bad))
    with pytest.raises(ReplicaDataError):
        slave.append_replicated(0, chunk[:-1])  # a partial record
    with pytest.raises(ReplicaDataError, match="says it is at"):
        check_chunk(chunk[w.sent[1].phy :], 0, slave.commit_log.segment_size)
    assert slave.commit_log.max_offset == 0 and not slave.commit_log.segments.segments
    slave.append_replicated(0, chunk)
    _same(master, slave, w)
    assert len(master.read_replication(master.commit_log.max_offset + 10**7, 10)) == 0
    master.close()
    slave.close()


def test_read_replication_respects_limits(tmp_path: Path) -> None:
    master = MessageStore(ha_config(tmp_path / "master"))
    master.open()
    w = Writer(random.Random(2))
    for _ in range(30):
        w.append(master)
    first = w.sent[0]
    assert len(master.read_replication(0, 1)) == first.end  # one record even if bigger
    limit = w.sent[10].phy
    chunk = master.read_replication(0, 1 << 30, limit)
    assert len(chunk) == limit
    assert len(master.read_replication(master.commit_log.max_offset, 100)) == 0
    seg = master.commit_log.segment_size
    big = master.read_replication(0, 1 << 30)
    assert len(big) <= seg  # within one segment
    master.close()


def test_new_slave_starts_at_a_later_segment(tmp_path: Path) -> None:
    rng = random.Random(9)
    master = MessageStore(ha_config(tmp_path / "master"))
    slave = MessageStore(ha_config(tmp_path / "slave"))
    master.open()
    slave.open()
    w = Writer(rng)
    while master.commit_log.max_offset < 2 * master.commit_log.segment_size + 1000:
        w.append(master)
    start = master.commit_log.segment_size
    while slave.commit_log.max_offset < master.commit_log.max_offset:
        at = max(slave.commit_log.max_offset, start)
        slave.append_replicated(at, bytes(master.read_replication(at, 8192)))
    assert slave.commit_log.min_offset == start
    with pytest.raises(StoreError, match="not held"):
        slave.read_replication(0, 10)  # below what this log holds
    assert slave.wait_for_dispatch()
    for s in w.sent[-10:]:
        r = slave.get_messages(s.topic, s.qid, s.qoff, max_count=1)
        assert r.count == 1 and r.queue_offsets == [s.qoff]
    master.close()
    slave.close()


def test_replication_pauses_when_the_disk_is_full(tmp_path: Path) -> None:
    disk = [10.0]
    master = MessageStore(ha_config(tmp_path / "master"))
    slave = MessageStore(ha_config(tmp_path / "slave"), disk_usage=lambda: disk[0])
    master.open()
    slave.open()
    w = Writer(random.Random(3))
    for _ in range(3):
        w.append(master)
    chunk = bytes(master.read_replication(0, 1 << 20))
    disk[0] = 99.0
    slave.retention.run()
    with pytest.raises(DiskFullError):
        slave.append_replicated(0, chunk)
    disk[0] = 10.0
    slave.retention.run()
    slave.append_replicated(0, chunk)
    _same(master, slave, w)
    master.close()
    slave.close()

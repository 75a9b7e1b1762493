"""MessageStore.truncate_to: the cut, the derived data, the queue offsets, and crashes inside."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from orbitmq.common.errors import StoreClosedError, StoreError
from orbitmq.store.config import FlushDiskType
from orbitmq.store.message_store import MessageStore
from orbitmq.store.timer_index import TIMER_TOPIC
from orbitmq.store.truncate import STEPS
from tests.store.hastore import Writer, ha_config, read_all
from tests.store.powercut import PowerCut


def _fill(store: MessageStore, w: Writer, rounds: int) -> None:
    for _ in range(rounds):
        w.append(store)


def _cut_point(w: Writer, store: MessageStore) -> int:
    """A record start in an older segment than the last, so later segments go too."""
    seg = store.commit_log.segment_size
    last_seg = store.commit_log.max_offset // seg
    candidates = [s.phy for s in w.sent if s.phy // seg < last_seg and s.phy % seg > 0]
    return w.rng.choice(candidates)


def _check(store: MessageStore, w: Writer, where: str, *, keys: bool = True) -> None:
    assert store.wait_for_dispatch(), where
    want = w.expected()
    assert read_all(store) == want, where
    for (topic, qid), msgs in want.items():
        assert store.max_offset(topic, qid) == len(msgs), where
    for s in w.sent[-30:] if keys else ():
        if s.topic != TIMER_TOPIC:
            assert [m.body for m in store.query_by_key(s.topic, s.key)] == [s.body], where


def test_truncate_then_append_then_restart(tmp_path: Path) -> None:
    config = ha_config(tmp_path / "store")
    w = Writer(random.Random(7))
    store = MessageStore(config)
    store.open()
    store.epochs.append(1, 0)
    _fill(store, w, 80)
    store.epochs.append(2, store.commit_log.max_offset)
    _fill(store, w, 20)
    assert store.wait_for_dispatch()
    cut = _cut_point(w, store)
    segments_before = len(store.commit_log.segments.segments)
    report = store.truncate_to(cut)
    assert report.segments_removed >= 1 and report.epochs_dropped == 1
    assert len(store.commit_log.segments.segments) == segments_before - report.segments_removed
    assert store.commit_log.max_offset == cut
    assert store.epochs.entries == ((1, 0),)
    w.cut(cut)
    _check(store, w, "after the cut")
    # Every queue continues right after its last kept entry (RocketMQ #7689).
    for _ in range(30):
        for s in w.append(store):
            kept = [x for x in w.sent if (x.topic, x.qid) == (s.topic, s.qid)]
            assert [x.qoff for x in kept] == list(range(len(kept)))
    _check(store, w, "after new appends")
    store.close()
    store = MessageStore(config)
    report2 = store.open()
    assert report2.clean
    _check(store, w, "after a restart")
    assert store.epochs.entries == ((1, 0),)
    store.close()


def test_truncate_before_dispatch_keeps_offsets(tmp_path: Path) -> None:
    """Records not yet dispatched when the cut comes still count for the next queue offset."""
    store = MessageStore(ha_config(tmp_path / "store"))
    store.open()
    w = Writer(random.Random(3))
    store.dispatcher.stop()  # nothing dispatched: the offsets must come from the log itself
    _fill(store, w, 40)
    cut = w.sent[len(w.sent) // 2].phy
    store.truncate_to(cut)
    w.cut(cut)
    for _ in range(10):
        w.append(store)
    _check(store, w, "undispatched cut")
    for topic, qid in {(s.topic, s.qid) for s in w.sent}:
        kept = [x.qoff for x in w.sent if (x.topic, x.qid) == (topic, qid)]
        assert kept == list(range(len(kept)))
    store.close()


def test_truncate_refuses_bad_offsets(tmp_path: Path) -> None:
    store = MessageStore(ha_config(tmp_path / "store"))
    store.open()
    w = Writer(random.Random(1))
    _fill(store, w, 5)
    with pytest.raises(StoreError, match="not the start of a record"):
        store.truncate_to(w.sent[1].phy + 3)
    with pytest.raises(StoreError, match="holds"):
        store.truncate_to(store.commit_log.max_offset + 1)
    store.truncate_to(store.commit_log.max_offset)  # a no-op
    _check(store, w, "no-op")
    store.close()
    with pytest.raises(StoreClosedError):
        store.truncate_to(0)


class _Crash(Exception):
    pass


@pytest.mark.parametrize("point", STEPS)
@pytest.mark.parametrize(
    ("power", "torn"), [(False, False), (True, False), (True, True)],
    ids=["kill", "powercut", "powercut-torn"],
)  # fmt: skip
def test_crash_inside_truncation(tmp_path: Path, point: str, power: bool, torn: bool) -> None:
    """Stop at each step: a kill (the page cache survives) or a power cut (only what was
    fsynced survives; with ``torn`` each un-fsynced page may or may not have reached the disk).
    After a restart nothing past the cut comes back once the cut was durable, and everything
    before it is intact, key lookups included (a torn IndexFile entry straddling a page once
    made the index cut keep stale entries and hide a surviving key).
    ``ORBITMQ_TRUNCATE_SEEDS`` runs more seeds than the default 3."""
    for seed in range(int(os.environ.get("ORBITMQ_TRUNCATE_SEEDS", "3"))):
        root = tmp_path / f"{seed}"
        config = ha_config(root / "store")
        rng = random.Random(seed * 31 + STEPS.index(point))
        w = Writer(rng)
        store = MessageStore(config)
        store.open()
        store.epochs.append(1, 0)
        _fill(store, w, 60)
        store.epochs.append(2, store.commit_log.max_offset)
        _fill(store, w, 20)
        store.close()  # everything durable before the power cut starts recording
        store = MessageStore(config)
        store.open()
        cut = _cut_point(w, store)
        old = list(w.sent)
        epochs = list(store.epochs.entries)
        with PowerCut(config.store_path, random.Random(seed), torn=torn) as pc:
            pc.all_durable()

            def stop_at(name: str) -> None:
                if name != point:
                    return
                if power:
                    pc.freeze()  # the power goes here; the truncation runs on
                else:
                    raise _Crash(name)

            if power:
                store.truncate_to(cut, step=stop_at)
                pc.cut(store)
            else:
                with pytest.raises(_Crash):
                    store.truncate_to(cut, step=stop_at)
                store.crash_for_test()
        store = MessageStore(config)
        report = store.open()
        end = store.commit_log.max_offset
        before_cut = STEPS.index(point) < STEPS.index("zeroed")
        where = f"seed {seed} at {point}: end {end}, cut {cut}, report {report}"
        if before_cut:
            # The cut was not durable yet: the log is the old one (a kill), or a prefix of it
            # at least as long as the cut (a power cut, with the zeros' pages torn).
            assert cut <= end <= old[-1].end, where
            if not power:
                assert end == old[-1].end, where
            w.sent = [s for s in old if s.end <= end]
        else:
            assert end == cut, where
            w.sent = [s for s in old if s.end <= cut]
        _check(store, w, where)
        kept = [(e, start) for e, start in epochs if start < end]
        assert list(store.epochs.entries) in (kept, [*epochs[: len(kept) + 1]]), where
        assert all(start <= end for _e, start in store.epochs.entries), where
        for _ in range(5):
            w.append(store)
        _check(store, w, where + " (appended)")
        store.close()


def test_truncate_forgets_flush_requests_past_the_cut(tmp_path: Path) -> None:
    """A SYNC_FLUSH request for bytes that were cut must not keep the flusher spinning."""
    store = MessageStore(ha_config(tmp_path / "store", flush_disk_type=FlushDiskType.SYNC_FLUSH))
    store.open()
    w = Writer(random.Random(6))
    for _ in range(10):
        w.append(store)
    store.request_flush(store.commit_log.max_offset)
    time.sleep(0.1)
    store.truncate_to(w.sent[3].phy)
    before = store.flusher.fsync_count
    time.sleep(0.3)
    assert store.flusher.fsync_count - before < 50
    w.cut(w.sent[3].phy)
    w.append(store)
    _check(store, w, "after the cut")
    store.close()

"""MessageStore against an in-memory model, driven by a hypothesis state machine.

The model is ``(topic, queue_id) -> [(body, tag, keys)]``. Steps append random batches, read
random ranges with random limits and tag filters, checkpoint, close and reopen cleanly, and
crash in-process (``crash_for_test``: the page cache survives, so nothing appended may be lost).
Segments are tiny (80 KiB) so batches roll segments and leave end-of-segment fillers; the
ConsumeQueue and index files are tiny too, so they roll as well.

Replay a run with ``ORBITMQ_SEED=<n>`` (the seed is printed).
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from orbitmq.common.message import Message, MessageBatch
from orbitmq.common.record import check_record, decode
from orbitmq.store.config import FlushDiskType, StoreConfig
from orbitmq.store.message_store import GetResult, GetStatus, MessageStore
from orbitmq.store.recovery import RecoveryReport
from orbitmq.testing import small_store_config

TOPICS = ("TA", "TB", "TC")
QUEUES = (0, 1, 2)
TAGS = (None, "a", "b", "c")
KEYS = tuple(f"k{i}" for i in range(40))
SEGMENT = 80 * 1024


@dataclass(frozen=True, slots=True)
class Model:
    body: bytes
    tag: str | None
    keys: tuple[str, ...]


def store_config(path: Path, flush: FlushDiskType) -> StoreConfig:
    return small_store_config(
        path,
        mapped_file_size_commit_log=SEGMENT,
        max_message_size=8192,
        consume_queue_entries_per_file=16,
        max_hash_slot_num=16,
        max_index_num=64,
        flush_disk_type=flush,
        flush_interval_commit_log_ms=10,
        flush_interval_consume_queue_ms=30,
        clean_resource_interval_ms=3_600_000,
    )


_PATTERN = bytes(i % 251 for i in range(251 + 3000))


def body_for(n: int, size: int) -> bytes:
    """A body that names its own sequence number, so a misplaced record is recognisable."""
    head = f"#{n}:".encode()
    start = n % 251
    return (head + _PATTERN[start : start + max(0, size - len(head))])[:size]


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="orbitmq-stateful-"))
        self.model: dict[tuple[str, int], list[Model]] = {}
        self.store: MessageStore | None = None
        self.config: StoreConfig | None = None
        self.seq = 0
        self.dispatched = True

    # ------------------------------------------------------------------ helpers

    def _open(self) -> RecoveryReport:
        assert self.config is not None
        store = MessageStore(self.config, disk_usage=lambda: 10.0)
        report = store.open()
        self.store = store
        return report

    @property
    def s(self) -> MessageStore:
        assert self.store is not None
        return self.store

    def _sync(self) -> None:
        if not self.dispatched:
            assert self.s.wait_for_dispatch(10.0), "dispatch did not catch up"
            self.dispatched = True

    def _check_served(self, topic: str, qid: int, res: GetResult) -> None:
        model = self.model.get((topic, qid), [])
        assert not res.skipped, f"skipped {res.skipped} with no damage"
        assert len(res.messages) == len(res.queue_offsets)
        for view, qoff in zip(res.messages, res.queue_offsets, strict=True):
            assert check_record(view, 0, len(view), verify_crc=True) == len(view)
            m = decode(view)
            want = model[qoff]
            assert m.topic == topic and m.queue_id == qid and m.queue_offset == qoff
            assert m.body == want.body, f"{topic}/{qid}@{qoff}: wrong body"
            assert m.tags == want.tag
            assert tuple(m.keys) == want.keys

    # ------------------------------------------------------------------ lifecycle

    @initialize(flush=st.sampled_from(FlushDiskType))
    def open_store(self, flush: FlushDiskType) -> None:
        self.config = store_config(self.dir / "store", flush)
        report = self._open()
        assert report.clean

    def teardown(self) -> None:
        try:
            if self.store is not None and self.store.is_open:
                self.store.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------------ writes

    @rule(
        batches=st.lists(
            st.tuples(
                st.sampled_from(TOPICS),
                st.sampled_from(QUEUES),
                st.lists(
                    st.tuples(
                        st.integers(1, 3000),
                        st.sampled_from(TAGS),
                        st.lists(st.sampled_from(KEYS), max_size=2),
                    ),
                    min_size=1,
                    max_size=20,
                ),
                st.booleans(),
            ),
            min_size=1,
            max_size=4,
        )
    )
    def append(
        self, batches: list[tuple[str, int, list[tuple[int, str | None, list[str]]], bool]]
    ) -> None:
        for topic, qid, specs, use_put in batches:
            self._append_one(topic, qid, specs, use_put)

    def _append_one(
        self, topic: str, qid: int, specs: list[tuple[int, str | None, list[str]]], use_put: bool
    ) -> None:
        items: list[Model] = []
        for size, tag, keys in specs:
            items.append(Model(body_for(self.seq, size), tag, tuple(dict.fromkeys(keys))))
            self.seq += 1
        batch = MessageBatch.of(
            topic, qid, [Message(topic, m.body, tags=m.tag, keys=m.keys) for m in items]
        )
        before = self.s.commit_log.max_offset
        result = (self.s.put if use_put else self.s.append)(batch)
        queue = self.model.setdefault((topic, qid), [])
        assert result.first_queue_offset == len(queue), "queue offsets must be contiguous"
        assert result.count == len(items)
        assert result.physical_offsets[0] >= before
        assert result.physical_offsets == sorted(result.physical_offsets)
        assert result.end_offset == self.s.commit_log.max_offset
        for phy, size in zip(result.physical_offsets, result.sizes, strict=True):
            # a record never straddles two segments
            assert phy // SEGMENT == (phy + size - 1) // SEGMENT
        if self.s.config.flush_disk_type is FlushDiskType.SYNC_FLUSH and use_put:
            assert self.s.commit_log.flushed_offset >= result.end_offset
        queue.extend(items)
        self.dispatched = False

    # ------------------------------------------------------------------ reads

    @rule(
        data=st.data(),
        max_count=st.integers(1, 40),
        max_bytes=st.sampled_from([1, 500, 3000, 10_000, 64 * 1024, 4 * 1024 * 1024]),
        tag_filter=st.one_of(st.none(), st.sets(st.sampled_from(("a", "b", "c", "zz")))),
    )
    def read_range(
        self, data: st.DataObject, max_count: int, max_bytes: int, tag_filter: set[str] | None
    ) -> None:
        topic = data.draw(st.sampled_from(TOPICS))
        qid = data.draw(st.sampled_from(QUEUES))
        model = self.model.get((topic, qid))
        hi = len(model) if model else 0
        offset = data.draw(st.integers(-2, hi + 2))
        self._sync()
        res = self.s.get_messages(topic, qid, offset, max_count, max_bytes, tags=tag_filter)
        if model is None:
            assert res.status is GetStatus.NO_MATCHED_LOGIC_QUEUE
            assert not res.messages
            return
        assert (res.min_offset, res.max_offset) == (0, hi)
        if offset < 0:
            assert res.status is GetStatus.OFFSET_TOO_SMALL and res.next_begin_offset == 0
            return
        if offset == hi:
            assert res.status is GetStatus.OFFSET_OVERFLOW_ONE and res.next_begin_offset == hi
            return
        if offset > hi:
            assert res.status is GetStatus.OFFSET_OVERFLOW_BADLY and res.next_begin_offset == hi
            return
        self._check_served(topic, qid, res)
        nxt = res.next_begin_offset
        assert offset < nxt <= hi, "a read that scans nothing would never advance"
        matching = [
            i for i in range(offset, nxt) if tag_filter is None or model[i].tag in tag_filter
        ]
        assert res.queue_offsets == matching, "every match in the scanned range is served"
        assert len(res.messages) <= max_count
        used = res.total_bytes
        if res.messages:
            assert res.status is GetStatus.FOUND
            assert used - len(res.messages[-1]) < max_bytes, "read past the byte budget"
        else:
            assert res.status is GetStatus.NO_MATCHED_MESSAGE
        full = len(res.messages) == max_count or used >= max_bytes
        if full:
            assert nxt == res.queue_offsets[-1] + 1, "stopped on a limit: resume after last"
        elif tag_filter is None:
            assert nxt == hi, "without a filter a read stops only on a limit or at the end"
        else:
            # a filtered read may also stop after scanning enough entries
            assert nxt == hi or nxt - offset >= max(max_count * 4, 256)

    @rule(data=st.data())
    def read_whole_queue(self, data: st.DataObject) -> None:
        """Chained reads from min to max: contiguous offsets, every record, byte-identical."""
        if not self.model:
            return
        topic, qid = data.draw(st.sampled_from(sorted(self.model)))
        model = self.model[(topic, qid)]
        self._sync()
        assert self.s.min_offset(topic, qid) == 0
        assert self.s.max_offset(topic, qid) == len(model)
        offset = 0
        seen: list[int] = []
        while offset < len(model):
            res = self.s.get_messages(topic, qid, offset, max_count=7, max_bytes=20_000)
            assert res.status is GetStatus.FOUND
            self._check_served(topic, qid, res)
            seen += res.queue_offsets
            assert res.next_begin_offset > offset
            offset = res.next_begin_offset
        assert seen == list(range(len(model)))

    @rule(data=st.data())
    def read_without_waiting(self, data: st.DataObject) -> None:
        """Reads racing the dispatcher see a prefix of the queue, never wrong records."""
        if not self.model:
            return
        topic, qid = data.draw(st.sampled_from(sorted(self.model)))
        model = self.model[(topic, qid)]
        hi = self.s.max_offset(topic, qid)
        assert hi <= len(model)
        offset = data.draw(st.integers(0, len(model)))
        res = self.s.get_messages(topic, qid, offset, max_count=16)
        if res.messages:
            self._check_served(topic, qid, res)
            assert res.queue_offsets == list(range(offset, offset + len(res.messages)))

    @rule(data=st.data())
    def query_key(self, data: st.DataObject) -> None:
        topic = data.draw(st.sampled_from(TOPICS))
        key = data.draw(st.sampled_from(KEYS))
        self._sync()
        want = sorted(
            m.body for (t, _q), ms in self.model.items() if t == topic for m in ms if key in m.keys
        )
        got = self.s.query_by_key(topic, key, max_num=64)
        bodies = sorted(m.body for m in got)
        for m in got:
            assert m.topic == topic and key in m.keys
        if len(want) <= 64:
            assert bodies == want
        else:
            assert len(bodies) == 64 and set(bodies) <= set(want)

    # ------------------------------------------------------------------ lifecycle steps

    @rule()
    def wait_for_dispatch(self) -> None:
        self._sync()

    @rule()
    def checkpoint(self) -> None:
        self.s.checkpoint()

    @rule()
    def close_and_reopen(self) -> None:
        self.s.close()
        report = self._open()
        assert report.clean, report.problems
        assert report.records_scanned == 0
        self.dispatched = True

    @rule(wait=st.booleans())
    def crash_and_reopen(self, wait: bool) -> None:
        if wait:
            self._sync()
        end = self.s.commit_log.max_offset
        self.s.crash_for_test()
        report = self._open()
        assert not report.clean
        assert not report.cuts, f"in-process crash lost data: {report.cuts}"
        assert report.end_offset == end, "the CommitLog end moved across a crash"
        self.dispatched = True  # recovery dispatches the tail before open() returns

    # ------------------------------------------------------------------ invariants

    @precondition(lambda self: self.store is not None)
    @invariant()
    def offsets_match_model(self) -> None:
        self._sync()
        s = self.s
        for topic in TOPICS:
            want_ids = sorted(q for (t, q) in self.model if t == topic)
            assert s.queue_ids(topic) == want_ids
        for (topic, qid), model in self.model.items():
            assert s.min_offset(topic, qid) == 0
            assert s.max_offset(topic, qid) == len(model)
            assert s.commit_log.queue_offsets[(topic, qid)] == len(model)
        assert s.dispatcher.reput_offset == s.commit_log.max_offset


def _seed() -> int:
    env = os.environ.get("ORBITMQ_SEED")
    return int(env) if env else random.randrange(2**32)


def test_store_matches_model() -> None:
    n = _seed()
    print(f"ORBITMQ_SEED={n}")
    machine: Any = seed(n)(StoreMachine)
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=int(os.environ.get("ORBITMQ_STATEFUL_EXAMPLES", "40")),
            stateful_step_count=50,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        ),
    )

"""SIGKILL a real appender process at random moments, then check the store it leaves.

Each cycle: a child (``tests.crash.appender``) opens the store and appends from four threads,
reporting every acknowledged batch; the parent SIGKILLs it (by PID) at a random moment, then
opens the store itself and checks, record by record:

1. every acknowledged message is at its reported (topic, queue, offset), byte-identical;
2. ConsumeQueues and CommitLog agree both ways: every queue offset from min to max is served
   with nothing skipped, each entry's (physical offset, size, tag) matches its record, and a
   scan of the whole CommitLog with ``check_record`` finds each record in its queue at its
   offset (and no other record anywhere);
3. nothing lies beyond the end: queues are contiguous, every batch found is a prefix of what
   was sent, and the CommitLog past its end is zeros;
4. the recovered store takes appends that continue the queue offsets, and a clean reopen after
   that is clean.

Kill moments: a random delay while appending, right after the child starts open() (a recovery
when the parent left the store unclean), when acknowledged batches end near a segment roll, or
inside close(). Cycles run on the same store directory for several rounds, so data from earlier
crashes must survive the later ones. The seed is printed; ORBITMQ_SEED replays the batches and
every random choice (the wall-clock moment of a kill cannot be replayed exactly);
ORBITMQ_CRASH_ITERATIONS sets the number of kills per test.
"""

from __future__ import annotations

import random
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from orbitmq.common.message import MessageBatch, encode_properties, tag_hash
from orbitmq.common.record import HEADER, HEADER_SIZE, MAGIC, U16, check_record, decode
from orbitmq.store.consume_queue import ENTRY_DTYPE
from orbitmq.store.message_store import GetStatus, MessageStore
from orbitmq.store.recovery import RecoveryReport
from tests.crash.appender import (
    BatchSpec,
    batch_spec,
    crash_config,
    no_disk_pressure,
    parse_ident,
    report_summary,
)
from tests.crash.conftest import Ack, Child, Spawn

pytestmark = pytest.mark.crash

CYCLES_PER_STORE = 5  # kills on one directory before starting afresh (bounds verify time)
PARENT_THREAD = 100  # "thread" number of the batches the parent appends itself
START_TIMEOUT_S = 60.0

BatchKey = tuple[int, int, int]  # (round, thread, seq)
I32 = struct.Struct(">i")
BODY_LENGTH_AT = HEADER_SIZE - 4  # the record's last header field, then body, topic, properties


@dataclass(slots=True)
class Acked:
    topic: str
    queue_id: int
    first: int
    count: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class Expected:
    """A batch as sent, and each record's bytes from BODY_LENGTH to its end as they must be."""

    spec: BatchSpec
    tails: list[bytes]
    tags: list[int]

    @classmethod
    def of(cls, spec: BatchSpec) -> Expected:
        topic = spec.topic.encode()
        tails = []
        for m in spec.messages:
            props = encode_properties(m.system_properties())
            tails.append(
                I32.pack(len(m.body)) + m.body + U16.pack(len(topic)) + topic
                + U16.pack(len(props)) + props
            )  # fmt: skip
        return cls(spec, tails, [tag_hash(m.tags) for m in spec.messages])


@dataclass(slots=True)
class Ledger:
    """What the store has acknowledged so far on one directory."""

    seed: int
    acked: dict[BatchKey, Acked] = field(default_factory=dict)
    cache: dict[BatchKey, Expected] = field(default_factory=dict)

    def expected(self, key: BatchKey) -> Expected:
        exp = self.cache.get(key)
        if exp is None:
            exp = self.cache[key] = Expected.of(batch_spec(self.seed, *key))
        return exp

    def spec(self, key: BatchKey) -> BatchSpec:
        return self.expected(key).spec

    def add(self, round_no: int, thread: int, seq: int, acked: Acked) -> None:
        key = (round_no, thread, seq)
        assert key not in self.acked, f"batch {key} acknowledged twice"
        sp = self.spec(key)
        assert (acked.topic, acked.queue_id, acked.count) == (
            sp.topic,
            sp.queue_id,
            len(sp.messages),
        ), f"ACK of {key} does not describe the batch that was sent"
        self.acked[key] = acked

    def add_child(self, round_no: int, acks: list[Ack]) -> None:
        for a in acks:
            self.add(
                round_no,
                a.thread,
                a.seq,
                Acked(a.topic, a.queue_id, a.first_queue_offset, a.count, a.end_offset),
            )

    def messages(self) -> int:
        return sum(a.count for a in self.acked.values())


@dataclass(slots=True)
class Verified:
    records: int = 0
    missing_acked: int = 0
    unacked_present: int = 0
    queues: dict[tuple[str, int], int] = field(default_factory=dict)


def open_store(
    path: Path, mode: str, checkpoint_ms: int = 100
) -> tuple[MessageStore, RecoveryReport]:
    store = MessageStore(crash_config(path, mode, checkpoint_ms), disk_usage=no_disk_pressure)
    report = store.open()
    return store, report


def verify_store(store: MessageStore, ledger: Ledger, rng: random.Random) -> Verified:
    """Checks 1-3 of the module docstring; returns counts. Fails on the first inconsistency."""
    out = Verified()
    seen: dict[tuple[str, int, int], tuple[int, tuple[int, int, int, int]]] = {}
    present: dict[BatchKey, list[int]] = {}
    cl = store.commit_log
    # --- every queue, offset by offset, through the read path
    for (topic, qid), cq in sorted(store.queues.queues.items()):
        lo, hi = store.min_offset(topic, qid), store.max_offset(topic, qid)
        where = f"{topic}/{qid} [{lo}, {hi})"
        assert lo == 0, f"{where}: queue lost its head (nothing is deleted in these tests)"
        assert cl.queue_offsets.get((topic, qid), 0) == hi, (
            f"{where}: next append would get offset {cl.queue_offsets.get((topic, qid))}"
        )
        want_phy: list[int] = []
        want_size: list[int] = []
        want_tag: list[int] = []
        off = lo
        while off < hi:
            res = store.get_messages(topic, qid, off, max_count=512, max_bytes=32 << 20)
            assert res.status is GetStatus.FOUND, f"{where}: read at {off} gave {res.status}"
            assert not res.skipped, f"{where}: read at {off} skipped {res.skipped}"
            n = len(res.messages)
            assert res.queue_offsets == list(range(off, off + n)), (
                f"{where}: read at {off} returned offsets {res.queue_offsets[:8]}..."
            )
            assert res.next_begin_offset == off + n
            for qoff, raw in zip(res.queue_offsets, res.messages, strict=True):
                total, magic, _crc, rqid, _flag, rqoff, phy, *_mid, body_len = HEADER.unpack_from(
                    raw
                )
                rec = f"{where} offset {qoff} (phy {phy})"
                assert (total, magic, rqid, rqoff) == (len(raw), MAGIC, qid, qoff), rec
                try:
                    ident = parse_ident(bytes(raw[HEADER_SIZE : HEADER_SIZE + min(body_len, 64)]))
                except ValueError:
                    raise AssertionError(f"{rec}: a body no writer sent") from None
                exp = ledger.expected(ident[:3])
                assert ident[3] < len(exp.tails), f"{rec}: no message {ident} was ever sent"
                assert (exp.spec.topic, exp.spec.queue_id) == (topic, qid), (
                    f"{rec}: {ident} belongs in {exp.spec.topic}/{exp.spec.queue_id}"
                )
                # Body, topic and properties, byte for byte.
                assert bytes(raw[BODY_LENGTH_AT:]) == exp.tails[ident[3]], f"{rec}: {ident} differs"
                want_phy.append(phy)
                want_size.append(total)
                want_tag.append(exp.tags[ident[3]])
                seen[(topic, qid, qoff)] = (phy, ident)
                present.setdefault(ident[:3], []).append(ident[3])
            off += n
        assert store.get_messages(topic, qid, hi).status in (
            GetStatus.OFFSET_OVERFLOW_ONE,
            GetStatus.NO_MESSAGE_IN_QUEUE,
        ), f"{where}: something is served past the end"
        # The ConsumeQueue entries themselves: (physical offset, size, tag hash) of each record.
        off = lo
        while off < hi:
            entries = np.frombuffer(cq.entries(off, hi - off), dtype=ENTRY_DTYPE)
            assert len(entries), f"{where}: no ConsumeQueue entry at {off}"
            k = len(entries)
            for name, want in (("phy", want_phy), ("size", want_size), ("tag", want_tag)):
                bad = np.nonzero(entries[name] != np.array(want[off - lo : off - lo + k]))[0]
                assert not len(bad), (
                    f"{where}: ConsumeQueue {name} wrong at offsets {(bad + off).tolist()[:5]}"
                )
            off += k
        out.queues[(topic, qid)] = hi
    # --- the whole CommitLog, record by record
    pos = cl.min_offset
    assert pos == 0, f"CommitLog lost its head: starts at {pos}"
    while pos < cl.max_offset:
        loc = cl.view_at(pos)
        assert loc is not None, f"CommitLog: no segment holds offset {pos} < {cl.max_offset}"
        view, at, size = loc
        n = check_record(view, at, size)  # raises RecordError with the reason
        if n < 0:
            pos += -n
            continue
        _t, _m, _c, rqid, _f, rqoff, phy, *_mid, body_len = HEADER.unpack_from(view, at)
        t_at = at + HEADER_SIZE + body_len
        topic = bytes(view[t_at + 2 : t_at + 2 + U16.unpack_from(view, t_at)[0]]).decode()
        assert phy == pos, f"record at {pos} says it is at {phy}"
        found = seen.get((topic, rqid, rqoff))
        assert found is not None and found[0] == pos, (
            f"CommitLog record at {pos} ({topic}/{rqid}/{rqoff}) is not served by its "
            f"ConsumeQueue (has {found})"
        )
        out.records += 1
        pos += n
    assert pos == cl.max_offset, f"CommitLog scan ended at {pos}, store says {cl.max_offset}"
    assert out.records == len(seen), "ConsumeQueues serve records the CommitLog scan did not find"
    last = cl.segments.last()
    if last is not None:
        assert last.start <= cl.max_offset <= last.end, "segments past the CommitLog end"
        tail = np.frombuffer(last.view[cl.max_offset - last.start :], dtype=np.uint8)
        assert not tail.any(), (
            f"non-zero bytes past the CommitLog end {cl.max_offset} in {last.path.name}"
        )
    # --- batches: each is present as a prefix of what was sent, at most once
    for key, idxs in present.items():
        assert sorted(idxs) == list(range(len(idxs))), (
            f"batch {key}: present indices {sorted(idxs)[:10]}... are not a prefix (or repeat)"
        )
    # --- every acknowledged message, where the store said it put it
    max_end = 0
    for key, a in ledger.acked.items():
        max_end = max(max_end, a.end_offset)
        for i in range(a.count):
            got = seen.get((a.topic, a.queue_id, a.first + i))
            if got is None:
                # Loss may only ever be a tail: below a queue's end it would be a hole.
                assert a.first + i >= out.queues.get((a.topic, a.queue_id), 0), (
                    f"acknowledged {key}/{i} missing inside {a.topic}/{a.queue_id}"
                )
                out.missing_acked += 1
                continue
            assert got[1] == (*key, i), (
                f"acknowledged {key}/{i} at {a.topic}/{a.queue_id}/{a.first + i}: found {got[1]}"
            )
    if not out.missing_acked:
        assert cl.max_offset >= max_end, "the CommitLog ends before an acknowledged batch"
    out.unacked_present = out.records - (ledger.messages() - out.missing_acked)
    # --- the key index, sampled
    keys = list(ledger.acked)
    for key in rng.sample(keys, min(8, len(keys))):
        sp = ledger.expected(key).spec
        want_msg = sp.messages[rng.randrange(ledger.acked[key].count)]
        hits = store.query_by_key(sp.topic, want_msg.keys[0])
        assert [m.body for m in hits] == [want_msg.body], (
            f"query_by_key {want_msg.keys[0]} found {len(hits)} messages"
        )
    return out


def append_after_recovery(
    store: MessageStore, ledger: Ledger, round_no: int, first_seq: int, n: int
) -> int:
    """Check 4: new appends continue every queue's offsets. Returns the next seq."""
    seq = first_seq
    for _ in range(n):
        key = (round_no, PARENT_THREAD, seq)
        sp = ledger.spec(key)
        assert store.wait_for_dispatch(30)
        expected = store.commit_log.queue_offsets.get((sp.topic, sp.queue_id), 0)
        assert store.max_offset(sp.topic, sp.queue_id) == expected
        res = store.put(MessageBatch.of(sp.topic, sp.queue_id, sp.messages))
        assert res.first_queue_offset == expected, (
            f"append to {sp.topic}/{sp.queue_id} got offset {res.first_queue_offset}, "
            f"queue ended at {expected}"
        )
        ledger.add(*key, Acked(sp.topic, sp.queue_id, expected, res.count, res.end_offset))
        seq += 1
    assert store.wait_for_dispatch(30)
    return seq


def check_clean_reopen(
    path: Path, mode: str, ledger: Ledger, round_no: int, expect: Verified, end: int
) -> MessageStore:
    """Reopen after a clean close: nothing to recover, every queue where it was."""
    store, report = open_store(path, mode)
    try:
        assert report.clean, f"reopen after a clean close was not clean: {report}"
        assert not report.cuts
        assert store.commit_log.max_offset == end
        for (topic, qid), hi in expect.queues.items():
            assert store.max_offset(topic, qid) == hi, f"{topic}/{qid} moved on a clean reopen"
        for key, a in ledger.acked.items():  # this round's parent appends read back
            if key[0] != round_no or key[1] != PARENT_THREAD:
                continue
            res = store.get_messages(a.topic, a.queue_id, a.first, max_count=a.count)
            assert res.queue_offsets == list(range(a.first, a.first + a.count))
            bodies = [decode(m).body for m in res.messages]
            assert bodies == [m.body for m in ledger.spec(key).messages]
    except BaseException:
        store.close()
        raise
    return store


def sigkill(child: Child) -> None:
    """Kill and reap; the child must have been running, with nothing failed before the kill
    (a background thread of the store that died with a traceback counts as failed)."""
    assert child.kill(), f"child exited before it was killed: {child.describe()}"
    assert not child.errors and not child.bad_lines, child.describe()
    assert "Traceback" not in child.stderr_tail(limit=1 << 30), child.describe()


def kill_child(child: Child, rng: random.Random, how: str) -> tuple[float, str]:
    """Wait for the moment ``how`` names, SIGKILL the child; (delay, phase at the kill)."""
    if how == "open":
        assert child.wait(child.opening, START_TIMEOUT_S), child.describe()
        delay = rng.uniform(0.0, 0.03)
        time.sleep(delay)
    elif how == "close":  # the child stops writing and closes the store: kill it in close()
        assert child.wait(child.closing, START_TIMEOUT_S), child.describe()
        delay = rng.uniform(0.0, 0.03)
        time.sleep(delay)
    elif how == "roll":
        assert child.wait(child.ready, START_TIMEOUT_S), child.describe()
        t0 = time.monotonic()
        child.wait(child.near_roll, rng.uniform(0.2, 1.0))
        time.sleep(rng.uniform(0.0, 0.005))
        delay = time.monotonic() - t0
    else:
        assert child.wait(child.ready, START_TIMEOUT_S), child.describe()
        delay = rng.uniform(0.05, 0.6)
        time.sleep(delay)
    phase = "running" if child.ready.is_set() else "opening"
    if child.closing.is_set():
        phase = "closed" if child.closed.is_set() else "closing"
    sigkill(child)
    return delay, phase


def summary(report: RecoveryReport) -> str:
    s = report_summary(report)
    return " ".join(f"{k}={v}" for k, v in s.items() if v not in ([], 0) or k == "clean")


def run_kill_cycles(
    mode: str, tmp_path: Path, spawn: Spawn, seed: int, iterations: int
) -> list[Verified]:
    rng = random.Random(seed)
    results: list[Verified] = []
    ledger = Ledger(seed)
    store_dir = tmp_path
    parent_seq = 0
    began = time.monotonic()
    try:
        for cycle in range(iterations):
            if cycle % CYCLES_PER_STORE == 0:
                store_dir = tmp_path / f"store-{cycle // CYCLES_PER_STORE}"
                ledger = Ledger(seed)
            round_no = cycle + 1
            how = rng.choices(["run", "open", "roll", "close"], weights=[55, 15, 18, 12])[0]
            close_after = rng.uniform(0.05, 0.4) if how == "close" else None
            child = spawn(store_dir, mode, seed, round_no, close_after=close_after)
            delay, phase = kill_child(child, rng, how)
            ledger.add_child(round_no, child.acks)
            line = (
                f"cycle {cycle} round {round_no} {mode}: kill {how}+{delay:.3f}s in {phase}, "
                f"{len(child.acks)} batches acked; child open: {child.ready_report}"
            )
            print(line)
            parent_began = time.monotonic()
            store, report = open_store(store_dir, mode)
            line = f"  parent recovery: {summary(report)}"
            print(line)
            try:
                if phase == "running":  # killed in open() it may not have marked the store yet
                    assert not report.clean, "a SIGKILLed store must not look cleanly closed"
                if phase == "closed":
                    assert report.clean and not report.cuts, "close() completed, yet unclean"
                ver = verify_store(store, ledger, rng)
                line = (
                    f"  verified {ver.records} records, {ledger.messages()} acked, "
                    f"{ver.missing_acked} acked missing, {ver.unacked_present} unacked present"
                )
                print(line)
                # SIGKILL ends the process, not the kernel: every write() it made is in the page
                # cache and reaches the file, fsynced or not. So even ASYNC_FLUSH must lose no
                # acknowledged message here (only a power loss could take an unsynced tail).
                assert ver.missing_acked == 0, f"{ver.missing_acked} acknowledged messages lost"
                parent_seq = append_after_recovery(
                    store, ledger, round_no, parent_seq, rng.randint(1, 3)
                )
                expect = Verified(
                    queues={k: cq.max_offset for k, cq in store.queues.queues.items()}
                )
                end = store.commit_log.max_offset
            finally:
                store.close()
            store = check_clean_reopen(store_dir, mode, ledger, round_no, expect, end)
            if rng.random() < 0.3:
                # Leave the store unclean, so the next child's open is a recovery (and may be
                # killed in the middle of it).
                parent_seq = append_after_recovery(store, ledger, round_no, parent_seq, 1)
                store.crash_for_test()
                print("  parent left the store unclean")
            else:
                store.close()
            results.append(ver)
            line = (
                f"  child start {child.ready_after_s:.2f}s, "
                f"parent checks {time.monotonic() - parent_began:.2f}s"
            )
            print(line)
    except BaseException:
        print(f"FAILED: replay with ORBITMQ_SEED={seed} ORBITMQ_CRASH_ITERATIONS={iterations}")
        raise
    print(f"{iterations} kill cycles in {time.monotonic() - began:.1f}s")
    return results


def test_sigkill_sync_flush(
    tmp_path: Path, spawn: Spawn, crash_seed: int, crash_iterations: int
) -> None:
    results = run_kill_cycles("sync", tmp_path, spawn, crash_seed, crash_iterations)
    assert sum(r.records for r in results) > 0, "no child ever got a message stored"


def test_sigkill_async_flush(
    tmp_path: Path, spawn: Spawn, crash_seed: int, crash_iterations: int
) -> None:
    results = run_kill_cycles("async", tmp_path, spawn, crash_seed, crash_iterations)
    missing = sum(r.missing_acked for r in results)
    print(f"ASYNC_FLUSH: {missing} acknowledged messages missing after SIGKILL")
    assert missing == 0
    assert sum(r.records for r in results) > 0, "no child ever got a message stored"


def test_sigkill_during_recovery(
    tmp_path: Path, spawn: Spawn, crash_seed: int, crash_iterations: int
) -> None:
    """Kill children while they recover a store with a long unclean tail, again and again.

    A writer builds the tail and is killed; then up to five children in a row open the store
    and are killed at a random moment within the time a recovery takes, until one finishes.
    Half of ORBITMQ_CRASH_ITERATIONS (at least 8) such recovery kills, plus the writers'.
    """
    rng = random.Random(crash_seed ^ 0x5EED)
    target = max(8, crash_iterations // 2)
    kills = 0
    recovery_kills = 0
    mid_recovery = 0
    round_no = 0
    group = 0
    parent_seq = 0
    open_s = 0.3  # how long an open() with recovery takes; refined from each that completes
    ledger = Ledger(crash_seed)
    store_dir = tmp_path
    # No periodic checkpoint in the children: the whole run since the last open is the tail
    # recovery has to scan, which makes recovery long enough to be hit.
    no_checkpoint = 600_000
    try:
        while recovery_kills < target:
            if group % 3 == 0:
                store_dir = tmp_path / f"store-{group // 3}"
                ledger = Ledger(crash_seed)
            group += 1
            mode = rng.choice(["sync", "async"])
            round_no += 1
            writer = spawn(store_dir, mode, crash_seed, round_no, checkpoint_ms=no_checkpoint)
            assert writer.wait(writer.ready, START_TIMEOUT_S), writer.describe()
            time.sleep(rng.uniform(0.3, 0.7))
            sigkill(writer)
            kills += 1
            ledger.add_child(round_no, writer.acks)
            line = f"group {group} {mode}: writer round {round_no} acked {len(writer.acks)}"
            print(line)
            for attempt in range(5):
                round_no += 1
                child = spawn(
                    store_dir, mode, crash_seed, round_no, checkpoint_ms=no_checkpoint,
                    no_append=True,
                )  # fmt: skip
                assert child.wait(child.opening, START_TIMEOUT_S), child.describe()
                # Mostly inside open(), sometimes just after it, so a recovery can finish.
                delay = rng.uniform(0.0, open_s * 1.25)
                time.sleep(delay)
                during = not child.ready.is_set()
                sigkill(child)
                kills += 1
                recovery_kills += 1
                mid_recovery += during
                line = (
                    f"  attempt {attempt}: kill +{delay:.3f}s "
                    f"{'DURING recovery' if during else 'after recovery'}; "
                    f"open took {child.open_s:.3f}s, report {child.ready_report}"
                )
                print(line)
                if child.ready_report is not None:
                    if child.ready_report["records_scanned"] > 100:  # a real recovery
                        open_s = max(0.02, child.open_s)
                    break
            else:
                open_s = min(3.0, open_s * 1.5)  # none finished: the window is too short
            store, report = open_store(store_dir, mode, no_checkpoint)
            line = f"  parent recovery: {summary(report)}"
            print(line)
            try:
                assert not report.clean
                ver = verify_store(store, ledger, rng)
                assert ver.missing_acked == 0, f"{ver.missing_acked} acknowledged messages lost"
                parent_seq = append_after_recovery(store, ledger, round_no, parent_seq, 2)
                expect = Verified(
                    queues={k: cq.max_offset for k, cq in store.queues.queues.items()}
                )
                end = store.commit_log.max_offset
            finally:
                store.close()
            check_clean_reopen(store_dir, mode, ledger, round_no, expect, end).close()
    except BaseException:
        print(f"FAILED: replay with ORBITMQ_SEED={crash_seed}")
        raise
    print(f"{kills} kills, {recovery_kills} at recovery, {mid_recovery} of them during it")
    assert mid_recovery > 0, "no kill landed during a recovery: the test did not test it"

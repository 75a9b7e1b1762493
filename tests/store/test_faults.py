"""Faults the store must survive: power cuts, damaged files at start, failing writes.

* Power cuts (``powercut.PowerCut``): only what was fsynced survives, un-fsynced pages may or
  may not. SYNC_FLUSH keeps every acknowledged message; ASYNC_FLUSH keeps a prefix of the
  history that covers at least what was fsynced; both stay readable without holes.
* Damage at rest: bit flips, truncation, zero-filled ranges, a garbled or missing checkpoint,
  a present or missing abort marker. Opening never raises, a served record always passes its
  CRC and is the one expected at its offset, damage is reported.
* Write errors (ENOSPC, EIO) from an injected FileOps: the failed append is not visible, the
  store keeps working (or fences itself after a failed fsync until it is reopened).

Randomised tests print their seed; ``ORBITMQ_SEED=<n>`` replays them.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import errno
import os
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from orbitmq.common.errors import DiskFullError, StoreClosedError, StoreError, StoreIOError
from orbitmq.common.message import Message, MessageBatch
from orbitmq.common.record import StoredMessage, check_record, decode
from orbitmq.store.checkpoint import Checkpoint
from orbitmq.store.config import FlushDiskType, StoreConfig
from orbitmq.store.message_store import GetStatus, MessageStore
from orbitmq.store.recovery import RecoveryReport
from orbitmq.store.segment import FileOps
from orbitmq.testing import small_store_config
from tests.store.powercut import CutLog, PowerCut, power_cut

SEGMENT = 80 * 1024
QUEUES = (("PA", 0), ("PA", 1), ("PB", 0))


def base_seed() -> int:
    env = os.environ.get("ORBITMQ_SEED")
    return int(env) if env else random.randrange(2**32)


# The damage tests share one seed: it builds their template stores and drives hypothesis.
MODULE_SEED = base_seed()


@pytest.fixture
def seed() -> int:
    n = base_seed()
    print(f"fault test seed: ORBITMQ_SEED={n}")
    return n


def fault_config(path: Path, **overrides: Any) -> StoreConfig:
    opts: dict[str, Any] = {
        "mapped_file_size_commit_log": SEGMENT,
        "max_message_size": 8192,
        "consume_queue_entries_per_file": 16,
        "max_hash_slot_num": 32,
        "max_index_num": 48,
        "flush_interval_commit_log_ms": 5,
        "flush_commit_log_least_pages": 1,
        "flush_interval_consume_queue_ms": 15,
        "clean_resource_interval_ms": 3_600_000,
        "sync_flush_timeout_ms": 10_000,
    }
    opts.update(overrides)
    return small_store_config(path, **opts)


def open_store(config: StoreConfig, **kwargs: Any) -> tuple[MessageStore, RecoveryReport]:
    store = MessageStore(config, disk_usage=lambda: 10.0, **kwargs)
    report = store.open()
    return store, report


# ---------------------------------------------------------------------------- the model


@dataclass(frozen=True, slots=True)
class Sent:
    seq: int  # global append order
    body: bytes
    key: str
    end: int  # CommitLog offset just past the record


@dataclass(slots=True)
class History:
    """Every message appended, per queue, in order."""

    queues: dict[tuple[str, int], list[Sent]] = field(default_factory=dict)
    seq: int = 0

    def body(self, n: int, size: int) -> bytes:
        head = f"<{n}>".encode()
        return (head + bytes((n * 7 + i) % 253 for i in range(size)))[: max(size, len(head))]

    def append(
        self, store: MessageStore, rng: random.Random, topic: str, qid: int, count: int
    ) -> None:
        sizes = [rng.choice((rng.randint(1, 200), rng.randint(1, 3000))) for _ in range(count)]
        seqs = list(range(self.seq, self.seq + count))
        self.seq += count
        bodies = [self.body(n, size) for n, size in zip(seqs, sizes, strict=True)]
        keys = [f"key{n % 23}" for n in seqs]
        msgs = [
            Message(topic, b, tags=f"t{n % 3}", keys=[k])
            for n, b, k in zip(seqs, bodies, keys, strict=True)
        ]
        result = store.put(MessageBatch.of(topic, qid, msgs))
        queue = self.queues.setdefault((topic, qid), [])
        assert result.first_queue_offset == len(queue)
        for i, n in enumerate(seqs):
            end = result.physical_offsets[i] + result.sizes[i]
            queue.append(Sent(n, bodies[i], keys[i], end))

    def truncate(self, counts: dict[tuple[str, int], int]) -> None:
        for key, queue in self.queues.items():
            del queue[counts.get(key, 0) :]


def read_queue(store: MessageStore, topic: str, qid: int) -> tuple[list[StoredMessage], list[int]]:
    """Every record from min to max offset, CRC-verified; returns (messages, skipped)."""
    out: list[StoredMessage] = []
    skipped: list[int] = []
    offset = store.min_offset(topic, qid)
    hi = store.max_offset(topic, qid)
    while offset < hi:
        res = store.get_messages(topic, qid, offset, max_count=50)
        assert res.status in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE), res.status
        for view, qoff in zip(res.messages, res.queue_offsets, strict=True):
            assert check_record(view, 0, len(view), verify_crc=True) == len(view)
            m = decode(view)
            assert (m.topic, m.queue_id, m.queue_offset) == (topic, qid, qoff)
            out.append(m)
        skipped += res.skipped
        assert res.next_begin_offset > offset
        offset = res.next_begin_offset
    return out, skipped


# ---------------------------------------------------------------------------- power cuts


def check_after_cut(
    store: MessageStore,
    history: History,
    required: dict[tuple[str, int], int],
    where: str,
) -> dict[tuple[str, int], int]:
    """Each queue holds a prefix of its history, at least ``required`` long, with no holes;
    the survivors of all queues together are a prefix of the global append order."""
    counts: dict[tuple[str, int], int] = {}
    for (topic, qid), sent in history.queues.items():
        assert store.min_offset(topic, qid) == 0, where
        msgs, skipped = read_queue(store, topic, qid)
        assert not skipped, f"{where}: {topic}/{qid} skipped {skipped}"
        assert [m.queue_offset for m in msgs] == list(range(len(msgs))), where
        assert store.max_offset(topic, qid) == len(msgs), where
        assert len(msgs) <= len(sent), f"{where}: {topic}/{qid} grew"
        for m, s in zip(msgs, sent, strict=False):
            assert m.body == s.body, f"{where}: {topic}/{qid}@{m.queue_offset} wrong bytes"
        need = required.get((topic, qid), 0)
        assert len(msgs) >= need, (
            f"{where}: {topic}/{qid} kept {len(msgs)} of {len(sent)}, {need} were durable"
        )
        counts[(topic, qid)] = len(msgs)
    kept = [s.seq for q, sent in history.queues.items() for s in sent[: counts[q]]]
    lost = [s.seq for q, sent in history.queues.items() for s in sent[counts[q] :]]
    if kept and lost:
        assert max(kept) < min(lost), f"{where}: survivors are not a prefix of the log"
    return counts


def check_keys(store: MessageStore, history: History, counts: dict[tuple[str, int], int]) -> None:
    """query_by_key finds exactly the surviving messages with the key (and nothing else)."""
    for key in ("key0", "key5", "key17"):
        for topic in ("PA", "PB"):
            want = sorted(
                s.body
                for (t, q), sent in history.queues.items()
                if t == topic
                for s in sent[: counts[(t, q)]]
                if s.key == key
            )
            got = store.query_by_key(topic, key, max_num=1000)
            for m in got:
                assert m.topic == topic and key in m.keys
            assert sorted(m.body for m in got) == want, f"{topic}/{key}"


def powercut_run(
    tmp_path: Path, seed: int, flush: FlushDiskType, *, torn: bool, strict_dirs: bool = False
) -> None:
    rng = random.Random(seed)
    config = fault_config(tmp_path / "store", flush_disk_type=flush)
    history = History()
    store: MessageStore | None = None
    with power_cut(
        config.store_path, rng.randrange(2**32), torn=torn, strict_dirs=strict_dirs
    ) as pc:
        try:
            store, _ = open_store(config)
            for round_no in range(4):
                for _ in range(rng.randint(3, 25)):
                    topic, qid = rng.choice(QUEUES)
                    history.append(store, rng, topic, qid, rng.randint(1, 10))
                    r = rng.random()
                    if r < 0.15:
                        time.sleep(rng.random() * 0.02)  # let background fsyncs happen
                    elif r < 0.2:
                        store.checkpoint()
                # Everything up to the flushed offset went through a recorded fsync.
                flushed = store.commit_log.flushed_offset
                acked_all = flush is FlushDiskType.SYNC_FLUSH
                required = {
                    q: len(sent) if acked_all else sum(1 for s in sent if s.end <= flushed)
                    for q, sent in history.queues.items()
                }
                cut: CutLog = pc.cut(store)
                store = None
                where = f"seed {seed} round {round_no}, after the cut:\n{cut}"
                store, report = open_store(config)
                assert not report.clean, where
                assert report.end_offset == store.commit_log.max_offset
                counts = check_after_cut(store, history, required, where)
                check_keys(store, history, counts)
                history.truncate(counts)
                # The store goes on: offsets continue right after the survivors.
                topic, qid = rng.choice(QUEUES)
                history.append(store, rng, topic, qid, 2)
        finally:
            if store is not None and store.is_open:
                store.close()


@pytest.mark.parametrize("flush", [FlushDiskType.SYNC_FLUSH, FlushDiskType.ASYNC_FLUSH])
@pytest.mark.parametrize("torn", [False, True], ids=["whole", "torn"])
def test_power_cut_keeps_what_was_durable(
    tmp_path: Path, seed: int, flush: FlushDiskType, torn: bool
) -> None:
    for i in range(3):
        powercut_run(tmp_path / str(i), seed + i, flush, torn=torn)


def test_power_cut_strict_posix_directories(tmp_path: Path, seed: int) -> None:
    """POSIX to the letter: a new file's name survives only a directory fsync."""
    for i, flush in enumerate(FlushDiskType):
        powercut_run(tmp_path / str(i), seed + i, flush, torn=False, strict_dirs=True)


def _produce(
    store: MessageStore,
    pc: PowerCut,
    q: tuple[str, int],
    tag: str,
    seed: int,
    stop: threading.Event,
    sent: dict[tuple[str, int], list[bytes]],
    acked: dict[tuple[str, int], int],
) -> None:
    """Put batches to ``q`` until ``stop``; a put that returned before the power went counts
    as acknowledged."""
    r = random.Random(seed)
    n = 0
    while not stop.is_set():
        bodies = [
            f"{q}#{tag}/{n + i}".encode().ljust(r.randint(8, 2500), b"*")
            for i in range(r.randint(1, 4))
        ]
        n += len(bodies)
        sent[q] += bodies
        try:
            store.put(MessageBatch.of(q[0], q[1], bodies))
        except StoreError:
            return
        if not pc.frozen:
            acked[q] = len(sent[q])


@pytest.mark.parametrize("torn", [False, True], ids=["whole", "torn"])
def test_power_cut_during_concurrent_sync_puts(tmp_path: Path, seed: int, torn: bool) -> None:
    """SYNC_FLUSH with producers in flight (group commit): the power goes at a random moment;
    every put that had returned by then survives, byte for byte."""
    rng = random.Random(seed)
    config = fault_config(tmp_path / "store", flush_disk_type=FlushDiskType.SYNC_FLUSH)
    queues = [("CC", q) for q in range(4)]
    with power_cut(config.store_path, rng.randrange(2**32), torn=torn) as pc:
        store, _ = open_store(config)
        total_acked = 0
        try:
            for round_no in range(3):
                sent: dict[tuple[str, int], list[bytes]] = {q: [] for q in queues}
                acked: dict[tuple[str, int], int] = dict.fromkeys(queues, 0)
                base = {q: store.max_offset(*q) for q in queues}
                stop = threading.Event()

                threads = [
                    threading.Thread(
                        target=_produce,
                        args=(store, pc, q, f"{round_no}", rng.randrange(2**32), stop, sent, acked),
                    )
                    for q in queues
                ]
                for t in threads:
                    t.start()
                time.sleep(0.05 + rng.random() * 0.1)
                pc.freeze()
                stop.set()
                for t in threads:
                    t.join(30)
                    assert not t.is_alive()
                cut = pc.cut(store)
                store, report = open_store(config)
                assert not report.clean
                for q in queues:
                    msgs, skipped = read_queue(store, *q)
                    assert not skipped
                    got = [m.body for m in msgs[base[q] :]]
                    assert got == sent[q][: len(got)], f"round {round_no} {q}:\n{cut}"
                    assert len(got) >= acked[q], f"round {round_no} {q} lost acks:\n{cut}"
                total_acked += sum(acked.values())
            assert total_acked > 0, "no put was acknowledged: the test proved nothing"
        finally:
            if store.is_open:
                store.close()


# ---------------------------------------------------------------------------- damage at rest

DAMAGE_QUEUES = (("DA", 0), ("DB", 0), ("DA", 1))  # DA/0 and DB/0 share a queue id
DAMAGE_TOPICS = ("DA", "DB")
DAMAGE_KEYS = tuple(f"key{i}" for i in range(17))


@dataclass(frozen=True, slots=True)
class Rec:
    topic: str
    qid: int
    qoff: int
    phy: int
    size: int
    body: bytes
    key: str


@dataclass(slots=True, repr=False)
class Template:
    """A store on disk (closed cleanly or crashed) and what it must hold."""

    path: Path
    config: StoreConfig
    clean: bool
    queues: dict[tuple[str, int], list[Rec]]
    by_phy: list[Rec]
    fillers: list[tuple[int, int]]  # (phy, size) of end-of-segment fillers
    end: int
    scan_from: int  # where an unclean start scans from (the checkpoint's safe offset)
    log: bytes = b""  # the CommitLog's bytes, all segments end to end

    def __repr__(self) -> str:
        return f"Template({'clean' if self.clean else 'crashed'}, end={self.end})"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # hypothesis prints examples with it
        p.text(repr(self))

    def copy(self, dst: Path) -> StoreConfig:
        shutil.copytree(self.path, dst)
        return dataclasses.replace(self.config, store_path=dst)

    def files(self, sub: str) -> list[Path]:
        return sorted(p for p in (self.path / sub).rglob("*") if p.is_file())

    def units_changed(self, positions: Iterator[int] | list[int]) -> set[tuple[str, int]]:
        return {u for u in map(self.unit_at, positions) if u is not None}

    def units_zeroed(self, lo: int, hi: int) -> set[tuple[str, int]]:
        """Units whose bytes change when the CommitLog range [lo, hi) is zeroed."""
        raw = np.frombuffer(self.log, dtype=np.uint8)
        hi = min(hi, len(raw))
        changed = (np.flatnonzero(raw[lo:hi]) + lo).tolist() if hi > lo else []
        units: set[tuple[str, int]] = set()
        i = 0
        while i < len(changed):  # one lookup per unit, not per byte
            u = self.unit_at(changed[i])
            if u is None:
                i += 1
                continue
            units.add(u)
            stop = u[1] + (8 if u[0] == "filler" else self.size_at(u[1]))
            i = bisect.bisect_left(changed, stop, i)
        return units

    def size_at(self, phy: int) -> int:
        return self.by_phy[bisect.bisect_left([r.phy for r in self.by_phy], phy)].size

    def unit_at(self, x: int) -> tuple[str, int] | None:
        """What the CommitLog byte ``x`` belongs to: ("record", phy), ("filler", phy) for a
        filler's header, or None (filler padding, or past the end)."""
        i = bisect.bisect_right([r.phy for r in self.by_phy], x) - 1
        if i >= 0 and x < self.by_phy[i].phy + self.by_phy[i].size:
            return ("record", self.by_phy[i].phy)
        for phy, _size in self.fillers:
            if phy <= x < phy + 8:
                return ("filler", phy)
        return None


def build_template(path: Path, *, clean: bool, seed: int) -> Template:
    rng = random.Random(seed)
    config = fault_config(
        path,
        flush_interval_consume_queue_ms=3_600_000,  # checkpoints only when the test says
        max_index_num=40,
    )
    store, _ = open_store(config)
    queues: dict[tuple[str, int], list[Rec]] = {q: [] for q in DAMAGE_QUEUES}
    n = 0

    def write(batches: int) -> None:
        nonlocal n
        for _ in range(batches):
            topic, qid = rng.choice(DAMAGE_QUEUES)
            count = rng.randint(1, 8)
            # DA/0 and DB/0 get equal sizes sometimes, so entries of one could pass for the other.
            sizes = [rng.choice((300, rng.randint(1, 1500))) for _ in range(count)]
            bodies = [
                f"{topic}/{qid}/{n + i}|".encode().ljust(s, b"~")[:s] for i, s in enumerate(sizes)
            ]
            keys = [DAMAGE_KEYS[(n + i) % len(DAMAGE_KEYS)] for i in range(count)]
            msgs = [
                Message(topic, b, tags="t", keys=[k]) for b, k in zip(bodies, keys, strict=True)
            ]
            r = store.put(MessageBatch.of(topic, qid, msgs))
            for i in range(count):
                queues[(topic, qid)].append(
                    Rec(topic, qid, r.first_queue_offset + i, r.physical_offsets[i], r.sizes[i],
                        bodies[i], keys[i])
                )  # fmt: skip
            n += count

    write(75)
    assert store.wait_for_dispatch()
    store.checkpoint()
    scan_from = store.dispatcher.reput_offset
    write(25)
    end = store.commit_log.max_offset
    if clean:
        store.close()
        scan_from = end
    else:
        store.crash_for_test()
    by_phy = sorted((r for q in queues.values() for r in q), key=lambda r: r.phy)
    fillers = []
    for i, a in enumerate(by_phy):
        stop = a.phy + a.size
        nxt = by_phy[i + 1].phy if i + 1 < len(by_phy) else end
        if nxt != stop and stop % SEGMENT:
            fillers.append((stop, SEGMENT - stop % SEGMENT))
    assert end > 2 * SEGMENT, "the template should span several segments"
    log = b"".join(p.read_bytes() for p in sorted((path / "commitlog").iterdir()))
    assert len(log) % SEGMENT == 0 and sorted((path / "commitlog").iterdir())[0].name == "0" * 20
    return Template(path, config, clean, queues, by_phy, fillers, end, scan_from, log)


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Template]:
    root = tmp_path_factory.mktemp("templates")
    n = MODULE_SEED
    print(f"damage test seed: ORBITMQ_SEED={n}")
    return {
        "clean": build_template(root / "clean", clean=True, seed=n),
        "crash": build_template(root / "crash", clean=False, seed=n + 1),
    }


@dataclass(slots=True)
class Seen:
    served: dict[tuple[str, int], set[int]]
    skipped: dict[tuple[str, int], set[int]]
    bounds: dict[tuple[str, int], tuple[int, int]]


Silent = dict[tuple[str, int], set[int]]


def verify_damaged(
    store: MessageStore, report: RecoveryReport, tpl: Template, silent_ok: Silent | None = None
) -> Seen:
    """What must hold whatever the damage: nothing wrong is served, every offset between min
    and max is served or reported skipped, loss is reported (except ``silent_ok``: damage that
    looks exactly like data never written), and the store keeps working."""
    seen = Seen({}, {}, {})
    for (topic, qid), recs in tpl.queues.items():
        lo, hi = store.min_offset(topic, qid), store.max_offset(topic, qid)
        served: set[int] = set()
        skipped: set[int] = set()
        offset = lo
        while offset < hi:
            res = store.get_messages(topic, qid, offset, max_count=13)
            for view, qoff in zip(res.messages, res.queue_offsets, strict=True):
                check_record(view, 0, len(view), verify_crc=True)  # raises if damaged
                m = decode(view)
                assert (m.topic, m.queue_id, m.queue_offset) == (topic, qid, qoff)
                assert qoff < len(recs) and m.body == recs[qoff].body, f"{topic}/{qid}@{qoff}"
                served.add(qoff)
            skipped |= set(res.skipped)
            assert res.next_begin_offset > offset
            offset = res.next_begin_offset
        assert not served & skipped
        assert served | skipped == set(range(lo, hi)), f"{topic}/{qid}: silent hole"
        seen.served[(topic, qid)] = served
        seen.skipped[(topic, qid)] = skipped
        seen.bounds[(topic, qid)] = (lo, hi)
    for q, recs in tpl.queues.items():
        lost = {r.qoff for r in recs} - seen.served[q] - (silent_ok or {}).get(q, set())
        if lost:
            assert seen.skipped[q] or report.cuts or report.problems, f"{q}: silent loss {lost}"
    for topic in DAMAGE_TOPICS:
        for key in DAMAGE_KEYS:
            for m in store.query_by_key(topic, key, max_num=200):
                assert m.topic == topic and key in m.keys
                assert m.body == tpl.queues[(topic, m.queue_id)][m.queue_offset].body
    for rec in tpl.by_phy[::5]:
        got = store.get_message(rec.phy)
        assert got is None or (got.topic, got.body) == (rec.topic, rec.body)
    # The store goes on: an append continues each queue right after its max offset.
    for topic, qid in tpl.queues:
        before = store.max_offset(topic, qid)
        r = store.put(MessageBatch.of(topic, qid, [b"after-damage"]))
        assert r.first_queue_offset == before
    assert store.wait_for_dispatch()
    for topic, qid in tpl.queues:
        res = store.get_messages(topic, qid, store.max_offset(topic, qid) - 1)
        assert [decode(v).body for v in res.messages] == [b"after-damage"]
    return seen


@contextlib.contextmanager
def damaged_store(
    tpl: Template, damage: Callable[[Path], None]
) -> Iterator[tuple[MessageStore, RecoveryReport]]:
    with tempfile.TemporaryDirectory(prefix="orbitmq-damage-") as d:
        config = tpl.copy(Path(d) / "store")
        damage(config.store_path)
        store, report = open_store(config)  # must not raise, whatever the damage
        try:
            yield store, report
        finally:
            store.close()


def flip(path: Path, at: int, mask: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        old = f.read(1)[0]
        f.seek(at)
        f.write(bytes([old ^ mask]))


def commitlog_file(root: Path, x: int) -> tuple[Path, int]:
    start = x - x % SEGMENT
    return root / "commitlog" / f"{start:020d}", x - start


DAMAGE_SETTINGS = settings(
    max_examples=int(os.environ.get("ORBITMQ_DAMAGE_EXAMPLES", "12")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


REGION = st.sampled_from(["old", "tail", "anywhere"])
FLIPS = st.lists(
    st.tuples(REGION, st.integers(0, 2**24), st.integers(1, 255)), min_size=1, max_size=4
)


def place(region: str, x: int, lo: int, mid: int, hi: int) -> int:
    """A position in [lo, mid) ("old"), [mid, hi) ("tail") or [lo, hi) ("anywhere")."""
    if region == "old" and mid > lo:
        return lo + x % (mid - lo)
    if region == "tail" and hi > mid:
        return mid + x % (hi - mid)
    return lo + x % (hi - lo)


def check_log_damage(
    tpl: Template,
    damage: Callable[[Path], None],
    units: set[tuple[str, int]],
    zeroed: tuple[int, int] | None = None,
) -> None:
    """Open after CommitLog damage that changed ``units``. Damaged records before the scan
    start are skipped one by one on read; the first damaged unit in the scanned tail ends the
    log. ``zeroed``: the damage zero-filled [lo, hi) (else it left non-zero garbage)."""
    in_tail = [phy for _kind, phy in units if phy >= tpl.scan_from]
    cut_at = min(in_tail, default=tpl.end)
    broken = {phy for kind, phy in units if kind == "record"}
    silent: Silent = {}
    if zeroed is not None and cut_at < tpl.end:
        lo, hi = zeroed
        if not any(tpl.log[cut_at:lo]) and not any(tpl.log[hi : tpl.end]):
            # Nothing but zeros from the cut on: just like a tail that was never written.
            silent = {
                q: {r.qoff for r in recs if r.phy >= cut_at} for q, recs in tpl.queues.items()
            }
    with damaged_store(tpl, damage) as (store, report):
        assert report.scanned_from == tpl.scan_from or report.clean
        assert report.end_offset == cut_at
        if cut_at < tpl.end and not silent:
            assert report.cuts and report.cuts[0].offset == cut_at % SEGMENT
        seen = verify_damaged(store, report, tpl, silent)
        for q, recs in tpl.queues.items():
            want_served = {r.qoff for r in recs if r.phy < cut_at and r.phy not in broken}
            want_skipped = {r.qoff for r in recs if r.phy < cut_at and r.phy in broken}
            assert seen.served[q] == want_served, q
            assert seen.skipped[q] == want_skipped, q


@pytest.mark.parametrize("kind", ["clean", "crash"])
@DAMAGE_SETTINGS
@hypothesis_seed(MODULE_SEED)
@given(spec=FLIPS)
def test_commitlog_bit_flips(
    templates: dict[str, Template], kind: str, spec: list[tuple[str, int, int]]
) -> None:
    """Bit flips anywhere in the CommitLog: in old data, in the scanned tail, past the end."""
    tpl = templates[kind]
    span = len(tpl.log)
    hi = min(span, tpl.end + 64)
    flips = {place(region, x, 0, tpl.scan_from, hi if region != "anywhere" else span): mask
             for region, x, mask in spec}  # fmt: skip

    def damage(root: Path) -> None:
        for x, mask in flips.items():
            flip(*commitlog_file(root, x), mask)

    check_log_damage(tpl, damage, tpl.units_changed(list(flips)))


@pytest.mark.parametrize("kind", ["clean", "crash"])
@DAMAGE_SETTINGS
@hypothesis_seed(MODULE_SEED)
@given(region=REGION, x=st.integers(0, 2**24), length=st.integers(1, 9000))
def test_commitlog_zero_filled_range(
    templates: dict[str, Template], kind: str, region: str, x: int, length: int
) -> None:
    tpl = templates[kind]
    lo = place(region, x, 0, tpl.scan_from, tpl.end)
    hi = min(lo + length, len(tpl.log))

    def damage(root: Path) -> None:
        pos = lo
        while pos < hi:  # the range may cross into the next segment file
            path, at = commitlog_file(root, pos)
            n = min(hi - pos, SEGMENT - at)
            with open(path, "r+b") as f:
                f.seek(at)
                f.write(bytes(n))
            pos += n

    check_log_damage(tpl, damage, tpl.units_zeroed(lo, hi), (lo, hi))


@pytest.mark.parametrize("kind", ["clean", "crash"])
@DAMAGE_SETTINGS
@hypothesis_seed(MODULE_SEED)
@given(seg=st.integers(0, 100), length=st.integers(0, SEGMENT - 1))
def test_commitlog_truncated_segment(
    templates: dict[str, Template], kind: str, seg: int, length: int
) -> None:
    """A segment cut short: opened at its full size again, the lost part reads as zeros."""
    tpl = templates[kind]
    seg %= len(tpl.log) // SEGMENT
    start = seg * SEGMENT

    def damage(root: Path) -> None:
        os.truncate(root / "commitlog" / f"{start:020d}", length)

    units = tpl.units_zeroed(start + length, start + SEGMENT)
    check_log_damage(tpl, damage, units, (start + length, start + SEGMENT))
    with damaged_store(tpl, damage) as (_store, report):
        assert not report.clean and any("resized" in p for p in report.problems)


@pytest.mark.parametrize("kind", ["clean", "crash"])
@DAMAGE_SETTINGS
@hypothesis_seed(MODULE_SEED)
@given(
    picks=st.lists(
        st.tuples(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(1, 255)),
        min_size=1,
        max_size=4,
    ),
    zero=st.none() | st.tuples(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(1, 200)),
)
def test_consume_queue_damage(
    templates: dict[str, Template],
    kind: str,
    picks: list[tuple[int, int, int]],
    zero: tuple[int, int, int] | None,
) -> None:
    """Damaged ConsumeQueue entries never serve a wrong record, and loss is reported."""
    tpl = templates[kind]
    files = [p.relative_to(tpl.path) for p in tpl.files("consumequeue")]
    silent: Silent = {}

    def damage(root: Path) -> None:
        for f, at, mask in picks:
            path = root / files[f % len(files)]
            flip(path, at % path.stat().st_size, mask)
        if zero is not None:
            f, at, n = zero
            path = root / files[f % len(files)]
            at %= path.stat().st_size
            with open(path, "r+b") as fh:
                fh.seek(at)
                fh.write(bytes(min(n, path.stat().st_size - at)))
        silent.update(zeroed_tails(root, tpl))

    with damaged_store(tpl, damage) as (store, report):
        verify_damaged(store, report, tpl, silent)


def zeroed_tails(root: Path, tpl: Template) -> Silent:
    """Per queue, the last entries if they are now all zeros: that looks exactly like entries
    never written, and a clean start trusts the ConsumeQueue's end."""
    out: Silent = {}
    for (topic, qid), recs in tpl.queues.items():
        qdir = root / "consumequeue" / topic / str(qid)
        raw = b"".join(p.read_bytes() for p in sorted(qdir.iterdir()))
        gone = out.setdefault((topic, qid), set())
        for i in range(len(recs) - 1, -1, -1):
            if any(raw[i * 20 : i * 20 + 20]):
                break
            gone.add(i)
    return out


@pytest.mark.parametrize("kind", ["clean", "crash"])
@DAMAGE_SETTINGS
@hypothesis_seed(MODULE_SEED)
@given(
    flips=st.lists(
        st.tuples(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(1, 255)),
        min_size=1,
        max_size=60,
    ),
    truncate=st.none() | st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)),
)
def test_index_damage(
    templates: dict[str, Template],
    kind: str,
    flips: list[tuple[int, int, int]],
    truncate: tuple[int, int] | None,
) -> None:
    """Damaged index files: queries never raise and never return a message without the key."""
    tpl = templates[kind]
    files = [p.relative_to(tpl.path) for p in tpl.files("index")]
    assert len(files) > 1

    def damage(root: Path) -> None:
        for f, at, mask in flips:
            path = root / files[f % len(files)]
            flip(path, at % path.stat().st_size, mask)
        if truncate is not None:
            path = root / files[truncate[0] % len(files)]
            os.truncate(path, truncate[1] % path.stat().st_size)

    with damaged_store(tpl, damage) as (store, report):
        seen = verify_damaged(store, report, tpl)
        for q, recs in tpl.queues.items():  # the index is only a hint: reads are untouched
            assert seen.served[q] == {r.qoff for r in recs}


@pytest.mark.parametrize("kind", ["clean", "crash"])
@pytest.mark.parametrize("checkpoint", ["keep", "delete", "garble", "flip", "empty"])
@pytest.mark.parametrize("abort", ["as-left", "delete", "create"])
def test_checkpoint_and_abort_marker_damage(
    templates: dict[str, Template], kind: str, checkpoint: str, abort: str, seed: int
) -> None:
    """Without a trustworthy checkpoint the store scans from the oldest segment; either way
    every record is served."""
    tpl = templates[kind]
    rng = random.Random(seed)

    def damage(root: Path) -> None:
        cp = root / "checkpoint"
        if checkpoint == "delete":
            cp.unlink()
        elif checkpoint == "garble":
            cp.write_bytes(rng.randbytes(rng.choice((52, rng.randint(1, 100)))))
        elif checkpoint == "flip":
            flip(cp, rng.randrange(cp.stat().st_size), 1 << rng.randrange(8))
        elif checkpoint == "empty":
            cp.write_bytes(b"")
        if abort == "delete":
            (root / "abort").unlink(missing_ok=True)
        elif abort == "create":
            (root / "abort").touch()

    with damaged_store(tpl, damage) as (store, report):
        trusted = checkpoint == "keep"
        clean = trusted and tpl.clean and abort != "create"
        assert report.clean == clean
        if not trusted:
            assert report.scanned_from == 0
        seen = verify_damaged(store, report, tpl)
        for q, recs in tpl.queues.items():
            assert seen.served[q] == {r.qoff for r in recs}
            assert not seen.skipped[q]


def test_consume_queue_entry_pointing_at_another_topic(tmp_path: Path) -> None:
    """A damaged entry of DA/0 that points at DB/0's record with the same queue id, queue
    offset and size must not serve DB's message as DA's."""
    config = fault_config(tmp_path / "store")
    store, _ = open_store(config)
    a = store.put(MessageBatch.of("DA", 0, [b"a" * 300 for _ in range(3)]))
    b = store.put(MessageBatch.of("DB", 0, [b"b" * 300 for _ in range(3)]))
    store.close()
    cq = config.store_path / "consumequeue" / "DA" / "0" / ("0" * 20)
    with open(cq, "r+b") as f:
        f.seek(1 * 20)
        f.write(b.physical_offsets[1].to_bytes(8, "big"))
    store, _report = open_store(config)
    try:
        res = store.get_messages("DA", 0, 0, max_count=10)
        served = [(decode(v).topic, decode(v).body[:1]) for v in res.messages]
        assert ("DB", b"b") not in served, "served another topic's message"
        assert res.queue_offsets == [0, 2] and res.skipped == [1]
        assert a.physical_offsets[1] != b.physical_offsets[1]
    finally:
        store.close()


@pytest.mark.parametrize(
    "entry",
    [
        (SEGMENT - 10, 10),  # a tiny "record" at the very end of a segment
        (SEGMENT - 1, 1),
        (2 * SEGMENT - 30, 30),
        (-5, 300),
        (10**15, 300),
        (0, 2**31 - 1),
        (0, -300),
        (5, 300),  # inside a record
    ],
)
def test_garbled_consume_queue_entry_is_skipped(tmp_path: Path, entry: tuple[int, int]) -> None:
    """Entries pointing anywhere, with any size: reads skip them and never raise."""
    config = fault_config(tmp_path / "store")
    store, _ = open_store(config)
    for i in range(60):  # two segments' worth
        store.put(MessageBatch.of("DA", 0, [bytes([65 + i % 26]) * 2900]))
    store.close()
    cq = config.store_path / "consumequeue" / "DA" / "0" / ("0" * 20)
    with open(cq, "r+b") as f:
        f.seek(3 * 20)
        f.write(entry[0].to_bytes(8, "big", signed=True) + entry[1].to_bytes(4, "big", signed=True))
    store, _report = open_store(config)
    try:
        for start in (0, 3):
            res = store.get_messages("DA", 0, start, max_count=8)
            assert res.skipped == [3]
            assert res.queue_offsets == [o for o in range(start, res.next_begin_offset) if o != 3]
            assert len(res.queue_offsets) >= 7
        assert store.max_offset("DA", 0) == 60 and store.min_offset("DA", 0) == 0
    finally:
        store.close()


# Not ("zero", 59): a zeroed last entry looks exactly like one not written yet, and a clean
# start trusts the ConsumeQueue's end (only a scan of the CommitLog could tell).
@pytest.mark.parametrize(
    ("how", "which"),
    [(h, w) for h in ("zero", "negative-size", "negative-phy") for w in (0, 5, 15, 16, 40, 59)
     if (h, w) != ("zero", 59)],
)  # fmt: skip
def test_damaged_consume_queue_entry_is_reported_not_dropped(
    tmp_path: Path, which: int, how: str
) -> None:
    """One damaged entry (first, middle, last of a file, last of the queue): the queue keeps
    its bounds, the entry is reported as skipped, every other message is served, and new
    messages never reuse an offset of an old one."""
    config = fault_config(tmp_path / "store")
    store, _ = open_store(config)
    store.put(MessageBatch.of("DA", 0, [f"m{i}".encode() for i in range(60)]))
    store.close()
    file_no, slot = divmod(which, 16)
    cq = config.store_path / "consumequeue" / "DA" / "0" / f"{file_no * 16 * 20:020d}"
    with open(cq, "r+b") as f:
        f.seek(slot * 20)
        raw = bytearray(f.read(20))
        if how == "zero":
            raw[:] = bytes(20)
        elif how == "negative-size":
            raw[8] |= 0x80
        else:
            raw[0] |= 0x80
        f.seek(slot * 20)
        f.write(raw)
    store, report = open_store(config)
    try:
        assert (store.min_offset("DA", 0), store.max_offset("DA", 0)) == (0, 60), report
        res = store.get_messages("DA", 0, 0, max_count=100)
        assert res.skipped == [which]
        assert [decode(v).body for v in res.messages] == [
            f"m{i}".encode() for i in range(60) if i != which
        ]
        assert store.put(MessageBatch.of("DA", 0, [b"new"])).first_queue_offset == 60
    finally:
        store.close()


# ---------------------------------------------------------------------------- write errors


@dataclass(slots=True)
class Fault:
    err: int
    where: str  # only files whose path contains this
    skip: int  # let this many matching calls through first
    times: int  # then fail this many
    partial: bool  # a failing pwrite writes the first half of its data first


class FaultyFs(FileOps):
    """FileOps that fails chosen calls: ``arm(op, errno, ...)`` makes calls of ``op``
    ("pwrite", "allocate", "reserve", "truncate", "fdatasync") on matching files raise
    OSError(errno)."""

    def __init__(self) -> None:
        self.armed: dict[str, Fault] = {}
        self.failures = 0

    def arm(
        self,
        op: str,
        err: int,
        where: str = "/commitlog/",
        *,
        skip: int = 0,
        times: int = 1,
        partial: bool = False,
    ) -> None:
        self.armed[op] = Fault(err, where, skip, times, partial)

    def clear(self) -> None:
        self.armed.clear()

    def _fault(self, op: str, fd: int) -> Fault | None:
        plan = self.armed.get(op)
        if plan is None or plan.where not in os.readlink(f"/proc/self/fd/{fd}"):
            return None
        if plan.skip > 0:
            plan.skip -= 1
            return None
        plan.times -= 1
        if plan.times <= 0:
            del self.armed[op]
        self.failures += 1
        return plan

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        fault = self._fault("pwrite", fd)
        if fault is not None:
            if fault.partial:
                super().pwrite(fd, memoryview(data)[: len(data) // 2], offset)
            raise OSError(fault.err, os.strerror(fault.err))
        super().pwrite(fd, data, offset)

    def allocate(self, fd: int, size: int) -> None:
        fault = self._fault("allocate", fd)
        if fault is not None:
            raise OSError(fault.err, os.strerror(fault.err))
        super().allocate(fd, size)

    def fdatasync(self, fd: int) -> None:
        fault = self._fault("fdatasync", fd)
        if fault is not None:
            raise OSError(fault.err, os.strerror(fault.err))
        super().fdatasync(fd)

    def reserve(self, fd: int, offset: int, length: int) -> None:
        fault = self._fault("reserve", fd)
        if fault is not None:
            raise OSError(fault.err, os.strerror(fault.err))
        super().reserve(fd, offset, length)

    def truncate(self, fd: int, size: int) -> None:
        fault = self._fault("truncate", fd)
        if fault is not None:
            raise OSError(fault.err, os.strerror(fault.err))
        super().truncate(fd, size)


ERROR_FOR = {errno.ENOSPC: DiskFullError, errno.EIO: StoreIOError}


class Tracker:
    """A store plus what each queue must hold."""

    def __init__(self, config: StoreConfig, fs: FileOps | None = None) -> None:
        self.config = config
        self.fs = fs
        self.want: dict[tuple[str, int], list[bytes]] = {}
        self.n = 0
        self.store, self.report = open_store(config, fs=fs)

    def batch(self, topic: str, qid: int, count: int, size: int = 700) -> MessageBatch:
        bodies = [f"{topic}/{qid}#{self.n + i}".encode().ljust(size, b".") for i in range(count)]
        self.n += count
        return MessageBatch.of(topic, qid, bodies)

    def put(self, topic: str, qid: int, count: int, size: int = 700) -> None:
        batch = self.batch(topic, qid, count, size)
        queue = self.want.setdefault((topic, qid), [])
        r = self.store.put(batch)
        assert r.first_queue_offset == len(queue), "queue offsets must stay contiguous"
        queue += batch.bodies

    def check(self) -> None:
        assert self.store.wait_for_dispatch()
        for (topic, qid), bodies in self.want.items():
            msgs, skipped = read_queue(self.store, topic, qid)
            assert not skipped
            assert self.store.min_offset(topic, qid) == 0
            assert [m.body for m in msgs] == bodies, f"{topic}/{qid}"

    def reopen(self, *, crash: bool) -> RecoveryReport:
        if crash:
            self.store.crash_for_test()
        else:
            self.store.close()
        self.store, self.report = open_store(self.config, fs=self.fs)
        return self.report


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EIO], ids=["ENOSPC", "EIO"])
@pytest.mark.parametrize(
    "fault",
    ["pwrite", "pwrite-partial", "pwrite-second-segment", "allocate-at-roll"],
)
@pytest.mark.parametrize("after", ["go-on", "crash", "close"])
def test_failed_append_is_invisible(tmp_path: Path, err: int, fault: str, after: str) -> None:
    """A failed append raises the store's error, nothing of it becomes readable, earlier
    messages stay readable, and once the fault clears appends continue the queue offsets."""
    fs = FaultyFs()
    t = Tracker(fault_config(tmp_path / "store"), fs)
    try:
        t.put("W", 0, 20)
        t.put("W", 1, 5)
        if fault in ("pwrite-second-segment", "allocate-at-roll"):
            # Fill the segment until the next batch must roll into a new one.
            while (room := SEGMENT - t.store.commit_log.max_offset % SEGMENT) > 3000:
                t.put("W", 0, 1, size=max(1, min(2500, room - 3100)))
        segments_before = sorted(os.listdir(t.config.store_path / "commitlog"))
        end_before = t.store.commit_log.max_offset
        op = "allocate" if fault == "allocate-at-roll" else "pwrite"
        # "second-segment": the batch's first chunk lands in the old segment, the write to
        # the new one fails.
        skip = 1 if fault == "pwrite-second-segment" else 0
        fs.arm(op, err, skip=skip, partial=fault == "pwrite-partial")
        failed = t.batch("W", 0, 6, size=900)
        with pytest.raises(ERROR_FOR[err]):
            t.store.append(failed)
        assert fs.failures == 1
        fs.clear()
        assert t.store.commit_log.max_offset == end_before
        if fault == "allocate-at-roll":
            assert sorted(os.listdir(t.config.store_path / "commitlog")) == segments_before
        t.check()  # the failed batch is not readable, the rest is
        if after == "crash":
            t.reopen(crash=True)
            t.check()
        elif after == "close":
            t.reopen(crash=False)
            t.check()
        t.put("W", 0, 3)
        t.put("W", 1, 2)
        t.check()
        t.reopen(crash=True)
        t.check()
        for (topic, qid), bodies in t.want.items():
            assert t.store.max_offset(topic, qid) == len(bodies)
        assert not set(failed.bodies) & {b for q in t.want.values() for b in q}
    finally:
        if t.store.is_open:
            t.store.close()


@pytest.mark.parametrize("after", ["crash", "close"])
def test_fsync_failure_in_sync_flush_fences_until_reopened(tmp_path: Path, after: str) -> None:
    """SYNC_FLUSH: a failed fsync fails the put and fences writes (the kernel may have dropped
    the dirty pages, so nothing later can be acknowledged). Reopening recovers, and every
    message acknowledged before is intact."""
    fs = FaultyFs()
    t = Tracker(fault_config(tmp_path / "store", flush_disk_type=FlushDiskType.SYNC_FLUSH), fs)
    try:
        t.put("S", 0, 10)
        t.put("S", 1, 4)
        fs.arm("fdatasync", errno.EIO)
        doubtful = t.batch("S", 0, 3)
        vouched = t.store.commit_log.max_offset
        with pytest.raises(StoreError) as failed:
            t.store.put(doubtful)
        assert not isinstance(failed.value, StoreClosedError)
        fs.clear()
        time.sleep(0.1)  # background checkpoints run meanwhile (every 15 ms)
        cp = Checkpoint.load(t.config.store_path / "checkpoint")
        if cp is not None:
            assert cp.dispatch_safe_offset <= vouched
            assert cp.commit_log_flushed <= vouched, "a retried fsync cannot vouch for the data"
        assert t.store.commit_log.flushed_offset <= vouched
        for _ in range(2):
            with pytest.raises(StoreClosedError):
                t.store.put(t.batch("S", 1, 1))
        with pytest.raises(StoreClosedError):
            t.store.append(t.batch("S", 0, 1))
        assert t.store.wait_for_dispatch()
        for (topic, qid), bodies in t.want.items():  # reads still work while fenced
            msgs, _ = read_queue(t.store, topic, qid)
            assert [m.body for m in msgs][: len(bodies)] == bodies
        report = t.reopen(crash=after == "crash")
        assert not report.clean, "a store fenced by a failed fsync must not claim a clean stop"
        # The doubtful batch was never acknowledged: it may or may not be there, but whole.
        msgs, skipped = read_queue(t.store, "S", 0)
        assert not skipped
        extra = [m.body for m in msgs][len(t.want[("S", 0)]) :]
        assert extra in ([], doubtful.bodies)
        t.want[("S", 0)] += extra
        t.check()
        t.put("S", 0, 2)
        t.put("S", 1, 2)
        t.check()
    finally:
        if t.store.is_open:
            t.store.close()


def test_fsync_failure_in_async_flush_fences_writes(tmp_path: Path) -> None:
    """ASYNC_FLUSH: the background fsync fails; later appends are refused, reopening recovers."""
    fs = FaultyFs()
    t = Tracker(fault_config(tmp_path / "store"), fs)
    try:
        t.put("A", 0, 10)
        fs.arm("fdatasync", errno.EIO)
        t.put("A", 0, 3)  # acknowledged at once in ASYNC_FLUSH; the flusher then fails
        deadline = time.monotonic() + 10
        while t.store.commit_log.fenced is None and time.monotonic() < deadline:
            time.sleep(0.005)
        assert t.store.commit_log.fenced, "the failed background fsync was not noticed"
        with pytest.raises(StoreClosedError):
            t.store.append(t.batch("A", 0, 1))
        t.reopen(crash=True)
        t.check()  # an in-process crash keeps the page cache: nothing is lost
        t.put("A", 0, 1)
        t.check()
    finally:
        if t.store.is_open:
            t.store.close()


def test_failed_undo_of_a_failed_append_fences_writes(tmp_path: Path) -> None:
    """If even zeroing the failed append's bytes fails, the store refuses further appends."""
    fs = FaultyFs()
    t = Tracker(fault_config(tmp_path / "store"), fs)
    try:
        t.put("U", 0, 5)
        fs.arm("pwrite", errno.EIO, times=2, partial=True)
        with pytest.raises(StoreIOError):
            t.store.append(t.batch("U", 0, 4))
        fs.clear()
        with pytest.raises(StoreClosedError):
            t.store.append(t.batch("U", 0, 1))
        t.check()
        t.reopen(crash=True)
        msgs, skipped = read_queue(t.store, "U", 0)
        assert not skipped and [m.body for m in msgs][:5] == t.want[("U", 0)]
    finally:
        if t.store.is_open:
            t.store.close()


def test_consume_queue_write_failure_is_repaired_by_reopening(tmp_path: Path) -> None:
    """A failed ConsumeQueue write stops dispatch (reads do not pretend); reopening rebuilds."""
    fs = FaultyFs()
    t = Tracker(fault_config(tmp_path / "store"), fs)
    try:
        t.put("C", 0, 5)
        t.check()
        fs.arm("pwrite", errno.EIO, where="/consumequeue/")
        t.put("C", 0, 5)
        assert not t.store.wait_for_dispatch(5.0)
        fs.clear()
        t.reopen(crash=True)
        t.check()
    finally:
        if t.store.is_open:
            t.store.close()


@pytest.mark.parametrize("kind", ["clean", "crash"])
def test_consume_queue_file_missing_between_others(
    templates: dict[str, Template], kind: str, seed: int
) -> None:
    """A ConsumeQueue file gone from the middle of a queue: its entries are reported as
    skipped (or rebuilt by recovery), the files around it keep theirs, offsets stay put."""
    tpl = templates[kind]
    rng = random.Random(seed)
    topic, qid = rng.choice(list(tpl.queues))
    qdir = Path("consumequeue") / topic / str(qid)
    files = sorted((tpl.path / qdir).iterdir())
    assert len(files) >= 3
    victim = rng.choice(files[1:-1])
    first = int(victim.name) // 20
    lost = set(range(first, first + 16))

    def damage(root: Path) -> None:
        (root / qdir / victim.name).unlink()

    with damaged_store(tpl, damage) as (store, report):
        assert any("recreated" in p for p in report.problems)
        seen = verify_damaged(store, report, tpl)
        recs = tpl.queues[(topic, qid)]
        assert seen.bounds[(topic, qid)] == (0, len(recs))
        assert seen.skipped[(topic, qid)] <= lost
        rebuilt = {r.qoff for r in recs if r.phy >= tpl.scan_from}
        assert seen.skipped[(topic, qid)] == lost - rebuilt


@pytest.mark.parametrize("start", [3990, 4094, 4095])
def test_garbage_just_past_a_page_boundary_is_measured(start: int) -> None:
    """A record cut by a page boundary, zero on this side and garbage on the other, is garbage
    (reported as a cut), not a tail that was never written. (Found by the zero-filled-range
    test: a damaged record starting 2 bytes before a page boundary went unreported.)"""
    from orbitmq.store.recovery import _dirty_extent

    garbage = bytearray(4 * 4096)
    garbage[4096:4200] = b"x" * 104
    assert _dirty_extent(memoryview(bytes(garbage)), start) == 2 * 4096 - start
    assert _dirty_extent(memoryview(bytes(4 * 4096)), start) == 0
    nonzero_here = bytearray(4 * 4096)
    nonzero_here[start] = 1
    assert _dirty_extent(memoryview(bytes(nonzero_here)), start) == 4096 - start


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EIO], ids=["ENOSPC", "EIO"])
@pytest.mark.parametrize("after", ["crash", "close"])
def test_index_file_reserve_failure_skips_the_index_not_the_dispatch(
    tmp_path: Path, err: int, after: str
) -> None:
    """The IndexFile cannot take the blocks of its next file (issue #14: it used to stop the
    dispatcher, and every later message stayed invisible): the appends succeed, dispatch goes
    on, so every message is readable; the keys that could not be indexed are counted and
    reported, no half-made index file is left, and once the fault clears (after the retry
    pause) new keys are indexed again, also after a reopen."""
    fs = FaultyFs()
    t = Tracker(fault_config(tmp_path / "store"), fs)  # 48 entries per index file
    index_dir = t.config.store_path / "index"

    def put_keyed(count: int, key: str = "key") -> None:
        bodies = [f"K#{t.n + i}".encode() for i in range(count)]
        t.n += count
        msgs = [Message("K", b, keys=[f"{key}{i % 5}"]) for i, b in enumerate(bodies)]
        t.store.put(MessageBatch.of("K", 0, msgs))
        t.want.setdefault(("K", 0), []).extend(bodies)

    try:
        put_keyed(40)
        t.check()
        files_before = sorted(os.listdir(index_dir))
        assert len(files_before) == 1
        fs.arm("reserve", err, where="/index/")
        put_keyed(20)  # 8 entries fit the first file, then it must roll
        assert t.store.wait_for_dispatch(5.0)
        t.check()  # every message readable: the index is not on the visibility path
        assert fs.failures == 1
        assert t.store.dispatcher.failure is None
        assert t.store.dispatcher.index_skipped > 0
        assert "index" in t.store.health()
        assert sorted(os.listdir(index_dir)) == files_before
        assert len(t.store.query_by_key("K", "key0", max_num=1000)) >= 8  # the old entries
        t.put("W", 0, 3)
        fs.clear()
        t.store.dispatcher._index_retry_at = 0.0  # skip the retry pause
        put_keyed(10, "new")
        assert t.store.wait_for_dispatch(5.0)
        assert t.store.dispatcher.index_failure is None
        assert "index" not in t.store.health()
        assert len(t.store.query_by_key("K", "new0", max_num=1000)) == 2
        t.reopen(crash=after == "crash")
        t.check()
        assert len(t.store.query_by_key("K", "new0", max_num=1000)) == 2
    finally:
        if t.store.is_open:
            t.store.close()

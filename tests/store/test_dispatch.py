"""The dispatcher's two decoders (numpy for big blocks, record by record for small ones) must
build byte-identical ConsumeQueues and IndexFiles from the same CommitLog."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from orbitmq.common.message import Message, MessageBatch, encode_properties
from orbitmq.store import appended as appended_mod
from orbitmq.store import dispatch as dispatch_mod
from orbitmq.store.appended import Appended, AppendedLog
from orbitmq.store.commit_log import CommitLog
from orbitmq.store.consume_queue import ConsumeQueueTable
from orbitmq.store.dispatch import Dispatcher
from orbitmq.store.index_service import IndexService
from orbitmq.store.keys import Keyring
from orbitmq.store.sealing import RecordSealer
from orbitmq.store.segment import FileOps
from orbitmq.store.timer_index import TIMER_TOPIC


def _fill(log: CommitLog, rng: random.Random) -> None:
    for _ in range(60):
        topic = rng.choice(["A", "B", "Tópico"])
        n = rng.choice([1, 3, 20, 40])
        bodies, props = [], []
        for _ in range(n):
            msg = Message(
                topic,
                rng.randbytes(rng.randint(1, 300)) + b"TAGS\x01decoy\x02",
                tags=rng.choice([None, "", "x", "y y"]),
                keys=rng.choice([(), ("k1",), ("k1", "k2", "k1"), ("",)]),
                properties=rng.choice(
                    [{}, {"UNIQ_CLIENT_MESSAGE_ID_KEYIDX": f"id{rng.random()}"}, {"XTAGS": "no"}]
                ),
            )
            bodies.append(msg.body)
            props.append(encode_properties(msg.system_properties()))
        log.append(MessageBatch(topic, rng.randint(0, 2), bodies, props))


def _build(
    tmp: Path, log: CommitLog, small: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[dict[str, bytes], dict[str, bytes]]:
    monkeypatch.setattr(dispatch_mod, "SMALL_BLOCK", small)
    queues = ConsumeQueueTable(tmp / "cq", 64, FileOps())
    queues.load()
    index = IndexService(tmp / "ix", 97, 5000, clock=lambda: 1_700_000_000_000)
    index.load()
    d = Dispatcher(log, queues, index)
    d.dispatch_until(log.max_offset)
    queues.flush()
    index.flush()
    cq_files = {
        str(p.relative_to(tmp / "cq")): p.read_bytes()
        for p in (tmp / "cq").rglob("*")
        if p.is_file()
    }
    ix_files = {p.name: p.read_bytes() for p in (tmp / "ix").iterdir()}
    queues.close()
    index.close()
    return cq_files, ix_files


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_small_and_vector_decoders_agree(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = CommitLog(tmp_path / "log", 128 * 1024, FileOps(), clock=lambda: 1_700_000_000_000)
    log.segments.load()
    _fill(log, random.Random(seed))
    vec = _build(tmp_path / "vec", log, 0, monkeypatch)
    small = _build(tmp_path / "small", log, 10**9, monkeypatch)
    assert vec[0] == small[0]
    assert vec[1] == small[1]
    assert vec[0] and vec[1]
    log.close()


def _told_and_decoded(
    tmp: Path,
    seed: int,
    small: int,
    monkeypatch: pytest.MonkeyPatch,
    timer: bool = False,
    sealed: bool = False,
) -> None:
    """Fill a log whose dispatcher is told every append, dispatch it from what it was told,
    then decode the same log with a second dispatcher: the files must be the same bytes.
    ``sealed``: encryption at rest (the decoder opens the sealed groups)."""
    monkeypatch.setattr(dispatch_mod, "SMALL_BLOCK", small)
    log = CommitLog(tmp / "log", 128 * 1024, FileOps(), clock=lambda: 1_700_000_000_000)
    log.segments.load()
    sealer = None
    if sealed:
        sealer = RecordSealer(tmp, Keyring(random.Random(seed).randbytes(32)), 128 * 1024)
        sealer.start(tmp / "log")
        sealer.view_at = log.view_at
        log.sealer = sealer
    built: list[tuple[dict[str, bytes], dict[str, bytes]]] = []
    for name, told in (("told", True), ("decoded", False)):
        queues = ConsumeQueueTable(tmp / name / "cq", 64, FileOps())
        queues.load()
        index = IndexService(tmp / name / "ix", 97, 5000, clock=lambda: 1_700_000_000_000)
        index.load()
        d = Dispatcher(log, queues, index)
        d.fast = told
        d.opener = sealer
        if told:
            rng = random.Random(seed)
            for _ in range(rng.randint(1, 4)):  # rounds of appends, some through append_many
                _fill_told(log, rng, timer)
                d.dispatch_until(log.max_offset)
            assert d.appended.used == _count(log)
        else:
            if sealer is not None:  # decoded from the groups opened again, not from the seal
                sealer.cache.clear()
                sealer._last = None
            d.dispatch_until(log.max_offset)
            assert d.appended.used == 0
        queues.flush()
        index.flush()
        root = tmp / name
        built.append(
            (
                {str(p.relative_to(root)): p.read_bytes() for p in (root / "cq").rglob("*")
                 if p.is_file()},
                {p.name: p.read_bytes() for p in (root / "ix").iterdir()},
            )
        )  # fmt: skip
        queues.close()
        index.close()
    assert built[0][0] == built[1][0]
    assert built[0][1] == built[1][1]
    assert built[0][0] and built[0][1]
    if sealer is not None:
        assert sealer.cache.misses and not sealer.integrity_errors
    log.close()


def _batch(rng: random.Random, topic: str, n: int) -> MessageBatch:
    bodies, props = [], []
    for _ in range(n):
        extra = rng.choice(
            [{}, {"UNIQ_CLIENT_MESSAGE_ID_KEYIDX": f"id{rng.random()}"}, {"XTAGS": "no"}]
        )
        if topic == TIMER_TOPIC:  # the timer topic's tag is the due time, or a cancel
            extra = rng.choice(
                [{}, {"TIMER_OUT_MS": str(rng.randint(0, 10**13))},
                 {"TIMER_OUT_MS": "9", "TIMER_ROLL_MS": "5"}, {"TIMER_CANCEL_QOFF": "12"},
                 {"TIMER_OUT_MS": "bad"}]
            )  # fmt: skip
        msg = Message(
            topic,
            rng.randbytes(rng.randint(1, 300)) + b"KEYS\x01decoy\x02",
            tags=rng.choice([None, "", "x", "y y"]),
            keys=rng.choice([(), ("k1",), ("k1", "k2", "k1"), ("",), (" a  b ",)]),
            properties=extra,
        )
        bodies.append(msg.body)
        props.append(encode_properties(msg.system_properties()) if rng.random() < 0.9 else b"")
    return MessageBatch(topic, rng.randint(0, 2), bodies, props)


def _fill_told(log: CommitLog, rng: random.Random, timer: bool) -> None:
    topics = ["A", "B", "Tópico", *([TIMER_TOPIC] if timer else [])]
    for _ in range(rng.randint(5, 30)):
        batches = [
            _batch(rng, rng.choice(topics), rng.choice([1, 3, 15, 16, 40]))
            for _ in range(rng.choice([1, 1, 2, 5]))
        ]
        if len(batches) == 1:
            log.append(batches[0])
        elif log.append_many(batches) is None:  # across a segment end: one by one
            for b in batches:
                log.append(b)


def _count(log: CommitLog) -> int:
    return sum(n for n in log.queue_offsets.values())


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_told_dispatch_writes_the_decoded_bytes(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries built from what the appends told are the decoder's, byte for byte, whichever
    decoder path (numpy block / record by record) and whichever told path (batch scan /
    record by record) is taken, timer topic included."""
    print("seed", seed)
    for small in (0, 16, 10**9):
        _told_and_decoded(tmp_path / f"s{small}", seed, small, monkeypatch, timer=seed % 2 == 0)


@pytest.mark.parametrize("seed", [8])
def test_told_dispatch_of_sealed_appends_writes_the_decoded_bytes(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Encryption at rest: entries built from what the sealed appends told (sealed sizes and
    offsets, plaintext properties) equal those decoded from the opened groups."""
    print("seed", seed)
    for small in (0, 10**9):
        _told_and_decoded(tmp_path / f"s{small}", seed, small, monkeypatch, seed % 2 == 0, True)


def test_told_list_takes_only_what_starts_at_the_round() -> None:
    """Appends passed by a decoding round are dropped; one not starting exactly there, or
    ending past the round, is not taken; the list is bounded."""
    log = AppendedLog()

    def item(start: int, end: int) -> Appended:
        return Appended(start, end, 0, [])

    for a, b in ((0, 10), (10, 20), (20, 30)):
        log.push(item(a, b))
    assert log.take(5, 100) is None  # 0..10 passed, 10 does not start at 5
    assert log.next_start() == 10
    assert log.take(10, 15) is None  # ends past the round
    got = log.take(10, 100)
    assert got is not None and (got.start, got.end) == (10, 20)
    assert log.take(25, 100) is None and log.next_start() is None
    for k in range(appended_mod.MAX_PENDING + 1):
        log.push(item(k, k + 1))
    assert log.next_start() == appended_mod.MAX_PENDING  # dropped at the bound, then pushed


@pytest.mark.parametrize("seed", [2, 3])
def test_told_dispatch_in_python_writes_the_decoded_bytes(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same without orbitmq._native's told_small (the record-by-record loop in Python)."""
    print("seed", seed)
    monkeypatch.setattr(appended_mod, "_TOLD_SMALL", None)
    _told_and_decoded(tmp_path, seed, 10**9, monkeypatch, timer=seed % 2 == 0)


def _random_props(rng: random.Random) -> bytes:
    kind = rng.random()
    if kind < 0.1:
        return b""
    if kind < 0.2:  # raw bytes with separators and name look-alikes
        parts = [b"TAGS\x01", b"KEYS\x01", b"UNIQ_CLIENT_MESSAGE_ID_KEYIDX\x01", b"\x02", b"x"]
        return b"".join(rng.choice(parts) + rng.randbytes(rng.randint(0, 3)) for _ in range(6))
    many = [f"k{i}" for i in range(rng.choice([64, 65, 70]))]
    msg = Message(
        "A",
        b"",
        tags=rng.choice([None, "", "x", "y y", "é"]),
        keys=rng.choice([(), ("k1",), ("k1", "k2", "k1"), ("",), (" a  b ",), many]),
        properties=rng.choice(
            [{}, {"UNIQ_CLIENT_MESSAGE_ID_KEYIDX": f"id{rng.random()}"}, {"XTAGS": "no"},
             {"XKEYS": "no", "UNIQ_CLIENT_MESSAGE_ID_KEYIDX": ""}]
        ),
    )  # fmt: skip
    return encode_properties(msg.system_properties())


@pytest.mark.skipif(appended_mod._TOLD_SMALL is None, reason="orbitmq._native not built")
def test_told_small_in_c_matches_the_python_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """orbitmq._native.told_small gives _each_record's tags and index rows, KEYS of more than
    64 parts left to Python (None), views of the properties taken like bytes."""
    seed = random.randrange(2**32)
    print("seed", seed)
    rng = random.Random(seed)
    native = appended_mod._TOLD_SMALL
    for _ in range(300):
        n = rng.randint(1, 15)
        props: list[bytes] = [_random_props(rng) for _ in range(n)]
        phys = [rng.randint(0, 2**40) for _ in range(n)]
        batch = appended_mod.AppendedBatch("A", 0, 0, phys, [100] * n, props)
        indexing = rng.random() < 0.8
        seen = []
        for told_small in (native, None):
            monkeypatch.setattr(appended_mod, "_TOLD_SMALL", told_small)
            rows: list[tuple[int, int, int]] = [(1, 2, 3)]
            tags = appended_mod._each_record(batch, 1_700_000_000_000, rows, lambda t: 77, indexing)
            seen.append((list(tags), rows))
        assert seen[0] == seen[1], props
        if native is not None:
            rows = []
            got = native([memoryview(p) for p in props], phys, 5, 77, indexing, rows)
            assert got is None or got == seen[1][0]

"""Grouped appends (``MessageStore.append_many``, issue #15): one write for many batches
produces exactly the records, offsets and results that appending them one by one does;
a group that straddles a segment end writes nothing and says so; bad input writes nothing."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from orbitmq.common.message import MessageBatch, encode_properties
from orbitmq.store.message_store import MessageStore
from tests.store.conftest import small_config


def _open(path: Path, **overrides: object) -> MessageStore:
    store = MessageStore(small_config(path, **overrides), clock=lambda: 1_700_000_000_000)
    store.open()
    return store


def _log(store: MessageStore) -> bytes:
    loc = store.commit_log.view_at(0)
    assert loc is not None
    view, _at, _size = loc
    return bytes(view[: store.commit_log.max_offset])


def _batches(rng: random.Random, count: int) -> list[MessageBatch]:
    out = []
    for _ in range(count):
        n = rng.choice([1, 2, 3, 12, 40])  # both sides of the vectorised encode's threshold
        props = encode_properties({"TAGS": rng.choice("abc"), "KEYS": f"k{rng.randrange(99)}"})
        out.append(
            MessageBatch(
                rng.choice(["A", "B"]),
                rng.randrange(3),
                [rng.randbytes(rng.randrange(1, 300)) for _ in range(n)],
                [props] * n,
                flag=rng.randrange(4),
                born_timestamp_ms=rng.randrange(1 << 40),
            )
        )
    return out


def test_a_group_writes_what_one_by_one_writes(tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    print("seed", seed)  # replay: rng = random.Random(seed)
    rng = random.Random(seed)
    one, many = _open(tmp_path / "one"), _open(tmp_path / "many")
    try:
        for _round in range(20):
            group = _batches(rng, rng.randrange(1, 9))
            singles = [one.append(b) for b in group]
            grouped = many.append_many(group)
            assert grouped == singles
        assert _log(many) == _log(one)
        # Here, or by the dispatcher thread if its periodic round holds the lock right now.
        assert many.dispatch_ready() or many.wait_for_dispatch(5)
        assert one.wait_for_dispatch(5)
        for topic in ("A", "B"):
            for q in range(3):
                assert many.max_offset(topic, q) == one.max_offset(topic, q)
                got = many.get_messages(topic, q, 0, 1000, 1 << 30)
                want = one.get_messages(topic, q, 0, 1000, 1 << 30)
                assert [bytes(m) for m in got.messages] == [bytes(m) for m in want.messages]
    finally:
        one.close()
        many.close()


def test_a_group_across_a_segment_end_writes_nothing(tmp_path: Path) -> None:
    seg = 256 * 1024
    store = _open(tmp_path / "s", mapped_file_size_commit_log=seg, max_message_size=64 * 1024)
    try:
        big = MessageBatch("A", 0, [b"x" * 60_000], [b""])
        assert store.append_many([big] * 4) is not None
        end = store.commit_log.max_offset
        assert store.append_many([big, big]) is None  # would cross the segment end
        assert store.commit_log.max_offset == end and store.commit_log.queue_offsets[("A", 0)] == 4
        store.append(big)  # one by one still works: it rolls to the next segment
        assert store.commit_log.max_offset > seg
        assert store.dispatch_ready() or store.wait_for_dispatch(5)
        assert store.max_offset("A", 0) == 5
    finally:
        store.close()


def test_bad_input_in_a_group_writes_nothing(tmp_path: Path) -> None:
    store = _open(tmp_path / "s")
    try:
        good = MessageBatch("A", 0, [b"ok"], [b""])
        bad = MessageBatch("bad topic!", 0, [b"no"], [b""])
        with pytest.raises(Exception, match="topic"):
            store.append_many([good, bad])
        assert store.commit_log.max_offset == 0
    finally:
        store.close()


def test_no_inline_dispatch_while_the_dispatcher_is_stopped(tmp_path: Path) -> None:
    """truncate_to and close stop the dispatcher: an appender's inline round must not run
    then (it would race with the truncation)."""
    store = _open(tmp_path / "s")
    try:
        store.dispatcher.stop()
        assert store.append_many([MessageBatch("A", 0, [b"x"], [b""])]) is not None
        assert not store.dispatch_ready()
        assert store.max_offset("A", 0) == 0
        store.dispatcher.start()
        assert store.dispatch_ready() or store.wait_for_dispatch(5)
        assert store.max_offset("A", 0) == 1
    finally:
        store.close()

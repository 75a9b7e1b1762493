"""Reads check entries one by one for small chunks and with numpy for big ones: both must serve
the same records, skip the same damaged ones and stop at the same offsets."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from orbitmq.common.message import Message, MessageBatch
from orbitmq.store import reader as ms
from orbitmq.store.consume_queue import ENTRY_SIZE
from orbitmq.store.message_store import MessageStore
from orbitmq.store.retention import TopicRetention


def _snapshot(
    store: MessageStore, monkeypatch: pytest.MonkeyPatch, small: int, **kw: object
) -> list[tuple[object, ...]]:
    monkeypatch.setattr(ms, "SMALL_READ", small)
    out = []
    for qid in (0, 1):
        for offset in range(0, 130, 7):
            for max_count in (1, 5, 40, 200):
                r = store.get_messages("T", qid, offset, max_count=max_count, **kw)  # type: ignore[arg-type]
                out.append(
                    (
                        r.status,
                        r.next_begin_offset,
                        r.queue_offsets,
                        [bytes(m) for m in r.messages],
                        r.skipped,
                    )
                )
    return out


def test_small_and_vector_reads_agree(
    make_store: Callable[..., MessageStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(7)
    store = make_store()
    now = [1_700_000_000_000]
    store.clock = lambda: now[0]  # type: ignore[method-assign]
    store.commit_log.clock = store.retention.clock = store.clock
    for _ in range(12):
        now[0] += 1000
        for qid in (0, 1):
            msgs = [
                Message("T", rng.randbytes(rng.randint(1, 500)), tags=rng.choice(["a", "b"]))
                for _ in range(6)
            ]
            store.put(MessageBatch.of("T", qid, msgs))
        store.put(MessageBatch.of("U", 0, [b"other"] * 3))
    assert store.wait_for_dispatch()
    # Damage some ConsumeQueue entries: point them elsewhere, or zero them.
    cq = store.queues.get("T", 0)
    assert cq is not None
    seg = cq.files.segments[0]
    for victim in (3, 10, 11, 40):
        with open(seg.path, "r+b") as f:
            f.seek(victim * ENTRY_SIZE)
            f.write(rng.randbytes(ENTRY_SIZE) if victim % 2 else bytes(ENTRY_SIZE))
    for kw in ({}, {"tags": ["a"]}, {"max_bytes": 700}):
        assert _snapshot(store, monkeypatch, 0, **kw) == _snapshot(store, monkeypatch, 10**9, **kw)
    store.set_topic_retention("T", TopicRetention(ttl_ms=6_500))
    store.retention.topics["T"] = TopicRetention(ttl_ms=6_500)
    store.retention.floors.clear()
    assert _snapshot(store, monkeypatch, 0) == _snapshot(store, monkeypatch, 10**9)
    # The damage was seen by both paths.
    r = store.get_messages("T", 0, 0, max_count=100)
    assert 3 in r.skipped or 10 in r.skipped

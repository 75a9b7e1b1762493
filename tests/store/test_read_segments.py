"""Vectorized reads across CommitLog segments: the one-segment shortcut and the general path
serve the same records as the entry-by-entry path, including when every record of one
segment is damaged."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from orbitmq.common.message import Message, MessageBatch
from orbitmq.store import reader as ms
from orbitmq.store.message_store import MessageStore


def _read_all(store: MessageStore, monkeypatch: pytest.MonkeyPatch, small: int) -> list[object]:
    monkeypatch.setattr(ms, "SMALL_READ", small)
    out: list[object] = []
    for offset in (0, 1, 37, 250, 599):
        for max_count in (1, 64, 400, 2000):
            r = store.get_messages("T", 0, offset, max_count=max_count)
            out.append((r.status, r.next_begin_offset, r.queue_offsets, r.skipped))
            out.append([bytes(m) for m in r.messages])
    return out


def test_reads_across_segments_agree(
    make_store: Callable[..., MessageStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(mapped_file_size_commit_log=128 * 1024, max_message_size=32 * 1024)
    for i in range(60):
        store.put(MessageBatch.of("T", 0, [Message("T", bytes([i]) * 400)] * 10))
        store.put(MessageBatch.of("U", 0, [b"other"]))
    assert store.wait_for_dispatch()
    assert len(store.commit_log.segments.segments) >= 3
    whole = store.get_messages("T", 0, 0, max_count=2000)
    assert whole.queue_offsets == list(range(600))
    assert len(whole.body_parts) > 1  # runs broken by U's records and segment ends
    assert _read_all(store, monkeypatch, 0) == _read_all(store, monkeypatch, 10**9)

    # Damage the magic of every T record in the second segment.
    cq = store.queues.get("T", 0)
    assert cq is not None
    seg = store.commit_log.segments.segments[1]
    damaged = []
    for off in range(600):
        entry = cq.entry(off)
        assert entry is not None
        phy = entry[0]
        if seg.start <= phy < seg.start + store.commit_log.segment_size:
            damaged.append(off)
            with open(seg.path, "r+b") as f:
                f.seek(phy - seg.start + 4)
                f.write(b"\0\0\0\0")
    assert damaged
    r = store.get_messages("T", 0, 0, max_count=2000)
    assert r.skipped == damaged
    assert r.queue_offsets == [o for o in range(600) if o not in damaged]
    assert _read_all(store, monkeypatch, 0) == _read_all(store, monkeypatch, 10**9)

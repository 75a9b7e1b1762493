"""The tier's key index: query by key finds messages only the tier holds (local segments
gone, or the whole disk lost and rebuilt by --tier-restore), by KEYS word and by unique id."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from orbitmq.common.message import Message, MessageBatch
from orbitmq.store.message_store import MessageStore
from orbitmq.store.tier import service as tier_service
from orbitmq.store.tier.backend import DirectoryBackend
from orbitmq.store.tier.keys import KEYS_DTYPE, key_hash, rows_for
from orbitmq.store.tier.layout import QueueManifest, keys_key, manifest_key
from tests.store.tier.test_tier_store import QUEUES, open_store, segments

UNIQ = "UNIQ_CLIENT_MESSAGE_ID_KEYIDX"
Sent = dict[str, tuple[int, int, bytes]]


def produce_keyed(store: MessageStore, rounds: int) -> Sent:
    """``rounds`` batches of 8 per queue; message (q, r, j) has keys ``k<q>-<r>-<j>`` and
    ``round<r>`` and unique id ``ID<q>-<r>-<j>``. Returns key -> (queue, offset, body)."""
    sent: Sent = {}
    for r in range(rounds):
        for q in range(QUEUES):
            msgs = [
                Message(
                    "T",
                    f"body-{q}-{r}-{j}-".encode() * 10,
                    keys=(f"k{q}-{r}-{j}", f"round{r}"),
                    properties={UNIQ: f"ID{q}-{r}-{j}"},
                )
                for j in range(8)
            ]
            res = store.put(MessageBatch.of("T", q, msgs))
            for j, m in enumerate(msgs):
                sent[m.keys[0]] = (q, res.first_queue_offset + j, m.body)
    assert store.wait_for_dispatch()
    store.commit_log.flush()
    return sent


def expect_one(store: MessageStore, key: str, want: tuple[int, int, bytes]) -> None:
    found = store.query_by_key("T", key, max_num=4)
    assert [(m.queue_id, m.queue_offset, m.body) for m in found] == [want], key


def test_rows_for_finds_every_row_of_a_hash() -> None:
    keys = np.zeros(4, dtype=KEYS_DTYPE)
    keys["hash"] = [5, 7, 7, 9]
    keys["row"] = [2, 3, 1, 0]
    assert rows_for(keys, 7) == [1, 3]
    assert rows_for(keys, 6) == [] and rows_for(keys, 10) == []
    assert key_hash("T", "a") != key_hash("U", "a")  # the topic is part of the hash


def test_query_by_key_reads_the_tier_once_local_segments_are_gone(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path)
    try:
        assert store.tier is not None
        sent = produce_keyed(store, 40)
        store.tier.run_once()
        store.retention.run()
        assert segments(store) == 1
        local_min = {q: store.queues.get("T", q).min_offset for q in range(QUEUES)}  # type: ignore[union-attr]
        cold = [k for k, (q, off, _b) in sent.items() if off < local_min[q]]
        assert len(cold) > 100
        for key in cold[::5]:
            # The tier's index alone (local IndexFiles may still name the offsets).
            found = store.tier.by_key("T", key, 4, 0, 2**62, set())
            q, off, body = sent[key]
            assert [(m.queue_id, m.queue_offset, m.body) for m in found] == [(q, off, body)]
            expect_one(store, key, sent[key])  # local and tier answers merged, once each
        q, off, body = sent["k2-0-3"]
        found = store.query_by_key("T", "ID2-0-3")  # the unique id is a key too
        assert [(m.queue_id, m.queue_offset) for m in found] == [(q, off)]
        everyone = store.query_by_key("T", "round0", max_num=100)
        assert sorted((m.queue_id, m.queue_offset) for m in everyone) == sorted(
            (q, off) for k, (q, off, _b) in sent.items() if k.split("-")[1] == "0"
        )  # all 32 of round 0, no duplicates
        assert store.tier.by_key("T", "k0-0-0", 4, 2**61, 2**62, set()) == []  # time window
        assert store.tier.by_key("U", "k0-0-0", 4, 0, 2**62, set()) == []  # another topic
    finally:
        store.close()


def test_tier_restore_answers_key_queries_without_the_local_disk(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path)
    assert store.tier is not None
    sent = produce_keyed(store, 12)
    store.tier.run_once()
    store.close()
    shutil.rmtree(tmp_path / "store")  # the local disk, its IndexFiles included, is lost
    store, _ = open_store(tmp_path, tier_restore=True)
    try:
        for key in list(sent)[::7]:
            expect_one(store, key, sent[key])
        q, off, _body = sent["k1-11-7"]
        found = store.query_by_key("T", "ID1-11-7")
        assert [(m.queue_id, m.queue_offset) for m in found] == [(q, off)]
    finally:
        store.close()


def test_tier_restore_builds_key_indexes_missing_from_older_chunks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, _ = open_store(tmp_path)
    assert store.tier is not None
    sent = produce_keyed(store, 12)
    store.tier.run_once()
    store.close()
    # Chunks uploaded before key indexes existed: no keys objects, -1 in the manifest.
    backend = DirectoryBackend(tmp_path / "tier")
    manifests = [k for k in backend.list("") if k.endswith("manifest.json")]
    assert len(manifests) == QUEUES
    for mk in manifests:
        m = QueueManifest.decode(backend.get(mk))
        assert m.chunks and all(c.keys > 0 for c in m.chunks)
        for c in m.chunks:
            c.keys = -1
            backend.delete(keys_key(m.topic, m.queue_id, c.base, c.end))
        backend.put(mk, m.encode())
    assert not [k for k in backend.list("") if "/keys/" in k]
    shutil.rmtree(tmp_path / "store")
    monkeypatch.setattr(tier_service, "RESTORE_STATUS_S", 0.0)  # a status line per queue
    with caplog.at_level(logging.WARNING, logger=tier_service.__name__):
        store, _ = open_store(tmp_path, tier_restore=True)
    lines = [r.getMessage() for r in caplog.records if r.name == tier_service.__name__]
    assert lines[0].startswith(f"tier restore: {QUEUES} queues in "), lines
    assert [ln.split(" (")[0] for ln in lines[1:-1]] == [
        f"tier restore: {i}/{QUEUES} queues" for i in range(QUEUES)
    ], lines
    assert (
        lines[-1].startswith("tier restore: ") and "continue at their tier watermark" in lines[-1]
    )
    try:
        for key in list(sent)[::9]:
            expect_one(store, key, sent[key])
        for q in range(QUEUES):
            m = QueueManifest.decode(backend.get(manifest_key("T", q)))
            assert all(c.keys == c.count * 3 for c in m.chunks)  # 2 KEYS words + unique id
            for c in m.chunks:
                assert backend.get(keys_key("T", q, c.base, c.end))
    finally:
        store.close()

"""A tier that lists as empty (an unmounted folder, a wrong bucket) is never loaded as an empty
tier: the store keeps its tier's id (store/tier/identity.py), waits for the real tier, deletes
nothing meanwhile, and the real manifests are never overwritten."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from orbitmq.common.errors import TierUnavailableError
from orbitmq.store.tier.backend import DirectoryBackend
from orbitmq.store.tier.identity import LOCAL_FILE, MARKER
from orbitmq.store.tier.layout import QueueManifest, manifest_key
from tests.store.tier.test_tier_store import QUEUES, open_store, produce, read_all, segments


def test_an_unmounted_tier_is_not_an_empty_one(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path)
    assert store.tier is not None
    try:
        sent = produce(store, 30)
        store.tier.run_once()
        store.retention.run()
        assert store.queues.get("T", 0).min_offset > 0  # type: ignore[union-attr]
        tier_id = store.tier.tier_id
        assert tier_id and (tmp_path / "store" / LOCAL_FILE).read_text().strip() == tier_id
    finally:
        store.close()
    before = {q: QueueManifest.decode(DirectoryBackend(tmp_path / "tier").get(manifest_key("T", q)))
              for q in range(QUEUES)}  # fmt: skip
    # The tier's disk is not mounted: its mount point is an empty folder.
    shutil.move(tmp_path / "tier", tmp_path / "unmounted")
    (tmp_path / "tier").mkdir()
    store, _ = open_store(tmp_path)
    assert store.tier is not None
    try:
        assert not store.tier.loaded and "tier" in store.health()
        assert "has no orbitmq-tier.json" in store.tier.last_error
        with pytest.raises(TierUnavailableError):  # a cold read: retryable, nothing moves
            store.get_messages("T", 0, 0)
        sent |= produce(store, 30, start=30)
        kept = segments(store)
        store.retention.run()
        assert segments(store) == kept  # coverage unknown: nothing deleted
        with pytest.raises(TierUnavailableError):
            store.tier.run_once()
        assert not list((tmp_path / "tier").iterdir())  # nothing written into the mount point
        # The disk is back.
        (tmp_path / "tier").rmdir()
        shutil.move(tmp_path / "unmounted", tmp_path / "tier")
        store.tier.run_once()
        assert store.tier.loaded and store.tier.tier_id == tier_id
        backend = DirectoryBackend(tmp_path / "tier")
        for q in range(QUEUES):  # the real history is still named, then extended
            m = QueueManifest.decode(backend.get(manifest_key("T", q)))
            assert m.chunks[: len(before[q].chunks)] == before[q].chunks
        store.retention.run()
        assert read_all(store) == sent
    finally:
        store.close()


def test_another_stores_tier_is_refused_and_a_wiped_store_adopts_its_own(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path)
    assert store.tier is not None
    try:
        produce(store, 2)
        store.tier.run_once()
    finally:
        store.close()
    other, _ = open_store(tmp_path / "other")  # a second tier, another id
    other.close()
    shutil.rmtree(tmp_path / "tier")
    shutil.copytree(tmp_path / "other" / "tier", tmp_path / "tier")
    store, _ = open_store(tmp_path)
    assert store.tier is not None
    try:
        assert not store.tier.loaded and "is " in store.tier.last_error
    finally:
        store.close()
    # A store that lost its disk adopts the tier it finds (what --tier-restore relies on).
    shutil.rmtree(tmp_path / "store")
    store, _ = open_store(tmp_path)
    assert store.tier is not None
    try:
        assert store.tier.loaded
        marker = DirectoryBackend(tmp_path / "tier").get(MARKER)
        assert store.tier.tier_id is not None and store.tier.tier_id.encode() in marker
    finally:
        store.close()

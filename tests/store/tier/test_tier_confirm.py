"""Uploads stop at the confirm offset: with replication, a record the replicas have not
confirmed may still be truncated away, so the tier never holds it; once confirmed, it goes."""

from __future__ import annotations

from pathlib import Path

from orbitmq.store.tier.layout import QueueManifest, manifest_key
from tests.store.tier.test_tier_store import QUEUES, open_store, produce


def test_uploads_stop_at_the_confirm_offset(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path)
    tier = store.tier
    assert tier is not None
    try:
        produce(store, 10)
        held = {q: store.max_offset("T", q) for q in range(QUEUES)}
        cut = store.commit_log.max_offset
        produce(store, 10, start=10)
        store.commit_log.confirmed = cut  # the replicas confirmed the first half only
        tier.run_once()
        for q in range(QUEUES):
            m = QueueManifest.decode(tier.backend.get(manifest_key("T", q)))
            assert m.watermark == held[q], (q, m.watermark, held[q])
            assert all(c.end_phy <= cut for c in m.chunks)
        store.commit_log.confirmed = None  # everything confirmed
        tier.run_once()
        for q in range(QUEUES):
            assert tier.manifests[("T", q)].watermark == store.max_offset("T", q)
    finally:
        store.close()

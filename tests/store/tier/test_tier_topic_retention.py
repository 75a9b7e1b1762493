"""A topic's retention (``retention_ms`` / ``retention_bytes``) is its *local* retention once a
tier is on: what the local data no longer serves is served by the tier while the tier holds it
(until the tier TTL), so a consumer reading from the first offset gets every message, with no
hole between the tier's data and the topic's floor. Without the tier's copy, the floor stands."""

from __future__ import annotations

from pathlib import Path

from orbitmq.store.message_store import GetStatus
from orbitmq.store.retention import TopicRetention
from tests.store.tier.test_tier_store import QUEUES, open_store, produce, read_all


def test_a_topics_floor_is_served_by_the_tier(tmp_path: Path) -> None:
    # Local segments stay (broker-wide local retention: hours); only the topic's floor moves.
    store, _ = open_store(tmp_path, tier_local_retention_ms=-1)
    tier = store.tier
    assert tier is not None
    try:
        sent = produce(store, 20)
        tier.run_once()  # all of it uploaded
        store.set_topic_retention("T", TopicRetention(None, 4096))  # the newest 4 KiB per queue
        store.retention.run()
        floors = {q: store.retention.floor("T", q) for q in range(QUEUES)}
        assert all(f > 0 for f in floors.values()), floors
        assert all(store.queues.get("T", q).min_offset == 0 for q in range(QUEUES))  # type: ignore[union-attr]
        assert all(store.min_offset("T", q) == 0 for q in range(QUEUES))
        assert read_all(store) == sent  # below each floor from the tier, the rest locally
        sent |= produce(store, 5, start=20)  # not uploaded: below the new floor, not served
        store.retention.run()
        q, floor = 0, store.retention.floor("T", 0)
        watermark = tier.manifests[("T", q)].watermark
        assert watermark < floor
        res = store.get_messages("T", q, watermark)
        assert res.status is GetStatus.OFFSET_TOO_SMALL and res.next_begin_offset == floor
    finally:
        store.close()

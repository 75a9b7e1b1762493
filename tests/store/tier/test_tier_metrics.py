"""The tier's metrics through an outage: availability drops to 0, failed turns count up, the
upload lag (messages and seconds) grows while nothing is uploaded; once the store is back the
lag returns to 0 and availability to 1 (what the Prometheus scrape exposes)."""

from __future__ import annotations

import re
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from orbitmq.broker.metrics import TierCollector
from tests.store.tier.test_tier_store import open_store, produce


def scrape(stats: object) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(TierCollector(stats))  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    return {m[0]: float(m[1]) for m in re.findall(r"^orbitmq_tier_(\w+) (\S+)$", text, re.M)}


def test_tier_metrics_through_an_outage(tmp_path: Path) -> None:
    store, flaky = open_store(tmp_path, flaky=True)
    tier = store.tier
    assert tier is not None and flaky is not None
    try:
        produce(store, 2)
        tier.run_once()
        up = scrape(tier.stats)
        assert up["available"] == 1 and up["upload_lag_messages"] == 0
        assert up["uploaded_bytes_total"] > 0
        flaky.down = True
        produce(store, 3, start=2)
        clock = tier.clock
        tier.clock = lambda: clock() + 5_000  # the records not uploaded have waited 5 s
        deadline = time.monotonic() + 10
        while tier.health.failures < 1 and time.monotonic() < deadline:
            tier.wake()
            time.sleep(0.05)
        down = scrape(tier.stats)
        assert down["available"] == 0 and down["errors_total"] >= 1
        assert down["upload_lag_messages"] == 3 * 8 * 4  # 3 rounds of 8 on 4 queues
        assert down["upload_lag_seconds"] >= 5
        flaky.down = False
        tier.run_once()
        back = scrape(tier.stats)
        assert back["upload_lag_messages"] == 0 and back["upload_lag_seconds"] == 0
        assert back["errors_total"] == down["errors_total"]
    finally:
        store.close()

"""`orbitmq bench kafka` runs end to end on a small count (its own `orbitmq up`)."""

from __future__ import annotations

import pytest

from orbitmq.bench.kafka import KafkaBenchOptions, format_report, run_kafka_bench

pytest.importorskip("confluent_kafka")


@pytest.mark.timeout(180)
def test_bench_kafka_small() -> None:
    opts = KafkaBenchOptions(count=300, partitions=2, max_inflight_produce=1)  # the A/B's B side
    result = run_kafka_bench(opts, lambda _s: None)
    for key in ("native_produce", "native_consume", "kafka_produce", "kafka_consume"):
        assert result[key] > 0, key
    assert "confluent-kafka" in format_report(result)
    assert "max_inflight_produce=1" in format_report(result)

"""`orbitmq bench kafka` runs end to end on a small count (its own `orbitmq up`)."""

from __future__ import annotations

import pytest

from orbitmq.bench.kafka import KafkaBenchOptions, format_report, run_kafka_bench

pytest.importorskip("confluent_kafka")


@pytest.mark.timeout(180)
def test_bench_kafka_small() -> None:
    result = run_kafka_bench(KafkaBenchOptions(count=300, partitions=2), lambda _s: None)
    for key in ("native_produce", "native_consume", "kafka_produce", "kafka_consume"):
        assert result[key] > 0, key
    assert "confluent-kafka" in format_report(result)

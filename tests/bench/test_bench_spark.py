"""``orbitmq bench spark``: the report, and one tiny real run (Spark, a broker started by the
benchmark itself)."""

from __future__ import annotations

import shutil

import pytest

from orbitmq.bench.spark import SparkBenchOptions, SparkBenchResult, format_report


def test_report_names_every_measure() -> None:
    r = SparkBenchResult(1000, 200, 4, "local[2]", load_msgs_per_s=5000.0)
    r.batch_read_s = [1.0, 2.0, 4.0]
    r.stream_read_s = [2.0]
    r.ceiling_read_s = [0.5]
    r.ceiling_stream_s = [0.25]
    r.micro_batch_ms = [100.0, 200.0, 300.0]
    text = format_report(r, "orbitmq bench spark --count 1000")
    assert "batch read" in text and "1,000" in text  # median 1 s -> 1,000 rows/s
    assert "streaming write" in text and "median 200 ms" in text
    s = r.summary()
    assert s["batch_read_rows_per_s"] == 500.0
    assert s["stream_write_rows_per_s"] == 0.0
    assert "zero-cost source" in text and s["ceiling_read_rows_per_s"] == 2000.0
    assert "zero-cost stream" in text and s["ceiling_stream_rows_per_s"] == 4000.0


@pytest.mark.spark
@pytest.mark.slow
def test_tiny_run() -> None:
    pytest.importorskip("pyspark")
    if not shutil.which("java"):
        pytest.skip("Java is not installed")
    from orbitmq.bench.spark import run_spark_bench

    lines: list[str] = []
    opts = SparkBenchOptions(
        count=2000, size=50, queues=2, runs=1, skip_write=True, overhead_batches=2
    )
    r = run_spark_bench(opts, lines.append)
    assert len(r.batch_read_s) == 1 and len(r.stream_read_s) == 1
    assert r.summary()["batch_read_rows_per_s"] > 0
    assert r.micro_batch_ms
    assert any("batch read 1/1" in line for line in lines)
    assert len(r.ceiling_read_s) == 1 and any("zero-cost source 1/1" in x for x in lines)
    assert len(r.ceiling_stream_s) == 1 and any("zero-cost stream 1/1" in x for x in lines)

"""The scripts in examples/ run against a real cluster (one NameServer + one Broker as
processes) on the shared local SparkSession, with small data, and their output is checked:
the aggregation's numbers against plain Python, the archive's date partitions and rows, the
fixed dead letters back in their topic."""

from __future__ import annotations

import importlib.util
import json
import random
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from orbitmq.spark import pipelines
from tests.harness import REPO
from tests.spark.conftest import OrbitCluster


def example(name: str) -> ModuleType:
    """Load ``examples/<name>.py`` as a module (the folder is not a package)."""
    path = REPO / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"orbitmq_example_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_windowed_aggregation(spark: Any, orbit_cluster: OrbitCluster, tmp_path: Path) -> None:
    ex = example("windowed_aggregation")
    source, results = orbit_cluster.topic("orders"), orbit_cluster.topic("per-minute")
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    args = ex.parse_args(
        ["--namesrv", orbit_cluster.namesrv, "--topic", source, "--to", results,
         "--events", "30", "--seed", str(seed), "--checkpoint", str(tmp_path / "ck")]
    )  # fmt: skip
    out = ex.run(spark, args)

    expected = ex.expected_results(out["events"])
    assert expected, "the sample must close at least one window"
    got = {(r["window_start"], r["user"]): r for r in out["results"]}
    assert len(got) == len(out["results"]), "a window was written twice"
    assert sorted(got) == sorted(expected)
    for key, (count, total) in expected.items():
        assert got[key]["count"] == count, key
        assert got[key]["sum_amount"] == pytest.approx(total), key


def test_archive_parquet(spark: Any, orbit_cluster: OrbitCluster, tmp_path: Path) -> None:
    ex = example("archive_parquet")
    topic, path = orbit_cluster.topic("clicks"), tmp_path / "archive"
    argv = ["--namesrv", orbit_cluster.namesrv, "--topic", topic, "--to", str(path)]
    first = ex.run(spark, ex.parse_args([*argv, "--messages", "40"]))
    second = ex.run(spark, ex.parse_args([*argv, "--messages", "15"]))  # resumes: only the new

    archived = spark.read.parquet(str(path))
    ids = [r["msg_id"] for r in archived.select("msg_id").collect()]
    assert sorted(ids) == sorted(first["sent"] + second["sent"])  # all rows, none twice
    assert sum(second["per_date"].values()) == 55
    assert archived.where("date != to_date(store_timestamp)").count() == 0
    dates = {str(r["date"]) for r in archived.select("date").distinct().collect()}
    folders = {p.name for p in path.iterdir() if p.name.startswith("date=")}
    assert folders == {f"date={d}" for d in dates}
    for folder in folders:
        assert list((path / folder).glob("*.parquet"))
    assert set(archived.columns) >= {"key", "value", "tags", "properties", "msg_id", "date"}


def test_dlq_reprocess(spark: Any, orbit_cluster: OrbitCluster) -> None:
    ex = example("dlq_reprocess")
    topic, group = orbit_cluster.topic("invoices", queues=1), f"billing-{uuid.uuid4().hex[:6]}"
    args = ex.parse_args(
        ["--namesrv", orbit_cluster.namesrv, "--topic", topic, "--group", group, "--invoices", "8"]
    )
    out = ex.run(spark, args)
    result = out["result"]
    assert result.resent == {topic: 2} and result.read == 2
    assert json.loads(result.next_offsets) == {pipelines.dlq_topic(group): {"broker-a/0": 2}}

    rows = pipelines.read_batch(spark, orbit_cluster.namesrv, topic).collect()
    resent = [r for r in rows if pipelines.PROPERTY_REPROCESSED_FROM in r["properties"]]
    bodies = sorted((json.loads(r["value"]) for r in resent), key=lambda b: b["invoice"])
    assert bodies == [{"invoice": "INV-0000", "amount": 5}, {"invoice": "INV-0004", "amount": 45}]
    for r in resent:
        assert r["tags"] == "invoice"
        assert bytes(r["key"]).decode() == json.loads(r["value"])["invoice"]
        assert "DLQ_ORIGIN_TOPIC" not in r["properties"]
    assert len(rows) == 8 + 2

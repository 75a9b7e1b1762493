"""Streaming writes stay exactly-once through failures: a Python worker killed in the middle of
a micro-batch (after it stored some half batches), and the broker restarted under a running
query. Spark (local mode: no task retry) fails the query; it is restarted from its checkpoint,
as an operator or a supervisor would, and the topic must hold every input row exactly once.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orbitmq.spark.datasource import OrbitMQDataSource
from orbitmq.spark.sink import OrbitMQStreamWriter, stream_writer
from tests.harness import ProcessCluster
from tests.spark.conftest import OrbitCluster
from tests.spark.test_sink import assert_exactly_once, start_sink, stream, write_parquet

pa = pytest.importorskip("pyarrow")


class CrashingWriter(OrbitMQStreamWriter):
    """Kills its Python worker (os._exit) after handing two record batches to the sink,
    once: the flag file is removed first, so the replay runs clean."""

    flag = ""

    def write(self, iterator: Iterator[Any]) -> Any:
        flag = self.flag

        def rows() -> Iterator[Any]:
            for i, rb in enumerate(iterator):
                if i == 2 and os.path.exists(flag):
                    os.remove(flag)
                    time.sleep(0.5)  # let the first halves reach the broker
                    os._exit(1)
                yield rb

        return super().write(rows())


class CrashingSource(OrbitMQDataSource):
    @classmethod
    def name(cls) -> str:
        return "orbitmq_crash_test"

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        opts = dict(self.options)
        flag = opts.pop("crashflag")
        base = stream_writer(opts, schema, overwrite)
        writer = CrashingWriter(base.opts, base.columns)
        writer.flag = flag
        return writer


def run_until_done(make_query: Any, attempts: int = 3) -> int:
    """Start the query with availableNow until one run ends cleanly; returns the failures."""
    failures = 0
    for _ in range(attempts):
        q = make_query().start()
        try:
            assert q.awaitTermination(180), "query did not finish in time"
        except AssertionError:
            raise
        except Exception:  # noqa: BLE001 - the crash we caused
            failures += 1
            continue
        finally:
            if q.isActive:
                q.stop()
        return failures
    raise AssertionError(f"the query failed {attempts} times")


def test_worker_killed_mid_batch_then_restart_is_exactly_once(
    spark: Any, orbit_cluster: OrbitCluster, tmp_path: Path
) -> None:
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests
    spark.dataSource.register(CrashingSource)
    topic = orbit_cluster.topic("sink-crash", queues=2)
    src, ckpt, flag = tmp_path / "in", tmp_path / "ckpt", tmp_path / "crash-once"
    expected = [f"r{i}" for i in range(3000)]
    write_parquet(src, "a", expected[:1500])
    write_parquet(src, "b", expected[1500:])
    flag.write_text("x")
    conf = "spark.sql.execution.arrow.maxRecordsPerBatch"
    old = spark.conf.get(conf)
    spark.conf.set(conf, "200")  # several record batches per task: crash after the first two
    try:

        def query() -> Any:
            df = stream(spark, src, files_per_trigger=2)
            w = (
                df.writeStream.format("orbitmq_crash_test")
                .option("namesrv", orbit_cluster.namesrv)
                .option("topic", topic)
                .option("crashFlag", str(flag))
                .option("maxBatchMessages", "100")
                .option("checkpointLocation", str(ckpt))
            )
            return w.trigger(availableNow=True)

        failures = run_until_done(query)
    finally:
        spark.conf.set(conf, old)
    assert failures == 1 and not flag.exists()
    assert_exactly_once(orbit_cluster.namesrv, topic, expected)


def test_broker_restarted_mid_query_is_exactly_once(spark: Any, tmp_path: Path) -> None:
    (tmp_path / "cluster").mkdir()
    c = ProcessCluster(tmp_path / "cluster")
    try:
        ns = c.namesrv()
        broker = c.broker("broker-a", [ns.address])
        orbit = OrbitCluster(ns.address, broker.address, c)
        topic = orbit.topic("sink-restart", queues=2)
        src, ckpt = tmp_path / "in", tmp_path / "ckpt"
        expected: list[str] = []

        def add(name: str, n: int) -> None:
            values = [f"{name}-{i}" for i in range(n)]
            expected.extend(values)
            write_parquet(src, name, values)

        add("a", 400)

        def query() -> Any:
            w = start_sink(stream(spark, src), orbit, topic, ckpt, sendTimeout="4s",
                           commitTimeout="20s")  # fmt: skip
            return w.trigger(processingTime="200 milliseconds")

        q = query().start()
        try:
            deadline = time.monotonic() + 120
            while q.lastProgress is None or q.lastProgress["batchId"] < 0:
                assert time.monotonic() < deadline and q.isActive, q.exception()
                time.sleep(0.2)
            broker.kill()  # SIGKILL, then the same store and port again
            add("b", 300)
            time.sleep(1.0)
            add("c", 300)
            broker.restart()
            add("d", 200)
            deadline = time.monotonic() + 120
            while q.isActive and time.monotonic() < deadline:
                done = q.lastProgress
                if done is not None and done["sources"][0]["endOffset"] is not None:
                    end = str(done["sources"][0]["endOffset"])
                    if "d.parquet" in end or '"logOffset":3' in end:
                        break
                time.sleep(0.3)
        finally:
            q.stop()
        # Whatever happened above (a failed batch, a failed query), a restart finishes the job.
        run_until_done(lambda: query().trigger(availableNow=True))
        assert_exactly_once(orbit.namesrv, topic, expected)
    finally:
        c.stop_all()

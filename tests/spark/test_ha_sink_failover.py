"""The Spark exactly-once streaming sink keeps its promise across a master SIGKILL (#13).

``orbitmq cluster up --replicas 3`` (``sync`` mode, factor 3, ``--restart-after 6``) runs one
group. A streaming query (parquet files -> the ``orbitmq`` sink, ``exactlyOnce``: half batches,
a marker, then COMMIT; orbitmq.spark.commit) writes to a topic of that group while its master
is SIGKILLed in the middle of the stream, files arriving before, during and after the failover.
Whatever the running query does then (its batch fails and the query stops, or it carries on
against the new master), it is stopped and run again from its checkpoint until it ends cleanly,
as an operator or a supervisor would. The topic is read back natively through the NameServers
and checked with orbitmq.testing.checker: every row (``s:<n>:`` bodies, each one a send the
committed query acknowledged) is there **exactly once** (lost 0, duplicates 0, nothing else).
The time from the kill to the first micro-batch with rows committed after it is printed.

Kills: ORBITMQ_CHAOS_ITERATIONS (each kill a new round of files), else 1. The seed is printed.
"""

from __future__ import annotations

import asyncio
import random
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from orbitmq.client import AsyncAdminClient, AsyncProducer, Message
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.common.errors import MQError
from orbitmq.testing.checker import History, check, now_ms, percentile, read_back
from tests.chaos.ha_cluster import HaCluster, chaos_seed, iterations
from tests.harness import ProcessCluster
from tests.spark.test_sink import start_sink, stream, write_parquet
from tests.spark.test_sink_crash import run_until_done

KILLS = iterations(1)
pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.timeout(300 + 120 * KILLS)]
TOPIC = "HaSpark"
SOURCE = "HaSparkIn"
CLIENT = "s"
RESTART_AFTER_S = 6.0


def progress_ms(progress: dict[str, Any]) -> float:
    """A StreamingQueryProgress' timestamp (its batch's start), epoch ms."""
    stamp = datetime.fromisoformat(str(progress["timestamp"]).replace("Z", "+00:00"))
    return stamp.timestamp() * 1000


@pytest.mark.parametrize("source", ["files", "topic"])
async def test_exactly_once_sink_survives_master_kills(
    spark: Any, tmp_path: Path, source: str
) -> None:
    rng = random.Random(chaos_seed())
    (tmp_path / "cluster").mkdir()
    c = ProcessCluster(tmp_path / "cluster")
    ha = HaCluster(c, tmp_path, restart_after_s=RESTART_AFTER_S)
    src, ckpt = tmp_path / "in", tmp_path / "ckpt"
    rows: list[str] = []
    files = iter(range(1_000_000))

    src_history = History()
    producer: AsyncProducer | None = None

    async def add(n: int) -> None:
        name = f"f{next(files):04d}"
        values = [f"{CLIENT}:{len(rows) + i}:{name}" for i in range(n)]
        rows.extend(values)
        if producer is None:
            write_parquet(src, name, values)
            return
        for v in values:  # into the source topic, through the same failover
            seq, sent = int(v.split(":")[1]), now_ms()
            try:
                result = await producer.send(Message(SOURCE, v.encode()))
                src_history.result(CLIENT, seq, result, sent)
            except MQError as exc:
                src_history.unknown(CLIENT, seq, SOURCE, sent, exc)

    history = History()
    recoveries: list[float] = []
    q: Any = None
    try:
        await asyncio.to_thread(ha.start)
        await ha.wait_master(in_sync=3, timeout_s=60)
        await ha.create_topic(TOPIC, queues=2)
        namesrv = ";".join(ha.namesrv)
        if source == "topic":
            await ha.create_topic(SOURCE, queues=2)
            producer = AsyncProducer(ha.namesrv, ProducerConfig(send_timeout_s=10.0))
            await producer.start()
        await add(300)

        class Orbit:  # what start_sink needs of tests.spark.conftest.OrbitCluster
            pass

        orbit: Any = Orbit()
        orbit.namesrv = namesrv

        def query() -> Any:
            df = stream(spark, src) if source == "files" else (
                spark.readStream.format("orbitmq").option("namesrv", namesrv)
                .option("topic", SOURCE).option("startingOffsets", "earliest").load()
                .select("value")
            )  # fmt: skip
            return start_sink(df, orbit, TOPIC, ckpt, sendTimeout="4s",
                              commitTimeout="30s")  # fmt: skip

        q = query().trigger(processingTime="200 milliseconds").start()

        async def batches_with_rows(since_ms: float, timeout_s: float) -> float | None:
            """The first micro-batch with rows started after ``since_ms`` that has ended:
            ms from ``since_ms``; None when the query stopped first (or none in time)."""
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and q.isActive:
                for p in q.recentProgress:
                    if p["numInputRows"] > 0 and progress_ms(p) >= since_ms:
                        return float(progress_ms(p) + p["durationMs"].get("triggerExecution", 0)
                                     - since_ms)  # fmt: skip
                await asyncio.sleep(0.2)
            return None

        assert await batches_with_rows(0, 120) is not None, q.exception()
        for k in range(KILLS):
            info = await ha.wait_master(in_sync=3, timeout_s=60)
            await add(rng.randrange(100, 400))
            await asyncio.sleep(rng.uniform(0.0, 1.0))  # the batch is likely under way
            fault = history.fault(f"kill {k}: master {info.master_broker_id}")
            ha.kill(info.master_address)
            await add(rng.randrange(100, 400))
            await ha.wait_master(after_epoch=info.master_epoch, timeout_s=60)
            await add(rng.randrange(100, 400))
            took = await batches_with_rows(fault.at_ms, 60)
            print(f"kill {k}: first batch with rows after it ended "
                  f"{'(query stopped)' if took is None else f'{took:.0f} ms'} later")  # fmt: skip
            if took is None:  # the query failed: restart it from its checkpoint, then go on
                q.stop()
                q = query().trigger(processingTime="200 milliseconds").start()
                took = await batches_with_rows(fault.at_ms, 120)
                assert took is not None, q.exception()
            recoveries.append(took)
        q.stop()
        # Whatever happened above, a run to the end from the checkpoint finishes the job.
        run_until_done(lambda: query().trigger(availableNow=True))

        # Every row of a finished query is acknowledged by the sink's commits: each row of
        # the files, or each message the source topic holds (a send of unknown outcome to it
        # may be there or not; the SDK's retry may have stored one twice).
        now = time.time() * 1000
        src_found: list[tuple[str, int]] = []
        if producer is not None:
            await producer.close()
            async with AsyncAdminClient(ha.namesrv) as admin:
                found_src = await read_back(admin, [SOURCE])
            src_report = check(src_history, found_src)
            src_report.assert_ok(max_duplicates=30 * KILLS, check_order=False)
            src_found = sorted(d.identity for d in found_src.delivered)
        seqs = range(len(rows)) if producer is None else sorted({s for _, s in src_found})
        for seq in seqs:
            history.acked(CLIENT, seq, TOPIC, "", -1, -1, now, done_ms=now)
        async with AsyncAdminClient(ha.namesrv) as admin:
            deadline = time.monotonic() + 10  # a committed row reaches the index a moment later
            while True:
                found = await read_back(admin, [TOPIC])
                report = check(history.snapshot(), found)
                if not report.lost or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
    finally:
        if producer is not None:
            await producer.close()
        if q is not None and q.isActive:
            q.stop()
        await ha.close()
        c.stop_all()

    print(f"{KILLS} kills; Spark sink, {len(rows)} rows: {report.summary()}; first batch after "
          f"a kill (ms) p50 {percentile(recoveries, 50):.0f} max {max(recoveries):.0f}")  # fmt: skip
    if producer is None:
        report.assert_ok(max_duplicates=0, check_order=False)
        assert report.delivered == len(rows) and found.foreign == 0, report.summary()
    else:  # as many copies of each message in the sink's topic as in the source topic
        report.assert_ok(max_duplicates=len(src_found) - len(seqs), check_order=False)
        assert sorted(d.identity for d in found.delivered) == src_found, report.summary()
        assert found.foreign == 0

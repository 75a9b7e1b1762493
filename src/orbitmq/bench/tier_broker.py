"""The tier benchmark's broker half: pull and a Spark batch read, hot then from the tier.

One data folder, two broker processes (``python -m orbitmq up`` on 127.0.0.1 free ports, stopped
by pid), the same messages:

1. **hot**: a broker with a directory tier but the usual local retention loads N messages of B
   bytes on Q queues (then pads another topic so the data's last CommitLog segment is full),
   and every queue is read from offset 0 by ``PULL_MESSAGE`` (queues in parallel, 256 messages
   a pull, each message decoded by the client as a pull consumer decodes it); then a Spark batch
   read of the topic into the ``noop`` sink. Everything is on the local disk.
2. **cold**: the broker restarts on the same folder with local retention 0 once uploaded; the
   benchmark waits until the tier holds every queue and the local segments are gone (every
   queue's local minimum at its maximum, seen through ``GET_TOPIC_STATS``), then the same pulls
   and the same Spark read, served from the directory tier (the chunk cache starts empty).

Each figure is the median of ``runs`` runs; every run checks it read exactly N messages (the
Spark read counts its rows once, untimed), so a read that lost data cannot look fast.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orbitmq.bench._child import ServerChild, process_cpu_s
from orbitmq.bench.cluster import load_topic, nothing, wait_dispatched
from orbitmq.client import AsyncAdminClient, AsyncProducer, Message, MessageQueue
from orbitmq.client.admin.types import PullStatus
from orbitmq.common.errors import ClientError

TOPIC = "BenchTierPull"
PAD_TOPIC = "BenchTierPad"
EVERY_HOUR = ";".join(str(h) for h in range(24))
MiB = 1024 * 1024
PULL_BATCH = 256
Say = Callable[[str], None]


@dataclass(slots=True)
class BrokerTierResult:
    count: int
    pull_hot_s: list[float] = field(default_factory=list)
    pull_cold_s: list[float] = field(default_factory=list)
    spark_hot_s: list[float] = field(default_factory=list)
    spark_cold_s: list[float] = field(default_factory=list)
    spark_skipped: str = ""
    chunks: int = 0
    pull_hot_cpu_s: list[float] = field(default_factory=list)
    pull_cold_cpu_s: list[float] = field(default_factory=list)

    def cpu_us(self, seconds: list[float]) -> float:
        """The broker's median CPU microseconds per message pulled (0: unknown)."""
        return statistics.median(seconds) / self.count * 1e6 if seconds else 0.0

    def rate(self, seconds: list[float]) -> float:
        return self.count / statistics.median(seconds) if seconds else 0.0


def _toml(store: dict[str, Any]) -> str:
    def value(v: Any) -> str:
        return f'"{v}"' if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)

    return "[store]\n" + "".join(f"{k} = {value(v)}\n" for k, v in store.items())


def _start(folder: Path, store: dict[str, Any], name: str) -> tuple[ServerChild, str]:
    config = folder / f"{name}.toml"
    config.write_text(_toml(store))
    child = ServerChild(
        [
            "orbitmq", "up", "--config", str(config), "--data-dir", str(folder / "data"),
            "--namesrv-port", "0", "--broker-port", "0", "--proxy-port", "-1",
            "--kafka-port", "-1", "--console-port", "-1", "--host", "127.0.0.1",
            "--log-level", "WARNING",
        ],
        folder / f"{name}.log",
        "orbitmq up ready ",
    )  # fmt: skip
    line = child.start(120.0)
    endpoints = dict(p.partition("=")[::2] for p in line.split())
    return child, endpoints["namesrv"]


def _no_spark() -> str:
    """Why Spark cannot run here, or "" when it can."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed"
    return "" if shutil.which("java") else "Java is not installed"


def _pid(child: ServerChild) -> int | None:
    return child.proc.pid if child.proc is not None else None


async def _routed(admin: AsyncAdminClient, topic: str, queues: int) -> list[MessageQueue]:
    deadline = time.monotonic() + 30
    while True:
        try:
            mqs = sorted(await admin.queues(topic), key=lambda mq: mq.queue_id)
            if len(mqs) == queues:
                return mqs
        except Exception:  # noqa: BLE001 - not routed yet
            pass
        if time.monotonic() > deadline:
            raise ClientError(f"topic {topic} never routed")
        await asyncio.sleep(0.1)


async def _pull_all(admin: AsyncAdminClient, mqs: list[MessageQueue]) -> int:
    """Every queue from 0 to its end, queues in parallel; the messages read (in order, no gap)."""

    async def one(mq: MessageQueue) -> int:
        offset, seen = 0, 0
        while True:
            res = await admin.pull(mq, offset, max_nums=PULL_BATCH, max_bytes=4 * MiB)
            if res.status is not PullStatus.FOUND:
                if res.status is PullStatus.NO_NEW_MSG:
                    return seen
                raise ClientError(f"pull {mq.queue_id}@{offset}: {res.status}")
            for m in res.messages:
                if m.queue_offset != seen:
                    raise ClientError(f"queue {mq.queue_id}: offset {m.queue_offset} at {seen}")
                seen += 1
            offset = res.next_begin_offset

    return sum(await asyncio.gather(*(one(mq) for mq in mqs)))


async def _timed_pulls(
    namesrv: str, queues: int, count: int, runs: int, into: list[float], cpu: list[float],
    pid: int | None,
) -> None:  # fmt: skip
    """``runs`` reads of the topic by pull: seconds into ``into``, the broker's CPU seconds
    into ``cpu`` (robust on a loaded machine, where wall time is not)."""
    async with AsyncAdminClient([namesrv]) as admin:
        mqs = await _routed(admin, TOPIC, queues)
        for _ in range(runs):
            c0, t0 = process_cpu_s(pid), time.perf_counter()
            got = await _pull_all(admin, mqs)
            into.append(time.perf_counter() - t0)
            c1 = process_cpu_s(pid)
            if c0 is not None and c1 is not None:
                cpu.append(c1 - c0)
            if got != count:
                raise ClientError(f"pulled {got} messages, expected {count}")


def _spark_reads(spark: Any, namesrv: str, count: int, runs: int, into: list[float]) -> None:
    from orbitmq.bench.spark import _noop_write, _source

    rows = _source(spark, namesrv, TOPIC, stream=False).count()
    if rows != count:
        raise ClientError(f"the Spark read returned {rows} rows, expected {count}")
    for _ in range(runs):
        t0 = time.perf_counter()
        _noop_write(_source(spark, namesrv, TOPIC, stream=False))
        into.append(time.perf_counter() - t0)


async def _load(namesrv: str, count: int, size: int, queues: int, segment: int) -> None:
    async with AsyncAdminClient([namesrv]) as admin:
        await admin.create_topic(TOPIC, read_queue_nums=queues, write_queue_nums=queues)
        await _routed(admin, TOPIC, queues)
        await load_topic(namesrv, TOPIC, count, size, 64, nothing, nothing)
        # Pad another topic past one segment so the data's last segment is a full one.
        pad = [Message(PAD_TOPIC, bytes(3000))] * 64
        async with AsyncProducer([namesrv]) as producer:
            for _ in range(segment // (64 * 3000) + 2):
                await producer.send_batch(pad)
        if await wait_dispatched(admin, TOPIC, count) < count:
            raise ClientError("dispatch did not catch up")


async def _wait_cold(namesrv: str, queues: int, timeout: float) -> None:
    """Until every queue's local data is gone and the tier starts at 0."""
    async with AsyncAdminClient([namesrv]) as admin:
        await _routed(admin, TOPIC, queues)
        deadline = time.monotonic() + timeout
        while True:
            stats = [q for s in await admin.topic_stats(TOPIC) for q in s.queues]
            if stats and all(
                s.min_offset == 0 and (s.local_min_offset or 0) >= s.max_offset for s in stats
            ):
                return
            if time.monotonic() > deadline:
                raise ClientError(f"local segments not deleted after {timeout:.0f} s: {stats}")
            await asyncio.sleep(0.5)


def run_broker_tier_bench(
    root: Path, count: int, size: int, queues: int, runs: int = 3, spark: bool = True,
    segment: int = 16 * MiB, say: Say = nothing, upload_ms: int = 1000, session: Any = None,
) -> BrokerTierResult:  # fmt: skip
    """Hot then cold pulls (and Spark batch reads unless ``spark`` is False or unavailable;
    on ``session`` when given, which is left running, else on a ``local[2]`` one made here)."""
    result = BrokerTierResult(count)
    own_session = session is None
    if own_session:
        result.spark_skipped = _no_spark() if spark else "--no-spark"
    store: dict[str, Any] = {
        "mapped_file_size_commit_log": segment,
        "max_message_size": min(4 * MiB, segment // 4),
        "tier_backend": "directory",
        "tier_path": str(root / "tier"),
        "tier_upload_interval_ms": upload_ms,
    }
    root.mkdir(parents=True, exist_ok=True)
    spark_tmp = Path(tempfile.mkdtemp(prefix="spark-", dir=root))
    try:
        if own_session and not result.spark_skipped:
            from orbitmq.bench.spark import _session

            say("starting Spark (local[2])")
            session = _session("local[2]", spark_tmp)
        child, ns = _start(root, store, "hot")
        try:
            say(f"hot broker up ({ns}); loading {count:,} x {size} B on {queues} queues")
            asyncio.run(_load(ns, count, size, queues, segment))
            asyncio.run(
                _timed_pulls(
                    ns, queues, count, runs, result.pull_hot_s, result.pull_hot_cpu_s, _pid(child)
                )
            )
            say(f"hot pull {result.rate(result.pull_hot_s):,.0f} msgs/s")
            if session is not None:
                _spark_reads(session, ns, count, runs, result.spark_hot_s)
                say(f"hot Spark read {result.rate(result.spark_hot_s):,.0f} rows/s")
        finally:
            child.stop(60.0)
        cold_store = store | {
            "tier_local_retention_ms": 0,
            "delete_when": EVERY_HOUR,
            "clean_resource_interval_ms": 200,
            "delete_commit_log_files_max_per_run": 100_000,
        }
        child, ns = _start(root, cold_store, "cold")
        try:
            say(f"cold broker up ({ns}); waiting for the upload and the local deletion")
            asyncio.run(_wait_cold(ns, queues, 600.0))
            result.chunks = sum(1 for _ in (root / "tier").glob(f"**/{TOPIC}/*/data/*"))
            asyncio.run(
                _timed_pulls(
                    ns, queues, count, runs, result.pull_cold_s, result.pull_cold_cpu_s, _pid(child)
                )
            )
            say(f"cold pull {result.rate(result.pull_cold_s):,.0f} msgs/s")
            if session is not None:
                _spark_reads(session, ns, count, runs, result.spark_cold_s)
                say(f"tier Spark read {result.rate(result.spark_cold_s):,.0f} rows/s")
        finally:
            child.stop(60.0)
    finally:
        if own_session and session is not None:
            session.stop()
    return result

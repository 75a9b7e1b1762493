"""``orbitmq bench kafka``: Kafka clients through the gateway beside the native SDK, one run.

Four timed steps on one cluster (a running one, or ``orbitmq up`` started here on free ports
with its Kafka listener): the native async SDK produces ``count`` messages (automatic batching)
and reads them back with pulls; confluent-kafka (librdkafka) produces ``count`` records through
the gateway (acks=all, idempotent, linger 5 ms) and a confluent-kafka consumer reads them back.
Each step reports messages per second; the ratio Kafka / native is what the gateway costs. The
native consume step pulls every queue in turn with the admin client (no consumer group), which
is the same broker path the gateway's Fetch takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orbitmq.bench._child import ServerChild
from orbitmq.client.admin.client import AsyncAdminClient
from orbitmq.client.admin.types import PullStatus
from orbitmq.client.producer.producer import AsyncProducer
from orbitmq.common.message import Message

Say = Callable[[str], None]


@dataclass(slots=True)
class KafkaBenchOptions:
    count: int = 100_000
    size: int = 1024
    partitions: int = 8
    namesrv: str | None = None
    bootstrap: str | None = None
    max_inflight_produce: int | None = None
    """The gateway's ``[kafka] max_inflight_produce`` for the ``orbitmq up`` started here
    (None: its default); 1 against the default is the A/B of pipelined Produce."""


@contextlib.contextmanager
def _cluster(opts: KafkaBenchOptions, say: Say) -> Iterator[tuple[str, str]]:
    if opts.namesrv and opts.bootstrap:
        yield opts.namesrv, opts.bootstrap
        return
    folder = Path(tempfile.mkdtemp(prefix="orbitmq-bench-kafka-"))
    extra: list[str] = []
    if opts.max_inflight_produce is not None:
        (folder / "kafka.toml").write_text(
            f"[kafka]\nmax_inflight_produce = {opts.max_inflight_produce}\n"
        )
        extra = ["--config", str(folder / "kafka.toml")]
    child = ServerChild(
        ["orbitmq", "up", "--namesrv-port", "0", "--broker-port", "0", "--kafka-port", "0",
         "--proxy-port", "-1", "--data-dir", str(folder), "--log-level", "WARNING", *extra],
        folder / "up.log",
        "orbitmq up ready ",
    )  # fmt: skip
    try:
        endpoints = dict(p.partition("=")[::2] for p in child.start(60).split())
        say(f"started orbitmq up: NameServer {endpoints['namesrv']}, Kafka {endpoints['kafka']}")
        yield endpoints["namesrv"], endpoints["kafka"]
    finally:
        child.stop(30)
        shutil.rmtree(folder, ignore_errors=True)


async def _native(namesrv: str, topic: str, opts: KafkaBenchOptions) -> tuple[float, float]:
    admin = await AsyncAdminClient((namesrv,)).start()
    producer = await AsyncProducer((namesrv,)).start()
    try:
        await admin.create_topic(
            topic, read_queue_nums=opts.partitions, write_queue_nums=opts.partitions
        )
        for _ in range(200):  # bounded: until routed
            with contextlib.suppress(Exception):
                if await admin.queues(topic):
                    break
            await asyncio.sleep(0.05)
        body = b"x" * opts.size
        t0 = time.perf_counter()
        futs = [producer.send_async(Message(topic, body)) for _ in range(opts.count)]
        await asyncio.gather(*futs)
        produce = opts.count / (time.perf_counter() - t0)
        queues = await admin.queues(topic)
        for _ in range(600):  # bounded: until every sent message is readable (dispatched)
            if sum([await admin.max_offset(q) for q in queues]) >= opts.count:
                break
            await asyncio.sleep(0.05)
        t0 = time.perf_counter()
        got = 0
        for mq in queues:
            offset = 0
            while True:
                res = await admin.pull(mq, offset, max_nums=512, max_bytes=4 << 20)
                if res.status is not PullStatus.FOUND:
                    break
                got += len(res.messages)
                offset = res.next_begin_offset
        consume = got / (time.perf_counter() - t0)
        return produce, consume
    finally:
        await producer.close()
        await admin.close()


def _confluent(bootstrap: str, topic: str, opts: KafkaBenchOptions) -> tuple[float, float]:
    try:
        import confluent_kafka
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]  # re-exported from cimpl at run time
    except ImportError as e:
        raise SystemExit(
            "orbitmq bench kafka needs confluent-kafka (pip install confluent-kafka)"
        ) from e
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, opts.partitions, 1)])[topic].result(30)
    p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                 "enable.idempotence": True, "linger.ms": 5})  # fmt: skip
    body = b"x" * opts.size
    t0 = time.perf_counter()
    for i in range(opts.count):
        while True:
            try:
                p.produce(topic, body, partition=i % opts.partitions)
                break
            except BufferError:
                p.poll(0.01)
    if p.flush(300) != 0:
        raise RuntimeError("confluent-kafka: records left unsent")
    produce = opts.count / (time.perf_counter() - t0)
    c = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{topic}",
                                 "auto.offset.reset": "earliest", "enable.auto.commit": False})  # fmt: skip
    c.subscribe([topic])
    got = 0
    t0 = 0.0
    deadline = time.monotonic() + 600
    while got < opts.count and time.monotonic() < deadline:
        for m in c.consume(1000, 1.0):
            if m.error() is None:
                if not got:
                    t0 = time.perf_counter()  # from the first record: the group join is not timed
                got += 1
    c.close()
    return produce, (got - 1) / max(1e-9, time.perf_counter() - t0)


def run_kafka_bench(opts: KafkaBenchOptions, say: Say) -> dict[str, Any]:
    suffix = str(int(time.time()))
    with _cluster(opts, say) as (namesrv, bootstrap):
        n_prod, n_cons = asyncio.run(_native(namesrv, f"bench-native-{suffix}", opts))
        k_prod, k_cons = _confluent(bootstrap, f"bench-kafka-{suffix}", opts)
    return {
        "count": opts.count, "size": opts.size, "partitions": opts.partitions,
        "max_inflight_produce": opts.max_inflight_produce,
        "native_produce": n_prod, "native_consume": n_cons,
        "kafka_produce": k_prod, "kafka_consume": k_cons,
    }  # fmt: skip


def format_report(r: dict[str, Any]) -> str:
    rows = [
        f"{r['count']:,} messages of {r['size']} B, {r['partitions']} partitions/queues"
        + (
            ""
            if r.get("max_inflight_produce") is None
            else f", gateway max_inflight_produce={r['max_inflight_produce']}"
        ),
        "                    produce msg/s   consume msg/s",
        f"native SDK          {r['native_produce']:>13,.0f}   {r['native_consume']:>13,.0f}",
        f"confluent-kafka     {r['kafka_produce']:>13,.0f}   {r['kafka_consume']:>13,.0f}",
        f"kafka / native      {r['kafka_produce'] / r['native_produce']:>13.0%}   "
        f"{r['kafka_consume'] / r['native_consume']:>13.0%}",
    ]
    return "\n".join(rows)

"""The official RocketMQ 5 Python client reads data only the tier holds: a broker process with
a tier (the directory backend, and a real S3 endpoint where one can run) and local retention 0 once uploaded deletes the topic's older CommitLog
segments; a SimpleConsumer (through the gRPC proxy) of a group set to offset 0 receives and
acks exactly the produced messages, the cold ones included. The issue's 10,000-message run is
``ORBITMQ_TIER_SCALE=1``; the suite sends 800."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orbitmq.client import AsyncAdminClient, BlockingAdminClient, Producer
from orbitmq.client.route import MessageQueue
from orbitmq.common.message import Message
from tests.compat.conftest import Orbit, need_official_client, unique
from tests.harness import ProcessCluster
from tests.store.tier.swift import BACKENDS, TierSettings, tier_backend

SCALE = os.environ.get("ORBITMQ_TIER_SCALE") == "1"
PER_QUEUE = 2_500 if SCALE else 200
QUEUES = 4
EVERY_HOUR = ";".join(str(h) for h in range(24))


@pytest.fixture(scope="module", params=BACKENDS)
def tiered(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Orbit]:
    """A broker tiering to the directory backend, then to a real S3 endpoint (Swift's s3api;
    skipped with the reason where it cannot run: tests/store/tier/swift.py)."""
    need_official_client()
    base = tmp_path_factory.mktemp("compat-tier")
    with tier_backend(request.param, base / "s3") as tier:
        yield from _tiered(base, tier)


def _tiered(base: Path, tier: TierSettings) -> Iterator[Orbit]:
    cluster = ProcessCluster(base)
    admin: BlockingAdminClient | None = None
    try:
        ns = cluster.namesrv()
        store = {
            "mapped_file_size_commit_log": 64 * 1024 + 8 * 1024,
            "max_message_size": 4096,
            **tier(base),
            "tier_upload_interval_ms": 200,
            "tier_chunk_max_messages": 64,
            "tier_local_retention_ms": 0,
            "delete_when": EVERY_HOUR,
            "clean_resource_interval_ms": 200,
        }
        broker = cluster.broker("broker-a", [ns.address], settings={"store": store})
        proxy = cluster.proxy([ns.address])
        admin = BlockingAdminClient(ns.address)
        yield Orbit(base, cluster, ns.address, broker, proxy, admin)
    finally:
        if admin is not None:
            admin.close()
        cluster.stop_all()


def body(q: int, i: int) -> bytes:
    return f"cold-q{q}-{i:05d}-".encode() * 40


def test_official_simple_consumer_reads_tiered_messages(tiered: Orbit) -> None:
    topic = tiered.topic(unique("CompatCold"), queues=QUEUES)
    with Producer(tiered.namesrv) as p:
        for at in range(0, PER_QUEUE, 50):  # queues interleaved: each spans the segments
            for q in range(QUEUES):
                msgs = [Message(topic, body(q, i)) for i in range(at, at + 50)]
                p.send_batch(msgs, queue=MessageQueue(topic, "broker-a", q))
    deadline = time.monotonic() + (600 if SCALE else 60)
    while True:  # uploaded, and the local segments below deleted
        stats = tiered.admin.topic_stats(topic)[0].queues
        if all((s.local_min_offset or 0) > PER_QUEUE // 2 for s in stats):
            assert all(s.min_offset == 0 for s in stats)
            break
        assert time.monotonic() < deadline, stats
        time.sleep(0.2)
    total = QUEUES * PER_QUEUE
    # A new group starts at the end of a queue whose first message is not in memory
    # (RocketMQ's first-consume rule; tiered data is not): the group is set to offset 0.
    group = unique("CompatColdG")

    async def start_at_zero() -> None:
        async with AsyncAdminClient([tiered.namesrv]) as admin:
            queues = [MessageQueue(topic, "broker-a", q) for q in range(QUEUES)]
            await admin.commit_offsets(group, dict.fromkeys(queues, 0))

    asyncio.run(start_at_zero())
    out = tiered.run(
        [
            {"op": "simple_consumer", "name": "c", "group": group,
             "topics": {topic: "*"}, "await_s": 2},
            {"op": "receive", "consumer": "c", "expect": total, "max": 32,
             "timeout_s": 600 if SCALE else 60, "idle_s": 1},
        ],
        timeout=900 if SCALE else 120,
    )  # fmt: skip
    got = [m["body"] for m in out["results"][1]["messages"]]
    assert len(got) == total  # each once: acked, never redelivered within the run
    want = sorted(body(q, i).decode() for q in range(QUEUES) for i in range(PER_QUEUE))
    assert sorted(got) == want

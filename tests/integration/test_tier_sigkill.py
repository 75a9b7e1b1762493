"""SIGKILL mid-upload, restart with the object store down (the issue's test): a broker process
tiering to a directory is killed while a chunk is half uploaded (its data object is in, the
manifest naming it is not), restarts while the tier is unreachable, serves hot reads within
10 s and answers cold reads with a retryable error; once the tier is back it catches up, and
every queue's chunks are exactly the ones its manifest names, back to back: no duplicate, no
overlap, no orphan; every acknowledged message reads back once.

"Down" is the tier folder (a symlink) pointing at a regular file: every call fails, and the
empty listing is not mistaken for an empty tier (store/tier/identity.py).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import threading
import time
from pathlib import Path

import pytest

from orbitmq.client import AsyncAdminClient, BlockingAdminClient, Message, MessageQueue, Producer
from orbitmq.client.admin.types import PullStatus
from orbitmq.common.errors import MQError
from orbitmq.store.tier.layout import parse_chunk_name
from tests.harness import ProcessCluster, ServerProcess

QUEUES = 4
TOPIC = "Killed"
EVERY_HOUR = ";".join(str(h) for h in range(24))


def body(q: int, i: int) -> bytes:
    head = f"kill-q{q}-{i:06d}-".encode()
    return head + b"k" * (1024 - len(head))


def point(link: Path, target: Path) -> None:
    """Switch the tier symlink atomically."""
    tmp = link.with_name(link.name + ".new")
    os.symlink(target, tmp)
    os.replace(tmp, link)


def orphans(root: Path) -> list[str]:
    """Chunk objects no manifest names (an upload between its data and its manifest)."""
    out = []
    for manifest in root.glob(f"*/*/{TOPIC}/*/manifest.json"):
        try:
            named = {(c["base"], c["end"]) for c in json.loads(manifest.read_bytes())["chunks"]}
        except (OSError, ValueError, KeyError):
            continue
        for kind in ("data", "index", "keys"):
            folder = manifest.parent / kind
            names = os.listdir(folder) if folder.is_dir() else []
            for name in names:
                span = parse_chunk_name(f"{kind}/{name}")
                if span is not None and span not in named:
                    out.append(str(folder / name))
    return out


def kill_mid_upload(
    broker: ServerProcess, root: Path, first_segment: Path, stop: threading.Event
) -> dict[str, object]:
    """Once the first local segment is gone (some data only the tier holds), poll the tier and
    SIGKILL the broker the moment a chunk object is in without its manifest."""
    seen: dict[str, object] = {"mid_upload": False}
    deadline = time.monotonic() + 30
    while not first_segment.exists() and time.monotonic() < deadline:
        time.sleep(0.005)  # created by the first send
    while first_segment.exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    while not stop.is_set() and time.monotonic() < deadline:
        if orphans(root):
            broker.kill()
            seen["mid_upload"] = True
            break
        time.sleep(0.001)
    else:
        broker.kill()  # uploads never caught in the act: killed while they run anyway
    seen["orphans_after_kill"] = len(orphans(root))
    return seen


async def pull_range(admin: AsyncAdminClient, q: int, offset: int, n: int) -> list[bytes]:
    res = await admin.pull(MessageQueue(TOPIC, "broker-a", q), offset, max_nums=n)
    assert res.status is PullStatus.FOUND, res.status
    return [m.body for m in res.messages]


@pytest.mark.timeout(180)
def test_sigkill_mid_upload_then_restart_with_the_store_down(tmp_path: Path) -> None:
    real, down, link = tmp_path / "tier-real", tmp_path / "down", tmp_path / "tier"
    real.mkdir()
    down.write_bytes(b"the tier's disk is gone\n")
    os.symlink(real, link)
    cluster = ProcessCluster(tmp_path)
    try:
        ns = cluster.namesrv()
        store = {
            "mapped_file_size_commit_log": 256 * 1024,
            "max_message_size": 4096,
            "tier_backend": "directory",
            "tier_path": str(link),
            "tier_upload_interval_ms": 50,
            "tier_chunk_max_messages": 100,
            "tier_local_retention_ms": 0,
            "delete_when": EVERY_HOUR,
            "clean_resource_interval_ms": 200,
        }
        broker = cluster.broker("broker-a", [ns.address], settings={"store": store})
        first = tmp_path / "broker-a" / "commitlog" / f"{0:020d}"
        acked: dict[int, int] = dict.fromkeys(range(QUEUES), 0)
        with BlockingAdminClient(ns.address) as admin:
            admin.create_topic(TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
        stop = threading.Event()
        seen: dict[str, object] = {}
        killer = threading.Thread(
            target=lambda: seen.update(kill_mid_upload(broker, real, first, stop)), daemon=True
        )
        with Producer(ns.address) as p:
            killer.start()
            for i in range(0, 20_000, 50):  # until the broker dies
                if not broker.running:
                    break
                q = (i // 50) % QUEUES
                first = acked[q]
                try:
                    p.send_batch([Message(TOPIC, body(q, first + j)) for j in range(50)],
                                 queue=MessageQueue(TOPIC, "broker-a", q))  # fmt: skip
                except MQError:
                    break
                acked[q] = first + 50
        stop.set()
        killer.join(40)
        assert not broker.running
        print(f"killed: {seen}; acknowledged {acked}")
        point(link, down)  # the store is down, then the broker restarts
        t0 = time.monotonic()
        broker.restart(timeout=30)
        ready = time.monotonic()

        async def while_down() -> float:
            async with AsyncAdminClient([ns.address]) as admin:
                hot_at = 0.0
                for _ in range(400):  # hot reads: the newest messages of every queue
                    try:
                        for q in range(QUEUES):
                            got = await pull_range(admin, q, acked[q] - 8, 8)
                            assert got == [body(q, i) for i in range(acked[q] - 8, acked[q])]
                        hot_at = time.monotonic() - ready
                        break
                    except MQError:
                        await asyncio.sleep(0.05)
                stats = (await admin.topic_stats(TOPIC))[0].queues
                cold = [s for s in stats if (s.local_min_offset or 0) > 0]
                print(f"with the store down: local minimums {[s.local_min_offset for s in stats]}")
                for s in cold:  # a read of what only the tier holds: retryable
                    with pytest.raises(MQError) as info:
                        await admin.pull(MessageQueue(TOPIC, "broker-a", s.queue_id), 0)
                    assert info.value.retriable, info.value
                return hot_at

        hot_after = asyncio.run(while_down())
        print(f"with the store down: the restarted broker was ready {ready - t0:.1f} s after "
              f"its launch and served hot reads {hot_after:.1f} s after that")  # fmt: skip
        # Ready and serving without the store: the launch (the interpreter and its imports)
        # varies with the machine's load, the wait for the tier must not exist.
        assert ready - t0 < 30 and 0 < hot_after < 10
        point(link, real)  # the store is back

        async def after() -> None:
            async with AsyncAdminClient([ns.address]) as admin:
                deadline = time.monotonic() + 60
                while True:  # uploaded up to what was acknowledged, local copies deleted
                    stats = (await admin.topic_stats(TOPIC))[0].queues
                    if all((s.tier_max_offset or 0) >= acked[s.queue_id] for s in stats):
                        break
                    assert time.monotonic() < deadline, stats
                    await asyncio.sleep(0.2)
                for q in range(QUEUES):
                    offset, got = 0, []
                    for _ in range(1000):
                        if offset >= acked[q]:
                            break
                        res = await admin.pull(MessageQueue(TOPIC, "broker-a", q), offset,
                                               max_nums=64)  # fmt: skip
                        assert res.status is PullStatus.FOUND, (q, offset, res.status)
                        got += [m.body for m in res.messages]
                        offset = res.next_begin_offset
                    assert got[: acked[q]] == [body(q, i) for i in range(acked[q])], q

        asyncio.run(after())
        for manifest in real.glob(f"*/*/{TOPIC}/*/manifest.json"):
            spans = [(c["base"], c["end"]) for c in json.loads(manifest.read_bytes())["chunks"]]
            assert spans and spans[0][0] == 0, (manifest, spans)
            assert all(a[1] == b[0] for a, b in itertools.pairwise(spans)), spans  # no overlap
            for kind in ("data", "index", "keys"):
                names = sorted(os.listdir(manifest.parent / kind))
                found = [parse_chunk_name(f"{kind}/{n}") for n in names]
                assert sorted(found) == sorted(spans), (kind, found, spans)  # no orphan left
    finally:
        cluster.stop_all()

"""Console queries over 10,000 messages: by id, by key and by time each answer in under a
second (best of three, the machine being shared), and a paged time scan of a window returns
each of its messages exactly once."""

from __future__ import annotations

import asyncio
import re
import time

import pytest
from starlette.testclient import TestClient

from orbitmq.client import Message
from orbitmq.console.app import create_app
from orbitmq.console.config import ConsoleConfig
from tests.console.conftest import TOPIC, Cluster

pytestmark = pytest.mark.timeout(180)
TOTAL = 10_000


def best_of(n: int, fn: object) -> tuple[float, str]:
    assert callable(fn)
    best, text = float("inf"), ""
    for _ in range(n):
        started = time.perf_counter()
        text = fn()
        best = min(best, time.perf_counter() - started)
    return best, text


async def test_queries_over_ten_thousand_messages(cluster: Cluster) -> None:
    queues = sorted(await cluster.admin.queues(TOPIC), key=lambda q: q.queue_id)
    ids: list[str] = []
    for start in range(0, TOTAL, 500):
        batch = [Message(TOPIC, f"q-{i}".encode(), keys=(f"qk-{i}",))
                 for i in range(start, start + 500)]  # fmt: skip
        result = await cluster.producer.send_batch(batch, queue=queues[start // 500 % 2])
        ids += result.msg_id.split(",")
    assert len(ids) == TOTAL
    total = 0
    for _ in range(200):  # bounded: the last batches' ConsumeQueue entries
        total = sum([await cluster.admin.max_offset(mq) for mq in queues])
        if total >= TOTAL:
            break
        await asyncio.sleep(0.05)
    assert total == TOTAL
    window_start = int(time.time() * 1000)
    await asyncio.sleep(0.01)
    tail = [Message(TOPIC, f"tail-{i}".encode(), keys=(f"tail-{i}",)) for i in range(120)]
    await cluster.producer.send_batch(tail[:60], queue=queues[0])
    await cluster.producer.send_batch(tail[60:], queue=queues[1])

    def run() -> None:
        cfg = ConsoleConfig(
            namesrv_addrs=(cluster.namesrv,), port=0, audit_log=str(cluster.tmp / "audit.jsonl")
        )
        with TestClient(create_app(cfg)) as web:
            target = 7_777

            def by_id() -> str:
                return web.get("/messages", params={"topic": TOPIC, "msg_id": ids[target]}).text

            def by_key() -> str:
                return web.get("/messages", params={"topic": TOPIC, "key": f"qk-{target}"}).text

            def by_time() -> str:
                return web.get("/messages", params={"topic": TOPIC, "since": "3600"}).text

            for name, fn, want in (("id", by_id, f"q-{target}"), ("key", by_key, f"q-{target}"),
                                   ("time", by_time, "q-0")):  # fmt: skip
                elapsed, text = best_of(3, fn)
                assert f"<pre>{want}</pre>" in text, name
                assert elapsed < 1.0, (name, elapsed)
            # A paged scan from just before the tail: the 120 tail messages, each once.
            since = f"{(time.time() * 1000 - window_start) / 1000:.3f}"
            seen: list[str] = []
            url = f"/messages?topic={TOPIC}&since={since}"
            for _ in range(20):  # bounded
                page = web.get(url).text
                seen += re.findall(r"<pre>(tail-\d+)</pre>", page)
                nxt = re.search(r'id="next" href="([^"]+)"', page)
                if not nxt:
                    break
                url = nxt.group(1).replace("&amp;", "&")
            assert sorted(seen) == sorted(f"tail-{i}" for i in range(120))

    await asyncio.to_thread(run)

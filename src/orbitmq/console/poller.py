"""One sampler per console: lag of every group and the produce rate of every topic, each
`poll_interval_ms`, kept in rings of `history_s` for the charts and pushed to every open page.

Lag is counted as RocketMQ's console counts it: per queue, the broker's max offset minus the
group's committed offset, summed over the group's queues (retry topics included). The lag in
time is now minus the store time of the oldest message not yet committed (one one-message pull
per lagging queue). A topic's rate is the growth of the sum of its queues' max offsets per
second between two samples. Subscribers are asyncio queues; a slow page loses samples, never
blocks the sampler (each queue holds at most a few events).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from orbitmq.client.admin.client import AsyncAdminClient
from orbitmq.client.admin.types import PullStatus
from orbitmq.client.route import MessageQueue
from orbitmq.common.clock import now_ms

log = logging.getLogger(__name__)
SYSTEM_PREFIXES = (
    "rmq_sys_",
    "RMQ_SYS_",
    "SCHEDULE_TOPIC",
    "TBW102",
    "OFFSET_MOVED_EVENT",
    "TRANS_CHECK_MAX_TIME_TOPIC",
    "DefaultCluster",
)


def is_system_topic(topic: str) -> bool:
    return topic.startswith(SYSTEM_PREFIXES)


@dataclass(slots=True)
class GroupSample:
    lag: int
    lag_ms: int
    members: int
    topics: list[str]


@dataclass(slots=True)
class Snapshot:
    at_ms: int = 0
    groups: dict[str, GroupSample] = field(default_factory=dict)
    rates: dict[str, float] = field(default_factory=dict)
    totals: dict[str, int] = field(default_factory=dict)


class Poller:
    def __init__(self, admin: AsyncAdminClient, interval_ms: int, history_s: int) -> None:
        self.admin = admin
        self.interval_s = interval_ms / 1000
        size = max(2, int(history_s / self.interval_s))
        self.lag_history: dict[str, deque[tuple[float, int]]] = {}
        self.rate_history: dict[str, deque[tuple[float, float]]] = {}
        self._size = size
        self.latest = Snapshot()
        self._subscribers: set[asyncio.Queue[dict[str, Any]]] = set()
        self._prev_totals: dict[str, tuple[float, int]] = {}
        self.samples = 0
        self.errors = 0

    def subscribe(self) -> asyncio.Queue[dict[str, Any]]:
        q: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=4)
        self._subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[dict[str, Any]]) -> None:
        self._subscribers.discard(q)

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.sample()
            except Exception as e:  # noqa: BLE001  # a cluster hiccup: next tick tries again
                self.errors += 1
                log.warning("console sample failed: %s", e)
            await asyncio.sleep(max(0.05, self.interval_s - (time.monotonic() - started)))

    async def sample(self) -> Snapshot:
        t = time.time()
        snap = Snapshot(at_ms=now_ms())
        topics = [x for x in await self.admin.list_topics() if not is_system_topic(x)]
        for topic in topics[:500]:
            with contextlib.suppress(Exception):
                stats = await self.admin.topic_stats(topic)
                snap.totals[topic] = sum(q.max_offset for s in stats for q in s.queues)
        for topic, total in snap.totals.items():
            prev = self._prev_totals.get(topic)
            rate = (
                0.0 if prev is None or t <= prev[0] else max(0.0, (total - prev[1]) / (t - prev[0]))
            )
            self._prev_totals[topic] = (t, total)
            snap.rates[topic] = rate
            self.rate_history.setdefault(topic, deque(maxlen=self._size)).append((t, rate))
        for summary in (await self.admin.list_groups())[:500]:
            with contextlib.suppress(Exception):
                snap.groups[summary.group] = await self._group(summary.group, summary.members)
        for group, gs in snap.groups.items():
            self.lag_history.setdefault(group, deque(maxlen=self._size)).append((t, gs.lag))
        self.latest = snap
        self.samples += 1
        event = {
            "t": t,
            "lags": {g: (s.lag, s.lag_ms) for g, s in snap.groups.items()},
            "rates": snap.rates,
        }
        for q in list(self._subscribers):
            if q.full():
                with contextlib.suppress(asyncio.QueueEmpty):
                    q.get_nowait()
            q.put_nowait(event)
        return snap

    async def _group(self, group: str, members: int) -> GroupSample:
        stats = await self.admin.consume_stats(group)
        lag = sum(max(0, q.lag) for q in stats)
        oldest: int | None = None
        for q in stats:
            if q.lag <= 0 or q.consumer_offset < 0:
                continue
            mq = MessageQueue(q.topic, q.broker_name, q.queue_id)
            with contextlib.suppress(Exception):
                res = await self.admin.pull(mq, q.consumer_offset, max_nums=1)
                if res.status is PullStatus.FOUND and res.messages:
                    ts = res.messages[0].store_timestamp_ms
                    oldest = ts if oldest is None else min(oldest, ts)
        lag_ms = 0 if oldest is None else max(0, now_ms() - oldest)
        return GroupSample(lag, lag_ms, members, sorted({q.topic for q in stats}))

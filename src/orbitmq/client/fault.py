"""Latency fault tolerance: keep sends away from brokers that just failed or are slow.

After every send the producer reports the broker's latency (or its failure). A slow answer makes
the broker "not available" for a while, on a step table like RocketMQ's MQFaultStrategy:

    latency >=    50   100    550    1000    2000    3000    15000  ms
    avoid for      0     0  30000   60000  120000  180000   600000  ms

and a failure (connection error, timeout, retriable error answer) avoids it for 30 s. Queue
selection walks the topic's queues round-robin and takes the first whose broker is available
(and, on a retry, not the broker that just failed); when none is, it takes any queue rather than
fail, preferring a broker other than the last one.

Not thread-safe: a producer uses it from its event loop only.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from orbitmq.client.route import MessageQueue
from orbitmq.common.errors import ClientError

LATENCY_MAX_MS: tuple[int, ...] = (50, 100, 550, 1000, 2000, 3000, 15000)
NOT_AVAILABLE_MS: tuple[int, ...] = (0, 0, 30000, 60000, 120000, 180000, 600000)
FAILURE_ISOLATION_MS = 30_000


@dataclass(slots=True)
class FaultItem:
    broker_name: str
    latency_ms: float
    available_at_ms: float


class LatencyFaultTolerance:
    """Which brokers to avoid, and until when."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._clock = clock or (lambda: time.monotonic() * 1000.0)
        self._items: dict[str, FaultItem] = {}

    def now_ms(self) -> float:
        return self._clock()

    def update(self, broker_name: str, latency_ms: float, not_available_ms: float) -> None:
        available_at = self._clock() + not_available_ms
        item = self._items.get(broker_name)
        if item is None:
            self._items[broker_name] = FaultItem(broker_name, latency_ms, available_at)
        else:
            item.latency_ms = latency_ms
            item.available_at_ms = available_at

    def is_available(self, broker_name: str) -> bool:
        item = self._items.get(broker_name)
        return item is None or self._clock() >= item.available_at_ms

    def remove(self, broker_name: str) -> None:
        self._items.pop(broker_name, None)

    def item(self, broker_name: str) -> FaultItem | None:
        return self._items.get(broker_name)


class FaultStrategy:
    """Round-robin queue selection that skips brokers the fault table says to avoid.

    ``enabled=False`` keeps plain round-robin (still avoiding the last failed broker on a retry).
    """

    def __init__(
        self,
        *,
        enabled: bool = True,
        latency_max_ms: Sequence[int] = LATENCY_MAX_MS,
        not_available_ms: Sequence[int] = NOT_AVAILABLE_MS,
        failure_isolation_ms: int = FAILURE_ISOLATION_MS,
        clock: Callable[[], float] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if len(latency_max_ms) != len(not_available_ms):
            raise ValueError("latency_max_ms and not_available_ms differ in length")
        if list(latency_max_ms) != sorted(latency_max_ms):
            raise ValueError("latency_max_ms must be ascending")
        self.enabled = enabled
        self.latency_max_ms = tuple(latency_max_ms)
        self.not_available_ms = tuple(not_available_ms)
        self.failure_isolation_ms = failure_isolation_ms
        self.tolerance = LatencyFaultTolerance(clock)
        self._rng = rng or random.Random()
        self._index: dict[str, int] = {}

    def not_available_duration(self, latency_ms: float) -> int:
        for bound, duration in zip(
            reversed(self.latency_max_ms), reversed(self.not_available_ms), strict=True
        ):
            if latency_ms >= bound:
                return duration
        return 0

    def update(self, broker_name: str, latency_ms: float, *, failed: bool = False) -> None:
        """Record one send's outcome on ``broker_name``."""
        if not self.enabled:
            return
        duration = self.failure_isolation_ms if failed else self.not_available_duration(latency_ms)
        self.tolerance.update(broker_name, latency_ms, duration)

    def is_available(self, broker_name: str) -> bool:
        return not self.enabled or self.tolerance.is_available(broker_name)

    def _next(self, topic: str) -> int:
        i = self._index.get(topic)
        if i is None:
            i = self._rng.randrange(1 << 16)
        self._index[topic] = (i + 1) & 0x7FFFFFFF
        return i

    def select_queue(
        self, topic: str, queues: Sequence[MessageQueue], last_broker: str | None = None
    ) -> MessageQueue:
        """The next queue round-robin whose broker is available and is not ``last_broker``.

        Falls back to an available queue on ``last_broker``, then to any queue on another broker,
        then to any queue at all.
        """
        n = len(queues)
        if n == 0:
            raise ClientError(f"topic {topic!r} has no writable queue")
        # Every probe advances the index, so skipping a broker does not pile its share onto
        # the next queue.
        for _ in range(n):
            mq = queues[self._next(topic) % n]
            if mq.broker_name != last_broker and self.is_available(mq.broker_name):
                return mq
        start = self._next(topic)
        order = [queues[(start + k) % n] for k in range(n)]
        for mq in order:
            if self.is_available(mq.broker_name):
                return mq
        for mq in order:
            if mq.broker_name != last_broker:
                return mq
        return order[0]

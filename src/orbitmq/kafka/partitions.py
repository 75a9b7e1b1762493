"""Kafka partitions of an OrbitMQ topic: its readable queues, sorted by (broker, queue id).

Partition p of topic T is the p-th queue of T's route in that order, so every gateway of a
cluster numbers them the same way. Routes are cached for `ttl_s` (a NameServer round trip per
request would dominate Produce) and re-read at once when a call finds them stale. A name that is
not a valid OrbitMQ topic (kafka/names.py) is a topic that does not exist: it is never sent to a
NameServer, which would refuse it with an error the Kafka answer has no place for.
"""

from __future__ import annotations

import time

from orbitmq.client.admin.client import AsyncAdminClient
from orbitmq.client.route import MessageQueue, TopicRouteNotFoundError
from orbitmq.common.errors import InvalidTopicError
from orbitmq.common.validation import validate_topic


class Partitions:
    def __init__(self, admin: AsyncAdminClient, ttl_s: float = 5.0) -> None:
        self.admin = admin
        self.ttl_s = ttl_s
        self._cache: dict[str, tuple[float, list[MessageQueue]]] = {}

    async def of(self, topic: str, *, fresh: bool = False) -> list[MessageQueue] | None:
        """The topic's partitions, or None when no NameServer knows the topic."""
        now = time.monotonic()
        hit = self._cache.get(topic)
        if hit is not None and not fresh and now - hit[0] < self.ttl_s:
            return hit[1]
        try:
            validate_topic(topic)
            queues = sorted(
                await self.admin.queues(topic), key=lambda q: (q.broker_name, q.queue_id)
            )
        except (TopicRouteNotFoundError, InvalidTopicError):
            self._cache.pop(topic, None)
            return None
        if not queues:
            return None
        self._cache[topic] = (now, queues)
        return queues

    async def queue(self, topic: str, partition: int) -> MessageQueue | None:
        parts = await self.of(topic)
        if parts is None or not 0 <= partition < len(parts):
            parts = await self.of(topic, fresh=True)
        if parts is None or not 0 <= partition < len(parts):
            return None
        return parts[partition]

    def forget(self, topic: str) -> None:
        self._cache.pop(topic, None)

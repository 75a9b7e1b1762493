"""Shared subscriptions (``$share/{group}/{filter}``, 5.0 §4.8.2) as consumer groups.

One :class:`SharedGroup` per distinct shared filter, whoever subscribes to it: it has its own
read positions (journaled as ``g:<$share/group/filter>``), reads the OrbitMQ topics the filter
can match and hands each matching message to exactly one connected member, round robin among
those with a free Receive Maximum slot (QoS 0: any connected member). With no member connected
it does not read: messages wait in the store, as they do for an OrbitMQ consumer group.

A message handed to a member is that member's in-flight message (resent to it on reconnect,
as the specification allows). When a member's session ends with such messages unacknowledged
(a clean session whose client was killed, an expired one), they go back to the group and are
sent to another member: none is lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from orbitmq.mqtt.context import GatewayContext, filter_topics
from orbitmq.mqtt.delivery import IDLE_WAIT_S, Deliverer
from orbitmq.mqtt.mapping import outbound
from orbitmq.mqtt.session import Inflight, cursor_key
from orbitmq.protocol.mqtt.topics import matches, parse_shared

log = logging.getLogger(__name__)


class SharedGroup:
    def __init__(self, ctx: GatewayContext, key: str, cursors: dict[str, int]) -> None:
        shared = parse_shared(key)
        assert shared is not None
        self.ctx = ctx
        self.key = key
        self.filter = shared.filter
        self.cursors = cursors
        self.subscribers: set[str] = set()
        """Client ids whose sessions hold this subscription (connected or not)."""
        self.members: list[Deliverer] = []
        """Connected members, in join order."""
        self.pending: deque[tuple[str, int, int]] = deque()
        """Messages (topic, queue, offset) taken back from ended sessions, sent first."""
        self.wake = asyncio.Event()
        self.closed = False
        self._next = 0

    def start_positions(self) -> None:
        for topic in self.ctx.topics_of(
            filter_topics([self.filter], self.ctx.config.fallback_topic)
        ):
            for q in range(self.ctx.access.queues(topic)):
                self.cursors.setdefault(cursor_key(topic, q), self.ctx.access.max_offset(topic, q))
        self.save()

    def save(self) -> None:
        self.ctx.journal.put(
            "g:" + self.key, {"cursors": self.cursors, "pending": list(self.pending)}
        )

    def join(self, member: Deliverer) -> None:
        if member not in self.members:
            self.members.append(member)
        self.wake.set()

    def leave(self, member: Deliverer) -> None:
        if member in self.members:
            self.members.remove(member)

    def take_back(self, entries: list[Inflight]) -> None:
        for e in entries:
            self.pending.append((e.topic, e.queue_id, e.offset))
        if entries:
            self.save()
            self.wake.set()

    def _pick(self, qos: int) -> Deliverer | None:
        n = len(self.members)
        for i in range(n):
            m = self.members[(self._next + i) % n]
            if not m.closed and (qos == 0 or m.can_send()):
                self._next = (self._next + i + 1) % n
                return m
        return None

    def _hand(self, topic: str, q: int, offset: int, o_msg: object) -> bool:
        """Send one stored message to a member; False when none has room."""
        o = outbound(o_msg)  # type: ignore[arg-type]  # a StoredMessage
        if not matches(self.filter, o.topic):
            return True
        member = self._pick(o.qos)
        if member is None:
            return False
        sub = member.session.subs.get(self.key)
        if sub is None:
            return True
        entry = Inflight(0, topic, q, offset, group=self.key)
        qos = min(o.qos, sub.qos)
        ids = (sub.sub_id,) if sub.sub_id and member.conn.version == 5 else ()
        member.send(o, qos, o.retain and sub.retain_as_published, ids, entry)
        member.flush()
        return True

    async def run(self) -> None:
        keys: set[str] = set()
        try:
            while not self.closed:
                self.wake.clear()
                keys = filter_topics([self.filter], self.ctx.config.fallback_topic)
                self.ctx.hub.watch(self.wake, keys)
                moved = await self.pump(keys) if self.members else False
                if not moved:
                    try:
                        async with asyncio.timeout(IDLE_WAIT_S):
                            await self.wake.wait()
                    except TimeoutError:
                        pass
        finally:
            self.ctx.hub.unwatch(self.wake)

    async def pump(self, keys: set[str]) -> bool:
        access = self.ctx.access
        moved = False
        while self.pending:
            topic, q, offset = self.pending[0]
            m = await access.read_one(topic, q, offset)
            if m is not None and not self._hand(topic, q, offset, m):
                return moved
            self.pending.popleft()
            self.save()
            moved = True
        for topic in self.ctx.topics_of(keys):
            for q in range(access.queues(topic)):
                key = cursor_key(topic, q)
                cur = self.cursors.get(key, 0)
                if cur >= access.max_offset(topic, q):
                    continue
                msgs, nxt = await access.read(topic, q, cur)
                for m in msgs:
                    if not self._hand(topic, q, m.queue_offset, m):
                        nxt = m.queue_offset
                        break
                if nxt != cur:
                    self.cursors[key] = nxt
                    self.save()
                    moved = True
        return moved

"""Broker liveness as one controller node sees it: in memory, never in the Raft log.

Brokers send BROKER_HEARTBEAT to every controller node every 500 ms (docs/ha.md), so every node,
leader or not, knows who is alive; a new Raft leader does not start blind. Liveness is not
replicated (RocketMQ keeps it out of its log too): it changes every half second and means
"this node heard from the broker recently", which is a fact about this node.

A broker is alive while its last heartbeat is younger than ``timeout_s`` and the connection it
last used has not closed. A closed connection makes it dead at once, but keeps its last-heartbeat
time: the election delay counts from that time, not from the close (brief 5.7(d)).

The epoch floor of a group is the highest master epoch any of its brokers ever reported to this
node (dead ones included); elections issue epochs above it.
"""

from __future__ import annotations

from dataclasses import dataclass

from orbitmq.common.clock import SYSTEM_CLOCK, Clock
from orbitmq.controller.election import DEFAULT_PRIORITY, Candidate


@dataclass(slots=True)
class Liveness:
    broker_name: str
    broker_id: int
    address: str
    last_seen: float
    """Monotonic seconds of the last heartbeat."""
    epoch: int = 0
    max_offset: int = 0
    confirm_offset: int = 0
    priority: int = DEFAULT_PRIORITY
    channel: object | None = None
    """The connection the last heartbeat came on (to notify the broker on)."""
    closed: bool = False
    replica_lag: dict[int, tuple[int, int]] | None = None
    """From a master: slave id -> (lag bytes, lag ms), as its last heartbeat said."""

    def candidate(self) -> Candidate:
        return Candidate(self.broker_id, self.epoch, self.max_offset, self.priority)


class Heartbeats:
    def __init__(self, timeout_s: float, *, clock: Clock = SYSTEM_CLOCK) -> None:
        if timeout_s <= 0:
            raise ValueError("heartbeat timeout must be positive")
        self.timeout_s = timeout_s
        self.clock = clock
        self.started = clock.monotonic()
        """When this node started listening: the "last heartbeat" of a broker never heard of."""
        self._brokers: dict[tuple[str, int], Liveness] = {}
        self._floors: dict[str, int] = {}
        self._dead: set[tuple[str, int]] = set()

    def beat(
        self,
        broker_name: str,
        broker_id: int,
        address: str,
        *,
        epoch: int = 0,
        max_offset: int = 0,
        confirm_offset: int = 0,
        priority: int = DEFAULT_PRIORITY,
        channel: object | None = None,
        replica_lag: dict[int, tuple[int, int]] | None = None,
    ) -> Liveness:
        key = (broker_name, broker_id)
        now = self.clock.monotonic()
        entry = self._brokers.get(key)
        if entry is None:
            entry = self._brokers[key] = Liveness(broker_name, broker_id, address, now)
        entry.address, entry.last_seen, entry.closed = address, now, False
        entry.epoch, entry.max_offset, entry.confirm_offset = epoch, max_offset, confirm_offset
        entry.priority, entry.channel = priority, channel
        entry.replica_lag = replica_lag
        self._dead.discard(key)
        if epoch > self._floors.get(broker_name, 0):
            self._floors[broker_name] = epoch
        return entry

    def get(self, broker_name: str, broker_id: int) -> Liveness | None:
        return self._brokers.get((broker_name, broker_id))

    def _is_alive(self, entry: Liveness, now: float) -> bool:
        return not entry.closed and now - entry.last_seen < self.timeout_s

    def alive(self, broker_name: str, broker_id: int) -> bool:
        entry = self._brokers.get((broker_name, broker_id))
        return entry is not None and self._is_alive(entry, self.clock.monotonic())

    def alive_ids(self, broker_name: str) -> list[int]:
        now = self.clock.monotonic()
        return sorted(
            e.broker_id
            for e in self._brokers.values()
            if e.broker_name == broker_name and self._is_alive(e, now)
        )

    def candidates(self, broker_name: str) -> dict[int, tuple[int, int, int]]:
        """Alive brokers of a group as the elect command takes them: id -> (epoch, max offset,
        priority)."""
        now = self.clock.monotonic()
        return {
            e.broker_id: (e.epoch, e.max_offset, e.priority)
            for e in self._brokers.values()
            if e.broker_name == broker_name and self._is_alive(e, now)
        }

    def last_seen(self, broker_name: str, broker_id: int) -> float:
        """When this node last heard from the broker (its start time if never)."""
        entry = self._brokers.get((broker_name, broker_id))
        return self.started if entry is None else entry.last_seen

    def epoch_floor(self, broker_name: str) -> int:
        return self._floors.get(broker_name, 0)

    def channels(self, broker_name: str) -> list[object]:
        return [
            e.channel
            for e in self._brokers.values()
            if e.broker_name == broker_name and e.channel is not None and not e.closed
        ]

    def channel_closed(self, channel: object) -> list[tuple[str, int]]:
        """Mark dead every broker whose last heartbeat came on ``channel``."""
        gone = []
        for key, entry in self._brokers.items():
            if entry.channel is channel and not entry.closed:
                entry.closed, entry.channel = True, None
                gone.append(key)
        return gone

    def expire(self) -> list[tuple[str, int]]:
        """Brokers that became dead since the last call (for logs and metrics)."""
        now = self.clock.monotonic()
        newly = []
        for key, entry in self._brokers.items():
            if key not in self._dead and not self._is_alive(entry, now):
                self._dead.add(key)
                newly.append(key)
        return newly

    def forget(self, broker_name: str, broker_id: int) -> None:
        self._brokers.pop((broker_name, broker_id), None)
        self._dead.discard((broker_name, broker_id))

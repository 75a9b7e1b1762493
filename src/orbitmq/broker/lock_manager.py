"""Queue locks for orderly consumption (LOCK_BATCH_MQ / UNLOCK_BATCH_MQ).

An orderly consumer must be the only one of its group consuming a queue, also while a rebalance
moves the queue from one member to another. So before consuming a queue it locks it on the
queue's broker, renews the lock periodically, and consumes only while it holds it. A lock is
keyed ``(group, topic, queue_id)`` and held by one client id until:

- the holder unlocks it (UNLOCK_BATCH_MQ; unlocking a queue held by someone else does nothing),
- it expires: ``ttl_s`` (``rebalance_lock_ttl_s``, 60 s as RocketMQ's REBALANCE_LOCK_MAX_LIVE_TIME)
  without a renewal, so a holder that vanished without a word cannot block the queue forever,
- the holder leaves the group (unregister, connection closed, heartbeat expired).

Locking grants every requested queue that is free, expired or already the caller's (renewing
it) and answers with the queues the caller now holds; a queue another live member holds is left
out, and the caller tries again at its next rebalance. State is on the event loop thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

LockKey = tuple[str, str, int]
"""(group, topic, queue_id)."""


@dataclass(slots=True)
class QueueLock:
    client_id: str
    expires: float
    """Monotonic seconds."""


class LockManager:
    def __init__(self, ttl_s: float = 60.0, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._locks: dict[LockKey, QueueLock] = {}

    def __len__(self) -> int:
        return len(self._locks)

    def lock(
        self, group: str, client_id: str, queues: Iterable[tuple[str, int]]
    ) -> list[tuple[str, int]]:
        """Grant or renew; returns the requested queues ``client_id`` holds afterwards."""
        now = self.clock()
        expires = now + self.ttl_s
        held: list[tuple[str, int]] = []
        for topic, queue_id in queues:
            key = (group, topic, queue_id)
            have = self._locks.get(key)
            if have is None or have.expires <= now or have.client_id == client_id:
                self._locks[key] = QueueLock(client_id, expires)
                held.append((topic, queue_id))
        return held

    def unlock(self, group: str, client_id: str, queues: Iterable[tuple[str, int]]) -> int:
        """Release the caller's own locks among ``queues``; returns how many it released."""
        released = 0
        for topic, queue_id in queues:
            key = (group, topic, queue_id)
            have = self._locks.get(key)
            if have is not None and have.client_id == client_id:
                del self._locks[key]
                released += 1
        return released

    def release_client(self, group: str, client_id: str) -> int:
        """Every lock ``client_id`` holds in ``group`` (it left the group)."""
        doomed = [k for k, v in self._locks.items() if k[0] == group and v.client_id == client_id]
        for key in doomed:
            del self._locks[key]
        return len(doomed)

    def holder(self, group: str, topic: str, queue_id: int) -> str | None:
        """Who holds the queue now (None: free or expired)."""
        have = self._locks.get((group, topic, queue_id))
        if have is None or have.expires <= self.clock():
            return None
        return have.client_id

    def purge_expired(self) -> int:
        """Forget expired locks (a periodic sweep, so the table does not grow without bound)."""
        now = self.clock()
        doomed = [k for k, v in self._locks.items() if v.expires <= now]
        for key in doomed:
            del self._locks[key]
        return len(doomed)

    def delete_topic(self, topic: str) -> None:
        for key in [k for k in self._locks if k[1] == topic]:
            del self._locks[key]

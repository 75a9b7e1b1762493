"""The client-side cache of one assigned queue: pulled messages not yet fully consumed.

A :class:`ProcessQueue` holds the messages a consumer pulled from one :class:`MessageQueue`,
in offset order, from the moment they arrive until the listener is done with them. It answers
the three questions the consumer keeps asking:

- **what may be committed**: the smallest offset not yet consumed, or, when nothing is cached,
  where the next pull starts (messages the filter skipped count as consumed). Committing it
  never skips a message that is still being worked on, however out of order a thread pool
  finishes batches;
- **whether to pull more**: the cached message count and body bytes (flow control);
- **whether the queue is quiet**: how many batches a listener is running right now, so a
  rebalance can wait for them before it commits and lets another member take the queue.

Messages are *pending* (cached, not handed out), *taken* (handed to a listener or returned by
poll) or gone (:meth:`remove`). Pulls of one queue run one at a time, so messages arrive in
increasing offsets; :meth:`put` ignores any at or below what it already has.

A queue is *dropped* when it is no longer ours (rebalance, reset, close): pulling stops,
batches not yet started are abandoned (they stay uncommitted: the next owner gets them), and
:meth:`wait_idle` waits for the running ones. Not thread-safe: one event loop owns it, except
:meth:`try_begin`/:meth:`end`/:meth:`drop`, which worker threads may race.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence

from orbitmq.client.route import MessageQueue
from orbitmq.common.record import StoredMessage

__all__ = ["ProcessQueue"]


class ProcessQueue:
    def __init__(self, mq: MessageQueue, next_offset: int) -> None:
        self.mq = mq
        self.next_offset = next_offset
        """Where the next pull starts (after the last message or filtered gap pulled)."""
        self.dropped = False
        self.generation = 0
        """Bumped by :meth:`reset`: a pull that started before it must not deliver."""
        self.locked = False
        """Orderly clustering consumption: the broker lock is held (see ``lock_renewed_at``)."""
        self.lock_renewed_at = 0.0
        self.cached_bytes = 0
        self.last_pull_at = 0.0
        self._msgs: dict[int, StoredMessage] = {}
        self._order: deque[int] = deque()  # offsets in arrival (= offset) order, lazily pruned
        self._pending: deque[int] = deque()  # offsets not taken yet, in order
        self._max_seen = next_offset - 1
        self._running = 0
        self._run_lock = threading.Lock()
        self._space = asyncio.Event()
        self._space.set()

    def __repr__(self) -> str:
        return (
            f"ProcessQueue({self.mq}, next={self.next_offset}, cached={self.cached_count}, "
            f"running={self._running}{', dropped' if self.dropped else ''})"
        )

    # ------------------------------------------------------------------ filling

    def put(self, msgs: Sequence[StoredMessage], next_offset: int) -> list[StoredMessage]:
        """Cache one pull's messages (already filtered) and move the pull position to
        ``next_offset``. Returns the messages actually added (none when dropped)."""
        if self.dropped:
            return []
        added: list[StoredMessage] = []
        for m in msgs:
            off = m.queue_offset
            if off <= self._max_seen:
                continue
            self._max_seen = off
            self._msgs[off] = m
            self._order.append(off)
            self._pending.append(off)
            self.cached_bytes += len(m.body)
            added.append(m)
        if next_offset > self.next_offset:
            self.next_offset = next_offset
        self._max_seen = max(self._max_seen, self.next_offset - 1)
        return added

    # ------------------------------------------------------------------ handing out

    @property
    def cached_count(self) -> int:
        return len(self._msgs)

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    @property
    def taken_count(self) -> int:
        return len(self._msgs) - len(self._pending)

    def take(self, max_count: int) -> list[StoredMessage]:
        """Up to ``max_count`` pending messages, oldest first; they stay cached until removed."""
        out: list[StoredMessage] = []
        pending, msgs = self._pending, self._msgs
        while pending and len(out) < max_count:
            m = msgs.get(pending.popleft())
            if m is not None:
                out.append(m)
        return out

    def untake(self, msgs: Sequence[StoredMessage]) -> None:
        """Put taken messages back at the front of the pending ones (orderly retry in place)."""
        for m in reversed(msgs):
            if m.queue_offset in self._msgs:
                self._pending.appendleft(m.queue_offset)

    def remove(self, msgs: Iterable[StoredMessage]) -> int:
        """Forget consumed messages; returns the committable offset afterwards."""
        removed = 0
        for m in msgs:
            if self._msgs.pop(m.queue_offset, None) is not None:
                self.cached_bytes -= len(m.body)
                removed += 1
        if removed:
            self._space.set()
        return self.committable()

    def committable(self) -> int:
        """The smallest offset not consumed yet, or the next pull offset when nothing is cached."""
        order, msgs = self._order, self._msgs
        while order and order[0] not in msgs:
            order.popleft()
        return order[0] if order else self.next_offset

    # ------------------------------------------------------------------ flow control

    def is_full(self, max_count: int, max_bytes: int) -> bool:
        full = len(self._msgs) >= max_count or self.cached_bytes >= max_bytes
        if full:
            self._space.clear()
        return full

    async def wait_space(self, timeout_s: float) -> None:
        """Wait until a message is removed (or ``timeout_s``, or the queue is dropped)."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._space.wait()
        except TimeoutError:
            pass

    # ------------------------------------------------------------------ running listeners

    @property
    def running(self) -> int:
        """Listener calls (and their send-backs) in progress on this queue's messages."""
        return self._running

    def try_begin(self, generation: int | None = None) -> bool:
        """Count a listener call as running, unless the queue was dropped (or reset since
        ``generation``): then the batch is abandoned and False returned. Thread-safe, so a
        worker thread decides at the moment it would start, and a drop that returned has no
        call starting after it."""
        with self._run_lock:
            if self.dropped or (generation is not None and generation != self.generation):
                return False
            self._running += 1
            return True

    def end(self) -> None:
        """A call counted by :meth:`try_begin` is over (its result applied)."""
        with self._run_lock:
            self._running = max(0, self._running - 1)

    async def wait_idle(self, timeout_s: float, poll_s: float = 0.005) -> bool:
        """Wait until no listener call runs on this queue; False if ``timeout_s`` passed first.
        Polls: calls end on worker threads, and a removal is rare enough not to need more."""
        deadline = time.monotonic() + timeout_s
        while self._running > 0:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(poll_s)
        return True

    # ------------------------------------------------------------------ dropping and resets

    def drop(self) -> None:
        """No longer ours: stop pulling; batches not started yet are abandoned."""
        with self._run_lock:
            self.dropped = True
        self._pending.clear()
        self._space.set()

    def reset(self, offset: int) -> None:
        """Drop every cached message and continue from ``offset`` (seek, offset reset). Listener
        calls already running finish, but their messages no longer count."""
        with self._run_lock:
            self.generation += 1
        self._msgs.clear()
        self._order.clear()
        self._pending.clear()
        self.cached_bytes = 0
        self.next_offset = offset
        self._max_seen = offset - 1
        self._space.set()

    # ------------------------------------------------------------------ orderly locks

    def lock_valid(self, max_age_s: float, now: float | None = None) -> bool:
        return self.locked and (now or time.monotonic()) - self.lock_renewed_at < max_age_s

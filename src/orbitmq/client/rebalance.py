"""Rebalancing: which queues this member of a consumer group reads, and handing queues over.

:class:`RebalanceService` owns the consumer's :class:`ProcessQueue` table. A *round*
(:meth:`RebalanceService.rebalance`) works out, per subscribed topic, the queues this client
should hold:

- clustering: the topic's readable queues (from the route) and the group's client ids
  (GET_CONSUMER_LIST_BY_GROUP on one broker of the topic), fed to the allocation strategy;
- broadcasting: every readable queue;
- a fixed assignment (``assign``): exactly the queues given, no group involved.

then hands over what changed. Rounds run at start, every ``interval_s``, and at once when a
broker says the group changed (NOTIFY_CONSUMER_IDS_CHANGED, via :meth:`request`); they never
overlap.

**Handing a queue over** is where duplicates come from, so it is done carefully. Removal:

1. the queue is *dropped*: no more pulls, and batches not yet given to the listener are
   abandoned (the next owner gets them, since they are not committed);
2. wait for the listener calls running on it to finish (at most ``removal_timeout_s``);
3. commit its committable offset *synchronously* (the broker answers after it is durable);
4. orderly: UNLOCK_BATCH_MQ, so the next owner's lock succeeds;
5. only then forget it.

Removals of one round run concurrently and finish before any addition of that round. The
next owner heard of the change at the same moment, though, and would read the old offset if it
started right away; so when the member list changed and there are other members, additions wait
``handover_delay_s`` (1 s by default) to give the old owner time for steps 1 to 4. Orderly
consumers need no such grace: they cannot lock a queue before its old owner unlocked it, and
retry the lock every ``lock_retry_s`` until it is theirs.

Addition: orderly clustering consumers first lock the queues (LOCK_BATCH_MQ; only those locked
are added); the start offset is the committed one, or, for a queue the group never committed,
the one ``consume_from_where`` says (LAST_OFFSET: the queue's max offset; FIRST_OFFSET: its min;
TIMESTAMP: SEARCH_OFFSET_BY_TIMESTAMP). Retry topics always start from their first message.
A queue whose offset cannot be read now is left for the next round rather than guessed.

Orderly clustering consumers renew their locks every ``lock_interval_s`` (20 s; the broker keeps
a lock 60 s); a queue whose renewal fails is marked unlocked and its consumption pauses until a
renewal succeeds again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol, TypeVar

import msgspec

from orbitmq.client.allocate import AllocateStrategy
from orbitmq.client.consumer_types import ConsumeFromWhere, MessageModel
from orbitmq.client.offset_store import BrokerRequester, OffsetStore
from orbitmq.client.process_queue import ProcessQueue
from orbitmq.client.route import MessageQueue, TopicRouteCache, TopicRouteNotFoundError
from orbitmq.common.clock import now_ms
from orbitmq.common.errors import MQError, ProtocolError
from orbitmq.protocol.bodies import decode_body, encode_body
from orbitmq.protocol.consumer import (
    RETRY_GROUP_TOPIC_PREFIX,
    ConsumerIdList,
    LockBatchBody,
    QueueRef,
    SubscriptionData,
)
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.requests import GetConsumerListRequest, LockBatchRequest, UnlockBatchRequest

log = logging.getLogger(__name__)

__all__ = ["LOCK_MAX_AGE_S", "QueueListener", "RebalanceService"]

LOCK_MAX_AGE_S = 30.0
"""A lock not renewed for this long is no longer trusted by the client (the broker keeps it 60 s)."""


class QueueListener(Protocol):
    """The consumer side of the process queue table."""

    async def queue_added(self, pq: ProcessQueue) -> None:
        """``pq`` is ours from ``pq.next_offset``: start pulling it."""

    async def queue_removed(self, pq: ProcessQueue) -> None:
        """``pq`` was dropped, committed (and unlocked) and forgotten: end its tasks."""

    def queue_relocked(self, pq: ProcessQueue) -> None:
        """An orderly queue's lock was regained after being lost: resume consuming it."""


class RebalanceService:
    def __init__(
        self,
        *,
        group: str,
        client_id: str,
        routes: TopicRouteCache,
        requester: BrokerRequester,
        offset_store: OffsetStore,
        listener: QueueListener,
        strategy: AllocateStrategy,
        message_model: MessageModel = MessageModel.CLUSTERING,
        consume_from_where: ConsumeFromWhere = ConsumeFromWhere.LAST_OFFSET,
        consume_timestamp_ms: int | None = None,
        orderly: bool = False,
        interval_s: float = 20.0,
        removal_timeout_s: float = 10.0,
        handover_delay_s: float = 1.0,
        lock_interval_s: float = 20.0,
        lock_retry_s: float = 1.0,
        committable: Callable[[ProcessQueue], int | None] | None = None,
    ) -> None:
        self.group = group
        self.client_id = client_id
        self.routes = routes
        self.requester = requester
        self.offset_store = offset_store
        self.listener = listener
        self.strategy = strategy
        self.message_model = message_model
        self.consume_from_where = consume_from_where
        self.consume_timestamp_ms = consume_timestamp_ms
        self.orderly = orderly
        self.interval_s = interval_s
        self.removal_timeout_s = removal_timeout_s
        self.handover_delay_s = handover_delay_s
        self.lock_interval_s = lock_interval_s
        self.lock_retry_s = lock_retry_s
        self.committable = committable or ProcessQueue.committable
        """What to commit of a queue handed over (None: only what the store already holds)."""
        self.subscriptions: dict[str, SubscriptionData] = {}
        self.process_queues: dict[MessageQueue, ProcessQueue] = {}
        self.fixed: frozenset[MessageQueue] | None = None
        """Queues given by ``assign`` (no group allocation), or None."""
        self.rounds = 0
        """Completed rebalance rounds (for tests and metrics)."""
        self._lock = asyncio.Lock()
        self._wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._soon: asyncio.TimerHandle | None = None
        self._last_ids: tuple[str, ...] | None = None
        self._closed = False

    @property
    def needs_lock(self) -> bool:
        """Orderly clustering consumption locks its queues at the broker."""
        return self.orderly and self.message_model is MessageModel.CLUSTERING

    # ------------------------------------------------------------------ configuration

    def assign(self, queues: Iterable[MessageQueue]) -> None:
        """Hold exactly ``queues`` from the next round on (no group allocation)."""
        self.fixed = frozenset(queues)

    def assignment(self) -> list[MessageQueue]:
        return sorted(self.process_queues)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the periodic rounds (and lock renewals); call from the event loop."""
        loop = asyncio.get_running_loop()
        if self._tasks:
            return
        self._tasks.append(loop.create_task(self._loop(), name=f"orbitmq-rebalance-{self.group}"))
        if self.needs_lock:
            self._tasks.append(loop.create_task(self._lock_loop(), name="orbitmq-lock-renewal"))

    def request(self) -> None:
        """Run a round as soon as possible (coalesced with any already asked for)."""
        self._wakeup.set()

    def request_soon(self, delay_s: float) -> None:
        """Run a round in ``delay_s`` (one pending at a time)."""
        if self._soon is not None or self._closed:
            return

        def fire() -> None:
            self._soon = None
            self._wakeup.set()

        self._soon = asyncio.get_running_loop().call_later(delay_s, fire)

    async def close(self) -> None:
        """Stop rebalancing and hand every queue back (wait, commit, unlock). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._soon is not None:
            self._soon.cancel()
            self._soon = None
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        async with self._lock:
            await self._remove_all(list(self.process_queues))

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):
                    await self._wakeup.wait()
            self._wakeup.clear()
            try:
                await self.rebalance()
            except MQError as exc:
                log.warning("rebalance of %s: %s", self.group, exc)
            except Exception:  # a bug must not end rebalancing
                log.exception("rebalance of %s failed", self.group)

    # ------------------------------------------------------------------ a round

    async def rebalance(self) -> None:
        """One round: work out the target queues of every topic and hand over the changes."""
        if self._closed:
            return
        async with self._lock:
            target, keep_topics, ids_changed = await self._targets()
            current = set(self.process_queues)
            removed = sorted(
                mq
                for mq in current - target
                if self.fixed is not None or mq.topic not in keep_topics
            )
            added = sorted(target - current)
            if removed:
                log.info("%s: releasing %s", self.client_id, ", ".join(map(str, removed)))
                await self._remove_all(removed)
            if added:
                if ids_changed and self.handover_delay_s > 0 and not self.needs_lock:
                    await asyncio.sleep(self.handover_delay_s)
                await self._add_all(added)
            self.rounds += 1

    async def _targets(self) -> tuple[set[MessageQueue], set[str], bool]:
        """(queues to hold, topics whose current queues must be kept as they are because their
        target is unknown this round, whether the member list changed)."""
        if self.fixed is not None:
            return set(self.fixed), set(), False
        target: set[MessageQueue] = set()
        keep: set[str] = set()
        ids_cache: dict[str, list[str] | None] = {}
        ids_changed = False
        for topic in sorted(self.subscriptions):
            try:
                info = await self.routes.get(topic)
            except TopicRouteNotFoundError:
                continue  # deleted, or a retry topic nobody sent back to yet: nothing to read
            except MQError as exc:
                log.warning("rebalance %s: no route for %r now: %s", self.group, topic, exc)
                keep.add(topic)
                continue
            queues = sorted(info.read_queues)
            if self.message_model is MessageModel.BROADCASTING:
                target.update(queues)
                continue
            if not queues:
                continue
            ids = await self._client_ids(topic, info.broker_addrs, ids_cache)
            if ids is None:
                keep.add(topic)
                continue
            if self.client_id not in ids:
                log.info("%s not yet in group %s as the broker sees it", self.client_id, self.group)
                keep.add(topic)
                continue
            if self._last_ids != tuple(ids):
                ids_changed = ids_changed or len(ids) > 1
                self._last_ids = tuple(ids)
            mine = self.strategy.allocate(self.group, self.client_id, queues, ids)
            target.update(mine)
        return target, keep, ids_changed

    async def _client_ids(
        self, topic: str, broker_addrs: Mapping[str, str], cache: dict[str, list[str] | None]
    ) -> list[str] | None:
        addrs = [broker_addrs[n] for n in sorted(broker_addrs)]
        errors: list[str] = []
        for addr in addrs:
            if addr in cache:
                cached = cache[addr]
                if cached is not None:
                    return cached
                continue
            try:
                resp = await self.requester.call(addr, GetConsumerListRequest(group=self.group))
                ids = sorted(set(_decode(resp, ConsumerIdList).client_ids))
            except MQError as exc:
                cache[addr] = None
                errors.append(f"{addr}: {exc}")
                continue
            cache[addr] = ids
            return ids
        log.warning("rebalance %s of %r: no member list (%s)", self.group, topic, "; ".join(errors))
        return None

    # ------------------------------------------------------------------ adding

    async def _add_all(self, mqs: Sequence[MessageQueue]) -> None:
        if self.needs_lock:
            locked = await self.lock(mqs)
            if len(locked) < len(mqs):
                # Probably still held by the previous owner, which unlocks once it is done.
                self.request_soon(self.lock_retry_s)
            mqs = [mq for mq in mqs if mq in locked]
        await asyncio.gather(*(self._add(mq) for mq in mqs))

    async def _add(self, mq: MessageQueue) -> None:
        try:
            offset = await self.start_offset(mq)
        except MQError as exc:
            log.warning("%s: cannot start %s now (next round tries again): %s", self.group, mq, exc)
            self.request_soon(self.lock_retry_s)
            if self.needs_lock:
                await self.unlock([mq])
            return
        if self._closed or mq in self.process_queues:
            return
        pq = ProcessQueue(mq, offset)
        if self.needs_lock:
            pq.locked = True
            pq.lock_renewed_at = time.monotonic()
        self.process_queues[mq] = pq
        self.offset_store.update(mq, offset)
        log.info("%s: took %s from offset %d", self.client_id, mq, offset)
        await self.listener.queue_added(pq)

    async def start_offset(self, mq: MessageQueue) -> int:
        """The committed offset, or where ``consume_from_where`` says for a new queue."""
        offset = await self.offset_store.fetch(mq)
        if offset is not None and offset >= 0:
            return offset
        if mq.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return await self.requester.min_offset(mq)
        where = self.consume_from_where
        if where is ConsumeFromWhere.FIRST_OFFSET:
            return await self.requester.min_offset(mq)
        if where is ConsumeFromWhere.TIMESTAMP:
            ts = self.consume_timestamp_ms
            if ts is None:
                ts = now_ms() - 30 * 60 * 1000  # RocketMQ's default: 30 min ago
            return await self.requester.search_offset(mq, ts)
        return await self.requester.max_offset(mq)

    # ------------------------------------------------------------------ removing

    async def _remove_all(self, mqs: Sequence[MessageQueue]) -> None:
        """Hand queues back. Those with no listener call running are committed together (one
        request per broker) and unlocked at once; each busy one is handed back as soon as its
        calls end, so an idle queue never waits for a busy one."""
        pqs = [pq for mq in mqs if (pq := self.process_queues.get(mq)) is not None]
        for pq in pqs:
            pq.drop()
        idle = [pq for pq in pqs if pq.running == 0]
        busy = [pq for pq in pqs if pq.running != 0]
        await asyncio.gather(
            self._hand_back(idle, waited=True), *(self._remove_busy(pq) for pq in busy)
        )

    async def _remove_busy(self, pq: ProcessQueue) -> None:
        idle = await pq.wait_idle(self.removal_timeout_s)
        if not idle:
            log.warning(
                "%s: listener still busy on %s after %.1fs; committing what is done",
                self.client_id,
                pq.mq,
                self.removal_timeout_s,
            )
        await self._hand_back([pq], waited=idle)

    async def _hand_back(self, pqs: list[ProcessQueue], *, waited: bool) -> None:
        """Commit, unlock (orderly; not after a wait that timed out: unlocking would let the
        next owner run beside the busy listener, so that lock is left to expire), forget."""
        if not pqs:
            return
        await self.commit_now(pqs)
        if self.needs_lock:
            if waited:
                await self.unlock([pq.mq for pq in pqs if pq.locked])
            else:
                log.warning("%s: leaving the lock of %s to expire", self.client_id, pqs[0].mq)
            for pq in pqs:
                pq.locked = False
        for pq in pqs:
            self.offset_store.remove(pq.mq)
            if self.process_queues.get(pq.mq) is pq:
                del self.process_queues[pq.mq]
        for pq in pqs:
            try:
                await self.listener.queue_removed(pq)
            except Exception:
                log.exception("queue_removed(%s) failed", pq.mq)

    async def commit_now(self, pqs: Iterable[ProcessQueue]) -> None:
        """Commit the queues' committable offsets now (batched per broker); failures are logged."""
        mqs: list[MessageQueue] = []
        for pq in pqs:
            offset = self.committable(pq)
            if offset is not None:
                self.offset_store.update(pq.mq, offset)
            mqs.append(pq.mq)
        try:
            await self.offset_store.persist(mqs)
        except MQError as exc:
            log.warning("%s: committing %d queues failed: %s", self.client_id, len(mqs), exc)

    # ------------------------------------------------------------------ locks

    async def lock(self, mqs: Iterable[MessageQueue]) -> set[MessageQueue]:
        """LOCK_BATCH_MQ per broker; the queues this client holds now (failures: none)."""
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            by_broker.setdefault(mq.broker_name, []).append(mq)
        results = await asyncio.gather(*(self._lock_broker(qs) for qs in by_broker.values()))
        return set().union(*results) if results else set()

    async def _lock_broker(self, mqs: list[MessageQueue]) -> set[MessageQueue]:
        body = LockBatchBody(group=self.group, client_id=self.client_id, queues=_refs(mqs))
        try:
            resp = await self.requester.call_queue(mqs[0], LockBatchRequest(), encode_body(body))
            held = _decode(resp, LockBatchBody).queues
        except MQError as exc:
            log.warning(
                "%s: locking %d queues of %s failed: %s",
                self.client_id,
                len(mqs),
                mqs[0].broker_name,
                exc,
            )
            return set()
        wanted = set(mqs)
        return {
            m for r in held if (m := MessageQueue(r.topic, r.broker_name, r.queue_id)) in wanted
        }

    async def unlock(self, mqs: Iterable[MessageQueue]) -> None:
        """UNLOCK_BATCH_MQ per broker; failures are logged (the lock then expires)."""
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            by_broker.setdefault(mq.broker_name, []).append(mq)

        async def one(qs: list[MessageQueue]) -> None:
            body = LockBatchBody(group=self.group, client_id=self.client_id, queues=_refs(qs))
            try:
                await self.requester.call_queue(qs[0], UnlockBatchRequest(), encode_body(body))
            except MQError as exc:
                log.warning("%s: unlocking %s failed: %s", self.client_id, qs[0].broker_name, exc)

        await asyncio.gather(*(one(qs) for qs in by_broker.values()))

    async def renew_locks(self) -> None:
        """Lock every held queue again: renews those still ours, marks the others unlocked."""
        pqs = {mq: pq for mq, pq in self.process_queues.items() if not pq.dropped}
        if not pqs:
            return
        held = await self.lock(pqs)
        now = time.monotonic()
        for mq, pq in pqs.items():
            if mq in held:
                regained = not pq.lock_valid(LOCK_MAX_AGE_S, now)
                pq.locked = True
                pq.lock_renewed_at = now
                if regained:
                    self.listener.queue_relocked(pq)
            elif pq.locked:
                log.warning("%s: lost the lock of %s; pausing it", self.client_id, mq)
                pq.locked = False

    async def _lock_loop(self) -> None:
        while True:
            await asyncio.sleep(self.lock_interval_s)
            try:
                await self.renew_locks()
            except Exception:
                log.exception("lock renewal of %s failed", self.group)


def _refs(mqs: Iterable[MessageQueue]) -> list[QueueRef]:
    return [QueueRef(topic=m.topic, broker_name=m.broker_name, queue_id=m.queue_id) for m in mqs]


_T = TypeVar("_T")


def _decode(resp: Frame, typ: type[_T]) -> _T:
    body = resp.body
    try:
        return decode_body(bytes(body) if not isinstance(body, bytes) else body, typ)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(f"malformed {typ.__name__} body: {exc}") from exc

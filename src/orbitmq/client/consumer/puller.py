"""PullMessageService: one long-polling pull loop per held queue (RocketMQ's name).

Each loop sends PULL_MESSAGE (``suspend_timeout_ms`` of long poll) with the group and the
subscription's filter fields. A pull body is decoded once, tag-filtered here by the exact tag (the
broker only filters by tag hash), and cached in the queue's :class:`ProcessQueue` in one go; the
owner's ``on_pulled`` then hands it on. While a queue caches more than
``max_cached_messages_per_queue`` messages or ``max_cached_bytes_per_queue`` bytes, its pulls
pause (flow control). A pull that reached the queue's end yields one loop turn before the next
one, so that the listener runs before that pull is written. PULL_OFFSET_MOVED jumps to the
offset the broker names (and commits it); errors back off 1 to 3 s.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable

from orbitmq.client import _codec
from orbitmq.client.consumer.config import ConsumerConfig
from orbitmq.client.consumer.subscription import Subscription
from orbitmq.client.offset_store import BrokerRequester, OffsetStore
from orbitmq.client.process_queue import ProcessQueue
from orbitmq.client.route import MessageQueue
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MQError, ProtocolError
from orbitmq.common.record import StoredMessage
from orbitmq.protocol.requests import PullMessageRequest

log = logging.getLogger(__name__)

__all__ = ["PullMessageService"]

_PULL_OK = frozenset(
    {
        ResponseCode.SUCCESS,
        ResponseCode.PULL_NOT_FOUND,
        ResponseCode.PULL_RETRY_IMMEDIATELY,
        ResponseCode.PULL_OFFSET_MOVED,
    }
)
_PULL_MAX_BYTES = 4 * 1024 * 1024
_BACKOFF_S = (1.0, 3.0)


class PullMessageService:
    """Runs and stops the pull loop of each queue; ``on_pulled`` gets what each pull cached."""

    def __init__(
        self,
        config: ConsumerConfig,
        name: str,
        group: str,
        requester: BrokerRequester,
        offset_store: OffsetStore,
        *,
        subscription: Callable[[str], Subscription],
        on_pulled: Callable[[ProcessQueue, list[StoredMessage]], None],
        running: Callable[[], bool],
    ) -> None:
        self.config = config
        self.name = name
        self.group = group
        self.requester = requester
        self.offset_store = offset_store
        self._subscription = subscription
        self._on_pulled = on_pulled
        self._running = running
        self._tasks: dict[MessageQueue, asyncio.Task[None]] = {}

    def start(self, pq: ProcessQueue) -> None:
        """(Re)start the pull loop of ``pq`` from its next offset."""
        old = self._tasks.get(pq.mq)
        if old is not None:
            old.cancel()
        self._tasks[pq.mq] = asyncio.get_running_loop().create_task(
            self._pull_loop(pq), name=f"orbitmq-pull-{pq.mq}"
        )

    async def stop(self, pq: ProcessQueue) -> None:
        task = self._tasks.pop(pq.mq, None)
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _pull_loop(self, pq: ProcessQueue) -> None:
        mq = pq.mq
        cfg = self.config
        while not pq.dropped and self._running():
            if pq.is_full(cfg.max_cached_messages_per_queue, cfg.max_cached_bytes_per_queue):
                await pq.wait_space(1.0)
                continue
            try:
                delay = await self._pull_once(pq)
            except asyncio.CancelledError:
                raise
            except MQError as exc:
                log.warning("%s: pull of %s failed: %s", self.name, mq, exc)
                delay = random.uniform(*_BACKOFF_S)
            except Exception:
                log.exception("%s: pull of %s failed", self.name, mq)
                delay = random.uniform(*_BACKOFF_S)
            if delay:
                await asyncio.sleep(delay)

    async def _pull_once(self, pq: ProcessQueue) -> float:
        """One PULL_MESSAGE; returns how long to wait before the next."""
        cfg = self.config
        mq = pq.mq
        sub = self._subscription(mq.topic)
        generation = pq.generation
        offset = pq.next_offset
        header = PullMessageRequest(
            topic=mq.topic,
            queue_id=mq.queue_id,
            queue_offset=offset,
            max_msg_nums=cfg.pull_batch_size,
            max_bytes=max(
                1, min(_PULL_MAX_BYTES, cfg.max_cached_bytes_per_queue - pq.cached_bytes)
            ),
            suspend_timeout_ms=cfg.suspend_timeout_ms,
            group=self.group,
            **sub.pull_fields,
        )
        pq.last_pull_at = time.monotonic()
        resp = await self.requester.call_queue(
            mq,
            header,
            ok=_PULL_OK,
            timeout_s=cfg.request_timeout_s + cfg.suspend_timeout_ms / 1000.0,
        )
        if pq.dropped or pq.generation != generation:
            return 0.0
        next_begin = resp.fields.get("next_begin_offset")
        if isinstance(next_begin, bool) or not isinstance(next_begin, int):
            raise ProtocolError(f"pull answer without next_begin_offset: {resp.fields!r}")
        code = resp.code
        if code == ResponseCode.SUCCESS:
            msgs = _codec.plain_all(_codec.decode_pulled(resp.body, verify_crc=cfg.check_crc))
            added = pq.put(sub.accept(msgs), next_begin)
            if added:
                self._on_pulled(pq, added)
                if resp.fields.get("max_offset") == next_begin:
                    # Caught up: the broker would hold the next pull anyway, so the listener
                    # goes first (its worker was just scheduled) and the pull's write (which
                    # wakes the broker, maybe on this core) after it. Behind, the next pull
                    # goes out at once and overlaps the listener.
                    await asyncio.sleep(0)
            return 0.0
        if code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY):
            pq.put((), next_begin)
            return 0.0
        # PULL_OFFSET_MOVED: our offset is outside the queue (retention, a reset, a new queue).
        log.warning(
            "%s: offset %d of %s is outside the queue (%s); moving to %d",
            self.name,
            offset,
            mq,
            resp.remark,
            next_begin,
        )
        pq.reset(next_begin)
        self.offset_store.update(mq, next_begin)
        try:
            await self.offset_store.persist([mq])
        except MQError as exc:
            log.warning("%s: committing the moved offset of %s: %s", self.name, mq, exc)
        return 0.0

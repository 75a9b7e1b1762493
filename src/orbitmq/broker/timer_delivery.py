"""DelayedDelivery: the send side of delayed and timer messages (docs/timers.md).

A send whose properties ask for a delay (DELAY level, TIMER_DELIVER_MS, TIMER_DELAY_MS/SEC), a
consumer's send-back and a Pop revive store their message here: as a copy in the timer topic
carrying REAL_TOPIC, REAL_QID and TIMER_OUT_MS (its due time), and TIMER_ROLL_MS when it is due
later than a roll window ahead. The :class:`~orbitmq.broker.timer_service.TimerService` loads
those copies as they are dispatched and delivers them when due; this class only stores them, so
the send path needs nothing of the fire loop.
"""

from __future__ import annotations

import asyncio
import dataclasses

from orbitmq.broker.context import BrokerContext
from orbitmq.common.errors import MessageIllegalError, TimerDelayTooLongError
from orbitmq.common.message import (
    PROPERTY_DELAY_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
    MessageBatch,
    decode_properties,
    encode_properties,
)
from orbitmq.store.commit_log import AppendResult
from orbitmq.store.timer_index import (
    PROPERTY_TIMER_CANCEL,
    PROPERTY_TIMER_OUT_MS,
    PROPERTY_TIMER_ROLL_MS,
    TIMER_QUEUE_ID,
    TIMER_TOPIC,
)

_REQUEST_NEEDLES = (b"DELAY\x01", b"TIMER_DELIVER_MS\x01", b"TIMER_DELAY_")
_SCHEDULING = (
    PROPERTY_REAL_TOPIC,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_TIMER_OUT_MS,
    PROPERTY_TIMER_ROLL_MS,
    PROPERTY_TIMER_CANCEL,
)
"""Properties only the broker sets on a timer copy (a sender's values are replaced)."""


class DelayedDelivery:
    """Stores messages to be delivered later. ``levels`` are the DELAY levels in ms
    (``parse_delay_levels``), ``roll_window_ms`` the timer service's roll window."""

    def __init__(self, ctx: BrokerContext, levels: list[int], roll_window_ms: int) -> None:
        self.config = ctx.config
        self.bridge = ctx.bridge
        self.clock = ctx.clock
        self.levels = levels
        self.roll_window_ms = roll_window_ms

    def wants(self, properties_block: bytes) -> bool:
        """Whether a send's properties may ask for a delay (a substring check; false positives
        are sorted out per message by :meth:`put_send`)."""
        return any(n in properties_block for n in _REQUEST_NEEDLES)

    def due_time(self, props: dict[str, str], now: int) -> int | None:
        """The due time a message's properties ask for (None: no delay asked). Raises
        MessageIllegalError for a malformed value or a delay beyond timer_max_delay_ms."""
        name = next(
            (
                n
                for n in (
                    PROPERTY_TIMER_DELIVER_MS,
                    PROPERTY_TIMER_DELAY_MS,
                    PROPERTY_TIMER_DELAY_SEC,
                    PROPERTY_DELAY_LEVEL,
                )
                if n in props
            ),
            None,
        )
        if name is None:
            return None
        raw = props[name]
        try:
            value = int(raw)
        except ValueError:
            raise MessageIllegalError(f"property {name}={raw[:40]!r} is not an integer") from None
        if name == PROPERTY_TIMER_DELIVER_MS:
            due = value
        elif name == PROPERTY_TIMER_DELAY_MS:
            due = now + value
        elif name == PROPERTY_TIMER_DELAY_SEC:
            due = now + value * 1000
        elif value <= 0:
            return None  # level 0: no delay
        else:
            due = now + self.levels[min(value, len(self.levels)) - 1]
        self.check_delay(due, now, f"{name}={raw[:40]}")
        return due

    def check_delay(self, due: int, now: int, what: str) -> None:
        limit = self.config.timer_max_delay_ms
        if due - now > limit:
            raise TimerDelayTooLongError(
                f"{what} asks for a delay of {(due - now) / 1000:.0f}s; the longest this broker "
                f"accepts is {limit / 1000:.0f}s (timer_max_delay_ms)"
            )

    async def put_send(self, batch: MessageBatch) -> AppendResult:
        """A send whose properties may ask for delays: delayed messages go to the timer topic,
        the others (no delay, level 0, a time not in the future) to their topic at once.
        The result lists every message's CommitLog offset in the batch's order."""
        now = self.clock.now_ms()
        maps = [decode_properties(p) for p in batch.properties]
        dues = [self.due_time(m, now) for m in maps]
        delayed = [i for i, d in enumerate(dues) if d is not None and d > now]
        if not delayed:
            return await self.bridge.put(batch)
        later = set(delayed)
        direct = [i for i in range(len(dues)) if i not in later]
        timer_batch = self._timer_batch(
            batch,
            [batch.bodies[i] for i in delayed],
            [maps[i] for i in delayed],
            [dues[i] or 0 for i in delayed],
        )
        parts: list[tuple[list[int], MessageBatch]] = [(delayed, timer_batch)]
        if direct:
            sub = _subset(batch, direct)
            parts.insert(0, (direct, sub))
        results = await asyncio.gather(*(self.bridge.put(b) for _, b in parts))
        phys = [0] * len(dues)
        sizes = [0] * len(dues)
        for (idx, _b), res in zip(parts, results, strict=True):
            for k, i in enumerate(idx):
                phys[i] = res.physical_offsets[k]
                sizes[i] = res.sizes[k]
        first = results[0]
        return AppendResult(
            batch.topic, batch.queue_id, first.first_queue_offset, phys, sizes,
            max(r.end_offset for r in results), first.store_timestamp_ms,
        )  # fmt: skip

    async def put_delayed(self, batch: MessageBatch, deliver_at_ms: int) -> AppendResult:
        """Store ``batch`` (its real topic and queue inside) to be delivered at
        ``deliver_at_ms``; a time not in the future appends it to its topic at once. Durable
        as a send is; raises TimerDelayTooLongError beyond timer_max_delay_ms."""
        now = self.clock.now_ms()
        if deliver_at_ms <= now:
            return await self.bridge.put(batch)
        self.check_delay(deliver_at_ms, now, f"delivery at {deliver_at_ms}")
        maps = [decode_properties(p) for p in batch.properties]
        timer_batch = self._timer_batch(batch, batch.bodies, maps, [deliver_at_ms] * len(maps))
        return await self.bridge.put(timer_batch)

    def _timer_batch(
        self,
        batch: MessageBatch,
        bodies: list[bytes],
        maps: list[dict[str, str]],
        dues: list[int],
    ) -> MessageBatch:
        props: list[bytes] = []
        roll_at = self.clock.now_ms() + self.roll_window_ms
        for m, due in zip(maps, dues, strict=True):
            m = {k: v for k, v in m.items() if k not in _SCHEDULING}
            m[PROPERTY_REAL_TOPIC] = batch.topic
            m[PROPERTY_REAL_QUEUE_ID] = str(batch.queue_id)
            m[PROPERTY_TIMER_OUT_MS] = str(due)
            if due > roll_at:  # stored again at roll_at, long before retention may delete it
                m[PROPERTY_TIMER_ROLL_MS] = str(roll_at)
            props.append(encode_properties(m))
        return MessageBatch(
            TIMER_TOPIC, TIMER_QUEUE_ID, list(bodies), props, flag=batch.flag,
            sys_flag=batch.sys_flag, born_timestamp_ms=batch.born_timestamp_ms,
            born_host=batch.born_host, reconsume_times=batch.reconsume_times,
            prepared_transaction_offset=batch.prepared_transaction_offset,
        )  # fmt: skip


def _subset(batch: MessageBatch, idx: list[int]) -> MessageBatch:
    return dataclasses.replace(
        batch, bodies=[batch.bodies[i] for i in idx], properties=[batch.properties[i] for i in idx]
    )

"""Broker-side deduplication for idempotent producers: per (producer id, topic, queue) the
sequences of the last stored sends and where they went.

An idempotent producer (``ProducerConfig.idempotent``) gives itself a random 63-bit producer
id and numbers its sends per queue: the first message of a send carries ``PRODUCER_ID``,
``PRODUCER_SEQ`` (the send's first sequence) and ``PRODUCER_COUNT`` (its messages), and every
retry of that send goes to the same queue with the same numbers. The broker answers a send
whose sequence it stored within the last ``retained`` sends of that producer on that queue
with the original queue offset and appends nothing; a send still being appended is answered
when the original's answer is known. Gaps are allowed (a send that failed for good burns its
sequence; sequences only identify sends), and so is a retry arriving after a later send
(transient failure): every stored sequence at or above the window's low mark is in the
window, so a sequence there that is not in it was never stored. Below the low mark nothing is
known any more: such a send is refused (``STALE``) rather than risk storing it twice.

The table is memory only. It is rebuilt per queue, before that queue's first idempotent send
after a start, from the properties of the queue's last ``scan`` messages (the producer
numbers travel with the messages, so a SIGKILLed broker's replays are still recognised):
within that depth a replay across a restart is answered, not stored again.

The check and the claim of a sequence happen in one step on the event loop, before the
append is awaited, so two copies of one send racing each other store one message.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from orbitmq.common.message import PROPERTY_PRODUCER_COUNT as PROP_COUNT
from orbitmq.common.message import PROPERTY_PRODUCER_ID as PROP_PID
from orbitmq.common.message import PROPERTY_PRODUCER_SEQ as PROP_SEQ
from orbitmq.common.message import decode_properties
from orbitmq.common.record import decode
from orbitmq.store.message_store import MessageStore

PID_NEEDLE = (PROP_PID + "\x01").encode()

OK, DUPLICATE, STALE = "ok", "duplicate", "stale"

Where = tuple[int, int]
"""(first queue offset, physical offset of the first message) of a stored send."""


@dataclass(slots=True)
class _Window:
    low: int = 0
    stored: dict[int, asyncio.Future[Where]] = field(default_factory=dict)
    heap: list[int] = field(default_factory=list)


@dataclass(slots=True)
class Claim:
    verdict: str
    future: asyncio.Future[Where] | None = None
    key: tuple[int, str, int] = (0, "", 0)
    seq: int = 0


def producer_of(first_props: bytes) -> tuple[int, int, int] | None:
    """(producer id, first sequence, count) from a send's first message's raw properties."""
    if PID_NEEDLE not in first_props:
        return None  # the usual send: one substring test, nothing decoded
    return producer_fields(decode_properties(first_props))


def read_tail(
    store: MessageStore, topic: str, queue_id: int, n: int
) -> list[tuple[dict[str, str], int, int]]:
    """(properties, queue offset, physical offset) of the queue's last ``n`` messages, oldest
    first (on a reader thread: the pages may have to come from disk)."""
    end = store.max_offset(topic, queue_id)
    offset = max(store.min_offset(topic, queue_id), end - n)
    out: list[tuple[dict[str, str], int, int]] = []
    while offset < end:  # bounded: every read moves on or stops
        res = store.get_messages(topic, queue_id, offset, min(256, end - offset), 64 << 20)
        for view in res.messages:
            m = decode(view)
            out.append((dict(m.properties), m.queue_offset, m.physical_offset))
        if res.next_begin_offset <= offset:
            break
        offset = res.next_begin_offset
    return out


def producer_fields(props: dict[str, str]) -> tuple[int, int, int] | None:
    """(producer id, first sequence, count) of a send's first message, or None."""
    try:
        return int(props[PROP_PID]), int(props[PROP_SEQ]), int(props.get(PROP_COUNT, "1"))
    except (KeyError, ValueError):
        return None


class IdempotenceTable:
    def __init__(self, retained: int = 64, scan: int = 1024) -> None:
        self.retained = retained
        self.scan = scan
        self._windows: dict[tuple[int, str, int], _Window] = {}
        self._loaded: dict[tuple[str, int], asyncio.Future[None]] = {}

    async def ensure_loaded(
        self,
        topic: str,
        queue_id: int,
        tail: Callable[[int], Awaitable[Iterable[tuple[dict[str, str], int, int]]]],
    ) -> None:
        """Rebuild the queue's windows once per start; ``tail(n)`` gives (properties, queue
        offset, physical offset) of the queue's last n messages, oldest first."""
        key = (topic, queue_id)
        loading = self._loaded.get(key)
        if loading is None:
            loading = self._loaded[key] = asyncio.get_running_loop().create_future()
            try:
                self._load(topic, queue_id, await tail(self.scan))
            except BaseException as exc:
                del self._loaded[key]  # the next send tries again
                loading.set_exception(exc)
                loading.exception()  # retrieved here: waiters re-raise their own copy
                raise
            loading.set_result(None)
        await asyncio.shield(loading)

    def _load(
        self, topic: str, queue_id: int, tail: Iterable[tuple[dict[str, str], int, int]]
    ) -> None:
        firsts: dict[int, int] = {}
        loop = asyncio.get_running_loop()
        for props, queue_offset, physical in tail:
            got = producer_fields(props)
            if got is None:
                continue
            pid, seq, _ = got
            key = (pid, topic, queue_id)
            window = self._windows.setdefault(key, _Window())
            if seq in window.stored:
                continue  # a later message naming the same send: its first one counts
            done: asyncio.Future[Where] = loop.create_future()
            done.set_result((queue_offset, physical))
            self._remember(window, seq, done)
            firsts[pid] = min(firsts.get(pid, seq), seq)
        for pid, first in firsts.items():
            # older sends of this producer lie before the scanned tail: unknown, so stale
            window = self._windows[(pid, topic, queue_id)]
            window.low = max(window.low, first)

    def claim(self, pid: int, topic: str, queue_id: int, seq: int) -> Claim:
        """OK with a future the caller settles (``stored``/``failed``); DUPLICATE with the
        original's future; STALE below the window."""
        key = (pid, topic, queue_id)
        window = self._windows.setdefault(key, _Window())
        found = window.stored.get(seq)
        if found is not None:
            return Claim(DUPLICATE, found, key, seq)
        if seq < window.low:
            return Claim(STALE, None, key, seq)
        fut: asyncio.Future[Where] = asyncio.get_running_loop().create_future()
        self._remember(window, seq, fut)
        return Claim(OK, fut, key, seq)

    def _remember(self, window: _Window, seq: int, fut: asyncio.Future[Where]) -> None:
        window.stored[seq] = fut
        heapq.heappush(window.heap, seq)
        while len(window.heap) > self.retained:
            oldest = heapq.heappop(window.heap)
            window.stored.pop(oldest, None)
            window.low = max(window.low, oldest + 1)

    def stored(self, claim: Claim, queue_offset: int, physical: int) -> None:
        if claim.future is not None and not claim.future.done():
            claim.future.set_result((queue_offset, physical))

    def failed(self, claim: Claim, exc: BaseException) -> None:
        """Not stored: forget the sequence (a retry may store it) and fail waiting copies."""
        window = self._windows.get(claim.key)
        if window is not None and window.stored.get(claim.seq) is claim.future:
            del window.stored[claim.seq]
            window.heap.remove(claim.seq)
            heapq.heapify(window.heap)
        if claim.future is not None and not claim.future.done():
            claim.future.set_exception(exc)
            claim.future.exception()  # a copy waiting on it re-raises; none waiting is fine

    def forget_queue(self, topic: str, queue_id: int) -> None:
        """After the queue's data went away (topic deleted): load afresh next time."""
        self._loaded.pop((topic, queue_id), None)
        for key in [k for k in self._windows if k[1] == topic and k[2] == queue_id]:
            del self._windows[key]

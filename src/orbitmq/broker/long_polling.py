"""Long polling: a pull that finds nothing waits until a message arrives or its time is up.

The store reports each queue's new max offset. Usually that happens on the event loop itself
(the broker dispatches inline after its appends, store_bridge.py) and the waiting pulls are
woken right there; from the store's dispatcher thread (catch-up, replicated data, big batches)
the news goes to the loop with one ``call_soon_threadsafe``.

A waiter may bring an ``answer`` callback: on arrival it is called right there, on the loop, in
the dispatch round that made the message readable, and it reads the new messages and writes
the pull's response itself (the same loop iteration as the append, before the senders are
answered). The waiting task then only finishes; a callback that cannot answer (returns False,
or fails) leaves the task to do it, as without one. This saves a loop iteration and a task
step between the append and the response (docs/benchmarks.md, "Latency: the consume side").
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

Answer = Callable[[], bool]
"""Called on the loop when a message past the waiter's offset arrived; True if it answered
the pull itself."""
_Waiter = tuple[int, "asyncio.Future[bool]", Answer | None]


class LongPolling:
    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        """The loop the pulls wait on, set by `bind` at start (arrivals before it wake nobody)."""
        self.waiters: dict[tuple[str, int], list[_Waiter]] = {}
        self.held = 0
        self.answered = 0
        """Pulls answered by their ``answer`` callback in the round that dispatched (stats)."""
        self._loop_thread = -1

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Call on the loop's own thread."""
        self.loop = loop
        self._loop_thread = threading.get_ident()

    def on_arrival(self, topic: str, queue_id: int, max_offset: int) -> None:
        """Called on the loop (inline dispatch) or on the dispatcher thread."""
        loop = self.loop
        if loop is None or (topic, queue_id) not in self.waiters:
            return
        if threading.get_ident() == self._loop_thread:
            self._wake(topic, queue_id, max_offset)
        elif not loop.is_closed():
            loop.call_soon_threadsafe(self._wake, topic, queue_id, max_offset)

    def _wake(self, topic: str, queue_id: int, max_offset: int) -> None:
        waiting = self.waiters.get((topic, queue_id))
        if not waiting:
            return
        still = []
        for entry in waiting:
            offset, fut, answer = entry
            if max_offset > offset:
                if not fut.done():
                    if answer is not None and self._answer(answer):
                        self.answered += 1
                    fut.set_result(True)
            else:
                still.append(entry)
        if still:
            self.waiters[(topic, queue_id)] = still
        else:
            del self.waiters[(topic, queue_id)]

    @staticmethod
    def _answer(answer: Answer) -> bool:
        try:
            return answer()
        except Exception:  # the waiting task answers instead
            log.exception("answering a held pull on arrival failed")
            return False

    async def wait(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        timeout_s: float,
        ready: Callable[[], bool] | None = None,
        answer: Answer | None = None,
    ) -> bool:
        """True if a message past ``offset`` arrived within ``timeout_s``.

        ``ready`` is asked once the waiter is registered: an arrival reported between the
        caller's last look and the registration woke nobody, so without this second look the
        pull would sleep until the next message or its whole suspend time. ``answer``: see the
        module docstring (the caller learns from its own callback whether it answered).
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        entry: _Waiter = (offset, fut, answer)
        self.waiters.setdefault((topic, queue_id), []).append(entry)
        self.held += 1
        # One timer handle that settles the future (False), not asyncio.timeout(), which makes
        # a context, reschedules its own handle and cancels the task: once per held pull.
        timer: asyncio.TimerHandle | None = None
        try:
            if ready is not None and ready():
                return True
            timer = loop.call_later(timeout_s, _expire, fut)
            return await fut
        finally:
            if timer is not None:
                timer.cancel()
            self.held -= 1
            waiting = self.waiters.get((topic, queue_id))
            if waiting is not None and entry in waiting:
                waiting.remove(entry)
                if not waiting:
                    del self.waiters[(topic, queue_id)]

    def wake_all(self) -> None:
        for waiting in self.waiters.values():
            for _, fut, _answer in waiting:
                if not fut.done():
                    fut.set_result(True)
        self.waiters.clear()


def _expire(fut: asyncio.Future[bool]) -> None:
    if not fut.done():
        fut.set_result(False)

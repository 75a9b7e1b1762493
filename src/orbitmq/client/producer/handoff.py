"""How the blocking Producer hands messages to its event loop thread and gets results back
without a thread hop, a lock round or a Future's own lock per message.

**To the loop: one wake-up per loop iteration.** ``send_async`` (in the caller's thread)
appends the prepared message to an :class:`Inbox` (a deque: appends and pops are atomic under
the GIL) and schedules :meth:`Inbox.drain` with ``call_soon_threadsafe`` only when no drain is
pending. The drain (on the loop) clears the flag first, then empties the deque, so a message
appended after the flag was cleared schedules the next drain itself: none is ever stranded,
and a burst of N sends costs one cross-thread wake-up, not N.

**Taking turns.** The caller's thread and the loop's share one GIL. A caller that never
blocks keeps it, and the loop thread, which gives it up at every poll and socket call, gets it
back only when the interpreter forces a switch (``sys.getswitchinterval()``, 5 ms): one libuv
callback per 5 ms while the caller runs ahead until ``max_buffered_bytes`` stops it. So with
``handoff_at`` entries queued and not yet drained, :meth:`Inbox.put` makes a caller (not the
loop's own thread) sleep on a condition until the next drain takes them (at most ``_TURN_S``):
the GIL goes to the loop at once, which drains, batches and sends what it took, and the
caller goes on. One sleep and one notify per turn (128 sends for the blocking Producer), not
per message; measured A/B in docs/benchmarks.md ("fourth pass").

**Back: one lock round per batch.** Each message gets a :class:`SendFuture`, a
``concurrent.futures.Future`` whose condition is the producer's shared one (no Condition and
RLock made per message). :func:`complete_all` and :func:`fail_all` settle every future of a
batch under one acquisition of that condition, notify waiters once, then run callbacks (on
the loop thread, as ``send_async`` documents) and give the batch's bytes back to the
producer's buffer in one call. Any other future (an ``asyncio.Future`` of
``AsyncProducer.send_async``) is settled the usual way, so one batch may hold both.

``SendFuture`` provides the six attributes the stdlib's ``Future.__init__`` sets (``_condition``,
``_state``, ``_result``, ``_exception``, ``_waiters``, ``_done_callbacks``) so every inherited
method (``result``, ``add_done_callback``, ``concurrent.futures.wait``, ...) works unchanged;
tests/client/test_handoff.py fails if a Python release changes that set. The two lists are made
on first use (properties): most futures never get a waiter or a done-callback, and two lists
per message, alive until its answer, were two more objects per unanswered message for the
cyclic GC to walk (py-spy put 15 % of a blocking send_async loop in ``gc_collect_main``).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures._base import FINISHED, RUNNING
from typing import Any, Protocol

from orbitmq.client.producer.prepare import PreparedMessage
from orbitmq.client.producer.types import SendCallback, SendResult

log = logging.getLogger(__name__)

__all__ = [
    "Completion",
    "Inbox",
    "PendingSend",
    "SendFuture",
    "complete_all",
    "fail_all",
    "pending_type",
]


class Completion(Protocol):
    """What a batch settles per message: an asyncio.Future or a :class:`SendFuture`."""

    def done(self) -> bool: ...

    def set_result(self, result: SendResult, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


class BufferOwner(Protocol):
    """The producer whose buffer a SendFuture's bytes count against."""

    def release_buffer(self, nbytes: int) -> None: ...


class SendFuture(concurrent.futures.Future[SendResult]):
    """A blocking ``send_async``'s future: already running (``cancel()`` returns False), its
    condition shared with every future of the same producer."""

    # Made on first use (see the module docstring); class-level None until then, so reading
    # them never makes an instance __dict__ (one more object for the GC per message).
    _lazy_waiters: list[Any] | None = None
    _lazy_callbacks: list[Callable[[concurrent.futures.Future[SendResult]], Any]] | None = None
    owner: BufferOwner
    nbytes: int
    callback: SendCallback | None

    def __init__(
        self,
        condition: threading.Condition,
        owner: BufferOwner,
        nbytes: int,
        callback: SendCallback | None,
    ) -> None:
        # What Future.__init__ sets, with the shared condition and the lists made on first use
        # (see the module docstring).
        self._condition = condition
        self._state = RUNNING
        self._result: SendResult | None = None
        self._exception: BaseException | None = None
        self.owner = owner
        self.nbytes = nbytes
        self.callback = callback

    @property
    def _waiters(self) -> list[Any]:
        got = self._lazy_waiters
        if got is None:
            got = self._lazy_waiters = []
        return got

    @_waiters.setter
    def _waiters(self, value: list[Any]) -> None:
        self._lazy_waiters = value

    @property
    def _done_callbacks(self) -> list[Callable[[concurrent.futures.Future[SendResult]], Any]]:
        got = self._lazy_callbacks
        if got is None:
            got = self._lazy_callbacks = []
        return got

    @_done_callbacks.setter
    def _done_callbacks(
        self, value: list[Callable[[concurrent.futures.Future[SendResult]], Any]]
    ) -> None:
        self._lazy_callbacks = value

    def set_result(self, result: SendResult) -> None:
        complete_all([self], [result])

    def set_exception(self, exception: BaseException | None) -> None:
        fail_all([self], exception or concurrent.futures.CancelledError())


class PendingSend(SendFuture, PreparedMessage):
    """One blocking ``send_async``: the prepared message and its future in ONE object.

    The accumulator batches it as the item and settles it as the future, so an unanswered
    message is one object for the cyclic GC to walk, not four (Message, PreparedMessage,
    future and its dict): with ``max_buffered_bytes`` of 64 MiB unanswered, the cyclic GC's
    full collections walking those objects cost about as much CPU as the sends themselves.
    The producer makes a subclass with its ``_condition`` and ``owner`` as class attributes
    (:func:`pending_type`); the constructor takes PreparedMessage's fields
    (``MessagePreparer.prepare(msg, make=...)``), and ``send_async`` sets ``nbytes`` and
    ``callback``."""

    _state = RUNNING
    _result = None
    _exception = None

    def __init__(
        self,
        msg: Any,
        body: bytes,
        props: bytes,
        msg_id: str,
        sys_flag: int,
        topic: str,
        flag: int,
    ) -> None:
        self.msg = msg
        self.body = body
        self.props = props
        self.msg_id = msg_id
        self.sys_flag = sys_flag
        self.topic = topic
        self.flag = flag


def pending_type(condition: threading.Condition, owner: BufferOwner) -> type[PendingSend]:
    """A PendingSend class bound to one producer's condition and buffer."""
    return type("PendingSend", (PendingSend,), {"_condition": condition, "owner": owner})


def complete_all(futures: Sequence[Completion], results: Sequence[SendResult]) -> None:
    """Give each future its result (futures already done are skipped)."""
    if len(futures) != len(results):
        raise ValueError(f"{len(futures)} futures, {len(results)} results")
    mine = [f for f in futures if isinstance(f, SendFuture)]
    if len(mine) == len(futures):  # the blocking producer's batch: one pass, no pairs built
        if mine:
            _settle(mine, results, None)
        return
    mine_results: list[SendResult] = []
    for fut, result in zip(futures, results, strict=True):
        if isinstance(fut, SendFuture):
            mine_results.append(result)
        elif not fut.done():
            fut.set_result(result)
    if mine:
        _settle(mine, mine_results, None)


def fail_all(futures: Sequence[Completion], exc: BaseException) -> None:
    """Fail each future with ``exc`` (futures already done are skipped)."""
    mine: list[SendFuture] = []
    for fut in futures:
        if isinstance(fut, SendFuture):
            mine.append(fut)
        elif not fut.done():
            fut.set_exception(exc)
    if mine:
        _settle(mine, None, exc)


def _settle(
    futures: list[SendFuture], results: Sequence[SendResult] | None, exc: BaseException | None
) -> None:
    """Settle ``futures`` (with ``results[i]``, or with ``exc`` when results is None) under one
    acquisition of their producer's condition, then run callbacks and give the bytes back."""
    settled: list[SendFuture] = []
    others: list[SendFuture] = []
    others_results: list[SendResult] = []
    condition = futures[0]._condition
    with condition:
        for i, fut in enumerate(futures):
            if fut._condition is not condition:  # another producer's: after this lock
                others.append(fut)
                if results is not None:
                    others_results.append(results[i])
            elif fut._state == RUNNING:  # else settled already
                if results is None:
                    fut._exception = exc
                else:
                    fut._result = results[i]
                fut._state = FINISHED
                if fut._lazy_waiters:
                    for waiter in fut._lazy_waiters:
                        if exc is None:
                            waiter.add_result(fut)
                        else:
                            waiter.add_exception(fut)
                settled.append(fut)
        condition.notify_all()
    nbytes = 0
    owner: BufferOwner | None = None
    for fut in settled:
        if fut._lazy_callbacks:
            fut._invoke_callbacks()  # type: ignore[attr-defined]  # the stdlib's, see above
        callback = fut.callback
        if callback is not None:
            try:
                callback(fut._result, exc)
            except Exception:
                log.exception("send callback %r raised", callback)
        if owner is not fut.owner:
            if owner is not None:
                owner.release_buffer(nbytes)
            owner, nbytes = fut.owner, 0
        nbytes += fut.nbytes
    if owner is not None:
        owner.release_buffer(nbytes)
    if others:
        _settle(others, others_results if results is not None else None, exc)


_TURN_S = 0.05
"""A caller waits at most this long for the loop's drain (a loop that is stopping, or one
that has not run since, must not hold a caller longer; buffer back-pressure still applies)."""

Entry = Any
"""What one ``send_async`` puts in the inbox (a tuple of ``handle``'s arguments, or any object
when the inbox has ``handle_many``); the consumer of the inbox knows its shape."""


class Inbox:
    """Entries from any thread, handed to ``handle(*entry)`` on the loop in order, one wake-up per
    loop iteration (see the module docstring)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        handle: Callable[..., None],
        handle_many: Callable[[list[Any]], None] | None = None,
        handoff_at: int = 0,
    ) -> None:
        self._loop = loop
        self._handle = handle
        self._handle_many = handle_many
        """When given, the drain hands it every entry queued, in order, in one list (then an
        entry need not be a tuple: its consumer knows the shapes)."""
        self._entries: collections.deque[Entry] = collections.deque()
        self._scheduled = False
        self.handoff_at = handoff_at
        """Entries queued and not drained at which a putting thread waits for the next drain
        (0: never); see "Taking turns" in the module docstring."""
        self._drains = 0
        """Drains done (written by the loop only): a waiting caller's turn ends when it moves."""
        self._turn = threading.Condition(threading.Lock())
        self._sleepers = 0
        """Callers waiting in :meth:`_take_turns` (changed under ``_turn``)."""

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, entry: Entry) -> None:
        """Queue ``entry`` (any thread); RuntimeError when the loop is closed.

        Past ``handoff_at`` undrained entries, a thread other than the loop's waits here (at
        most ``_TURN_S``) until the loop has drained once: see "Taking turns"."""
        entries = self._entries
        entries.append(entry)
        if not self._scheduled:
            self._scheduled = True
            try:
                self._loop.call_soon_threadsafe(self.drain)
            except BaseException:
                self._scheduled = False
                raise
        elif len(entries) >= self.handoff_at > 0:
            self._take_turns()

    def _take_turns(self) -> None:
        """Wait (GIL released) for the loop's next drain, bounded by ``_TURN_S``."""
        if self._loop.is_closed() or asyncio.events._get_running_loop() is self._loop:
            return  # the loop's own thread (a callback) must not wait for itself
        drains = self._drains
        with self._turn:
            self._sleepers += 1
            try:
                if self._drains == drains and len(self._entries) >= self.handoff_at:
                    self._turn.wait(_TURN_S)
            finally:
                self._sleepers -= 1

    def drain(self) -> None:
        """Hand every queued entry to ``handle`` (on the loop)."""
        self._scheduled = False  # first: an entry put from here on schedules its own drain
        entries, handle, many = self._entries, self._handle, self._handle_many
        if many is not None:
            while entries:
                # Only this thread pops: the len() entries there now are there to take.
                pop = entries.popleft
                taken = [pop() for _ in range(len(entries))]
                self._turn_over()
                many(taken)
            return
        while entries:
            handle(*entries.popleft())
        self._turn_over()

    def _turn_over(self) -> None:
        """The queued entries are taken: a caller waiting for its turn may go on."""
        self._drains += 1
        if self._sleepers:
            with self._turn:
                self._turn.notify_all()

    def take_all(self) -> list[Entry]:
        """Remove and return what is queued (for failing it once the loop is gone)."""
        out: list[Entry] = []
        while self._entries:
            try:
                out.append(self._entries.popleft())
            except IndexError:  # emptied by another thread meanwhile
                break
        return out

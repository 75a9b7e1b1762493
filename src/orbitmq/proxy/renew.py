"""Auto-renew: the proxy keeps a push consumer's messages invisible while the client holds them.

A push consumer sends ``auto_renew`` and no invisible duration: the proxy pops with its default
invisible time (60 s) and, while the client holds the message, extends it before it ends, up to
``auto_renew_max_s`` (3 h). The client keeps the handle it got; the proxy maps it to the broker's
current one at ack / change / forward time (:meth:`Renewer.take`). When the client goes away its
held messages are made visible again after 1 s (consumer_service.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

from orbitmq.common.clock import now_ms
from orbitmq.common.errors import MQError, ReceiptHandleExpiredError, ReceiptHandleInvalidError
from orbitmq.common.tasks import TaskSet
from orbitmq.proxy.consumer_calls import ConsumerCalls, Held

log = logging.getLogger(__name__)

RENEW_RETRIES = 3
RENEW_CONCURRENCY = 32


class Renewer:
    """Keeps auto-renewed messages invisible while their client holds them.

    ``held`` maps the handle the client got to the message's current broker handle and deadline.
    Every ``period_s`` the messages due within ``ahead_s`` get CHANGE_MESSAGE_INVISIBLETIME
    (``invisible_ms`` from now), at most RENEW_CONCURRENCY at once. A renewal refused because the
    handle is no longer current (acked elsewhere, expired) drops the message, as does one held
    past ``max_s`` (it then becomes visible when its time ends, and is redelivered).
    """

    def __init__(
        self,
        calls: ConsumerCalls,
        *,
        period_s: float,
        ahead_s: float,
        invisible_ms: int,
        max_s: float,
    ) -> None:
        self.calls = calls
        self.period_s = period_s
        self.ahead_ms = int(ahead_s * 1000)
        self.invisible_ms = invisible_ms
        self.max_ms = int(max_s * 1000)
        self.held: dict[str, Held] = {}
        self.renewed = 0
        self._task: asyncio.Task[None] | None = None
        self._limit = asyncio.Semaphore(RENEW_CONCURRENCY)
        self.tasks = TaskSet("proxy-renew", logger=log)
        """Renewals and the nacks and DLQ forwards the consumer RPCs start in the background."""

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="orbitmq-proxy-renew")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.tasks.close()

    async def take(self, text: str) -> Held | None:
        """Stop renewing the message the client knows by ``text``; its current state (after a
        renewal in flight lands, so the caller gets the broker's newest handle)."""
        held = self.held.pop(text, None)
        if held is not None and held.renewing is not None:
            await asyncio.wait([held.renewing])  # its outcome is in ``held``; never raises
        return held

    def client_gone(self, client_id: str) -> list[Held]:
        gone = [t for t, h in self.held.items() if h.client_id == client_id]
        return [h for t in gone if (h := self.held.pop(t, None)) is not None]

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self.tasks.spawn(coro)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            try:
                self.scan(now_ms())
            except Exception:  # never let the loop die: held messages would time out
                log.exception("auto-renew scan failed")

    def scan(self, now: int) -> None:
        for text, held in list(self.held.items()):
            if held.renewing is not None or held.deadline_ms - now > self.ahead_ms:
                continue
            if now - held.first_ms >= self.max_ms:
                log.info("stop renewing %s of %s: held for %d s", text, held.group,
                         (now - held.first_ms) // 1000)  # fmt: skip
                del self.held[text]
                continue
            held.renewing = self.tasks.spawn(self._renew(text, held))

    async def _renew(self, text: str, held: Held) -> None:
        try:
            async with self._limit:
                handle, deadline = await self.calls.change_invisible(
                    held.group, held.topic, held.broker_name, held.broker_handle, self.invisible_ms
                )
            held.broker_handle, held.deadline_ms, held.failures = handle, deadline, 0
            self.renewed += 1
        except MQError as exc:
            held.failures += 1
            stale = isinstance(exc, (ReceiptHandleInvalidError, ReceiptHandleExpiredError))
            if stale or held.failures > RENEW_RETRIES:
                # No longer current (acked elsewhere, expired), or the broker keeps failing:
                # the message becomes visible when its time ends and is delivered again.
                self.held.pop(text, None)
                log.info("stop renewing %s: %s", text, exc)
            else:
                log.warning("renewing %s failed (%d): %s", text, held.failures, exc)
        finally:
            held.renewing = None

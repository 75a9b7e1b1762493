"""Background tasks that cannot die silently.

Every long-lived or fire-and-forget ``asyncio`` task in OrbitMQ is started through a
`TaskSet`. It keeps a strong reference to each task (the event loop keeps only a weak one, so an
unreferenced task can be garbage-collected mid-flight), and when a task ends with an exception
other than cancellation it logs the traceback under the set's name and counts it. The count is
what a metric or a test reads: a service thread or task that died shows up there, never only in a
log nobody reads.

``asyncio.TaskGroup`` is the right tool when the caller waits for all its tasks; a `TaskSet` is for
tasks that outlive the function that started them (per-request handlers, refreshes, pollers).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)


class TaskSet:
    """Holds running tasks; logs and counts the ones that fail.

    ``on_failure`` (optional) is called with the exception after it is logged, for example to
    bump a Prometheus counter.
    """

    def __init__(
        self,
        name: str,
        *,
        logger: logging.Logger | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.name = name
        self.failures = 0
        self._log = logger or log
        self._on_failure = on_failure
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
        """Start ``coro`` on the running loop and keep it until it ends."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        self.failures += 1
        self._log.error("%s: background task %s failed", self.name, task.get_name(), exc_info=exc)
        if self._on_failure is not None:
            try:
                self._on_failure(exc)
            except Exception:  # noqa: BLE001 - a broken hook must not hide the failure it reports
                self._log.exception("%s: failure hook raised", self.name)

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Any:
        return iter(list(self._tasks))

    def cancel(self) -> None:
        """Cancel every task still running (does not wait)."""
        for task in list(self._tasks):
            task.cancel()

    async def close(self, timeout: float | None = None) -> None:
        """Cancel every task and wait (at most ``timeout`` seconds) until they have ended."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)

    async def wait(self, timeout: float | None = None) -> None:
        """Wait (at most ``timeout`` seconds) for the tasks running now to end, without cancelling."""
        tasks = list(self._tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)

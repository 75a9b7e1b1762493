"""A private event loop on a background thread, for the blocking wrappers of async clients."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Generic, Protocol, TypeVar

from orbitmq.common.errors import ClientError
from orbitmq.net.loop import new_event_loop

T = TypeVar("T")


class LoopThread:
    """Runs an event loop (uvloop when installed) on a daemon thread until :meth:`stop`."""

    def __init__(
        self, name: str, loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    ) -> None:
        self.loop = (loop_factory or new_event_loop)()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._stopped = False
        self._thread.start()
        self._ready.wait()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        try:
            self.loop.run_forever()
        finally:
            try:
                self.loop.run_until_complete(self._cancel_all())
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            finally:
                self.loop.close()

    @staticmethod
    async def _cancel_all() -> None:
        me = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not me]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @property
    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if self._stopped:
            coro.close()
            raise ClientError("client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (not from the loop's own thread)."""
        if self.in_loop_thread:
            coro.close()
            raise ClientError("a blocking client call from its own I/O thread (a callback?)")
        fut = self.submit(coro)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._stopped:
            raise ClientError("client is closed")
        self.loop.call_soon_threadsafe(fn, *args)

    def stop(self) -> None:
        """Stop the loop (cancelling what still runs on it) and join the thread."""
        if self._stopped:
            return
        self._stopped = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        if not self.in_loop_thread:
            self._thread.join()


class _Closable(Protocol):
    async def close(self) -> None: ...


C = TypeVar("C", bound=_Closable)
F = TypeVar("F", bound="BlockingFacade[Any]")


class BlockingFacade(Generic[C]):
    """Closing and context-manager support shared by the blocking wrappers: each keeps its
    async client in ``_async`` and the loop it runs on in ``_thread``."""

    _thread: LoopThread
    _async: C
    _closed: bool

    def close(self) -> None:
        """Close the async client on its loop, then stop the loop thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._thread.run(self._async.close())
        finally:
            self._thread.stop()

    def __enter__(self: F) -> F:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

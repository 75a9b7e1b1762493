"""LoopThread, the event loop thread under the blocking clients."""

from __future__ import annotations

import asyncio
import threading

import pytest

from orbitmq.client._loop_thread import LoopThread
from orbitmq.common.errors import ClientError


def test_run_submit_and_stop_cancels_leftovers() -> None:
    lt = LoopThread("t")
    try:
        assert lt.run(asyncio.sleep(0, result=7)) == 7
        assert lt.run(_thread_name()) == "t"
        cancelled = threading.Event()

        async def forever() -> None:
            try:
                await asyncio.sleep(3600)
            finally:
                cancelled.set()

        lt.submit(forever())
        with pytest.raises(TimeoutError):
            lt.run(asyncio.sleep(10), timeout=0.05)
    finally:
        lt.stop()
    assert cancelled.is_set()
    assert lt.loop.is_closed()
    with pytest.raises(ClientError):
        lt.submit(asyncio.sleep(0))
    lt.stop()  # idempotent


async def _thread_name() -> str:
    return threading.current_thread().name


def test_blocking_call_from_the_loop_thread_is_refused() -> None:
    lt = LoopThread("t")
    try:

        async def inner() -> None:
            lt.run(asyncio.sleep(0))

        with pytest.raises(ClientError, match="own I/O thread"):
            lt.run(inner())
    finally:
        lt.stop()


def test_runs_uvloop_by_default() -> None:
    uvloop = pytest.importorskip("uvloop")
    lt = LoopThread("t")
    try:
        assert isinstance(lt.loop, uvloop.Loop)
    finally:
        lt.stop()

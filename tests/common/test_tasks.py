"""TaskSet: a failed background task is logged and counted, never silent."""

from __future__ import annotations

import asyncio
import logging

import pytest

from orbitmq.common.clock import ManualClock, SystemClock
from orbitmq.common.tasks import TaskSet


async def test_failure_is_logged_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[BaseException] = []
    tasks = TaskSet("unit", on_failure=seen.append)

    async def boom() -> None:
        raise RuntimeError("boom")

    with caplog.at_level(logging.ERROR):
        task = tasks.spawn(boom(), name="boom-task")
        await asyncio.wait([task])
        await asyncio.sleep(0)
    assert tasks.failures == 1
    assert len(tasks) == 0
    assert isinstance(seen[0], RuntimeError)
    assert "boom-task failed" in caplog.text


async def test_cancelled_and_finished_tasks_are_not_failures() -> None:
    tasks = TaskSet("unit")
    done = tasks.spawn(asyncio.sleep(0))
    forever = tasks.spawn(asyncio.sleep(3600))
    await asyncio.wait([done])
    assert len(tasks) == 1
    await tasks.close(timeout=1)
    assert forever.cancelled()
    assert tasks.failures == 0
    assert len(tasks) == 0


async def test_a_broken_hook_does_not_hide_the_failure() -> None:
    def hook(_exc: BaseException) -> None:
        raise ValueError("hook")

    tasks = TaskSet("unit", on_failure=hook)

    async def boom() -> None:
        raise RuntimeError("boom")

    await asyncio.wait([tasks.spawn(boom())])
    await asyncio.sleep(0)
    assert tasks.failures == 1


def test_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock(1000)
    assert clock.now_ms() == 1000
    clock.advance(250)
    assert clock.now_ms() == 1250
    assert clock.monotonic() == pytest.approx(0.25)
    real = SystemClock()
    assert abs(real.now_ms() - ManualClock(real.now_ms()).now_ms()) < 1000

"""Every broker background service is supervised (issue #14): an injected failure in one turn
of its loop is logged once with its cause, counted (``orbitmq_service_failures{service}``),
shown in the health (runtime info, ``orbitmq cluster list``, ``orbitmq_degraded{part}``) while
it lasts, the loop keeps retrying, and the health clears by itself once a turn works again."""

from __future__ import annotations

import asyncio
import errno
import inspect
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from orbitmq.broker.controller import BrokerController
from orbitmq.broker.metrics import HealthCollector
from orbitmq.net.client import RemotingClient
from tests.broker.conftest import broker_config
from tests.broker.test_health import runtime_health


@pytest.fixture
async def fast_broker(tmp_path: Path) -> AsyncIterator[BrokerController]:
    b = BrokerController(
        broker_config(
            tmp_path / "store",
            pop_revive_interval_ms=100,
            transaction_check_interval_ms=100,
            consumer_expiry_s=0.4,
            offset_persist_interval_s=0.1,
        )
    )
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


def _offsets_dirty(b: BrokerController) -> None:
    b.offsets.set("G", "T", 0, (b.offsets.query("G", "T", 0) or 0) + 1)


# service name -> (the object and method one turn of its loop calls, a poke that makes it run)
CASES: dict[str, tuple[Callable[[BrokerController], tuple[object, str]], Callable[..., None]]] = {
    "pop-revive": (lambda b: (b.pop.reviver, "revive_due"), lambda b: None),
    "pop-fifo-expiry": (lambda b: (b.pop, "expire_fifo"), lambda b: None),
    "timer": (lambda b: (b.timer, "write_checkpoint"), lambda b: b.timer._wake.set()),
    "transaction-check": (lambda b: (b.transactions, "write_checkpoint"), lambda b: None),
    "housekeeping": (lambda b: (b.consumers, "scan_expired"), lambda b: None),
    "offset-writer": (lambda b: (b.offsets, "_write_file"), _offsets_dirty),
    "namesrv-register": (lambda b: (b, "register_all"), lambda b: b.topics_changed()),
}


@pytest.mark.parametrize("service", sorted(CASES))
async def test_injected_failure_is_counted_shown_retried_and_cleared(
    service: str,
    fast_broker: BrokerController,
    client: RemotingClient,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    b = fast_broker
    target, poke = CASES[service]
    obj, attr = target(b)
    real = getattr(obj, attr)
    failing = True

    def check() -> None:
        if failing:
            raise OSError(errno.EIO, f"injected into {attr}")

    wrapped: Any
    if inspect.iscoroutinefunction(real):

        async def wrapped(*args: Any, **kwargs: Any) -> Any:
            check()
            return await real(*args, **kwargs)
    else:

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            check()
            return real(*args, **kwargs)

    assert await runtime_health(b, client) == "ok"
    caplog.set_level(logging.ERROR)
    monkeypatch.setattr(obj, attr, wrapped)
    for _ in range(500):  # retried with backoff: the counter keeps going up
        poke(b)
        if b.bridge.failure_counts().get(service, 0) >= 3:
            break
        await asyncio.sleep(0.02)
    assert b.bridge.failure_counts()[service] >= 3
    health = await runtime_health(b, client)
    assert f"{service}: OSError: [Errno 5] injected into {attr}" in health, health
    failures, degraded = HealthCollector(
        lambda: (b.bridge.failure_counts(), b.bridge.degraded())
    ).source()
    assert service in degraded and failures[service] >= 3
    logged = [r for r in caplog.records if r.getMessage().startswith(f"{service} failed")]
    assert len(logged) == 1 and logged[0].exc_info is not None  # once, with its cause

    failing = False
    for _ in range(500):
        poke(b)
        if await runtime_health(b, client) == "ok":
            break
        await asyncio.sleep(0.02)
    assert await runtime_health(b, client) == "ok"
    assert service not in b.bridge.degraded()

"""One injectable clock (Kafka's ``Time`` / ``MockTime``).

Code that stamps or compares wall-clock milliseconds takes a `Clock` instead of calling
``time.time()`` itself, so tests can move time by hand. `SYSTEM_CLOCK` is the real one;
`ManualClock` only moves when told.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock milliseconds since the epoch."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for timeouts and intervals)."""
        ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock for tests: starts at ``start_ms`` and moves only by `advance`."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._ms = start_ms
        self._mono = 0.0

    def now_ms(self) -> int:
        return self._ms

    def monotonic(self) -> float:
        return self._mono

    def advance(self, ms: int) -> None:
        self._ms += ms
        self._mono += ms / 1000


SYSTEM_CLOCK: Clock = SystemClock()


def now_ms() -> int:
    """Wall-clock milliseconds from the system clock."""
    return time.time_ns() // 1_000_000

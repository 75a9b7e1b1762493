"""Heap discipline for a serving process: cyclic-GC pauses measured, long-lived data frozen.

A full collection walks every tracked object (~0.1 us each): the broker's start-up heap alone
made 27-47 ms stalls that every message in flight paid (docs/benchmarks.md). So:

- ``settle_heap()`` (the server commands call it once the process is ready) collects and then
  ``gc.freeze()``s what is alive: topics, offsets, Pop and timer state, modules. Collections
  afterwards scan only what serving allocates.
- ``note_bulk_load()`` marks that a lot of long-lived data was just loaded (topics created,
  metadata synced); ``settle_if_loaded()``, called by the broker's housekeeping loop, collects
  and freezes again, at most once per turn, and only in a process that settled at start (a
  library user's process is never frozen behind its back).
- ``PAUSES`` records the duration of every collection through ``gc.callbacks``, per
  generation, in fixed buckets. The hook takes no lock and allocates nothing that lives on: a
  collection can start inside any allocation, also one made while a metrics lock is held.
  ``GcCollector`` turns it into ``orbitmq_gc_pause_seconds`` (a histogram) at scrape time.
- ``tune(thresholds)``: a larger first threshold than CPython's 700, so young collections come
  every few thousand sends instead of every few dozen, each still far under a millisecond.

Freezing is one-way for what it moves: a frozen object that later becomes cyclic garbage is
never collected (reference counting still frees acyclic objects). Only long-lived metadata is
meant to be frozen, which is why freezes follow start-up and bulk loads, not a timer.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

PAUSE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
"""Upper bounds in seconds; the target is no pause over 5 ms."""
LONG_PAUSE_S = 0.005


class GcPauses:
    """Every cyclic collection's pause, by generation (0-2). Process-wide: ``gc.callbacks``
    is one list per interpreter, so every broker of a process reads the same record."""

    def __init__(self) -> None:
        self.buckets = [[0] * (len(PAUSE_BUCKETS) + 1) for _ in range(3)]
        self.sums = [0.0, 0.0, 0.0]
        self.counts = [0, 0, 0]
        self.max_s = 0.0
        self.long_pauses = 0
        """Collections that took longer than LONG_PAUSE_S."""
        self._started = 0.0
        self._installed = False
        self.recording = True
        """False while settle_heap collects before the server is ready (not a serving pause)."""

    def install(self) -> None:
        """Start measuring (idempotent)."""
        if not self._installed:
            gc.callbacks.append(self._callback)
            self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            gc.callbacks.remove(self._callback)
            self._installed = False

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        # Collections never nest (the interpreter refuses to start one inside another), so
        # one start time is enough even with several threads.
        if phase == "start":
            self._started = time.perf_counter()
            return
        if self.recording:
            self.record(int(info["generation"]), time.perf_counter() - self._started)

    def record(self, generation: int, seconds: float) -> None:
        row = self.buckets[generation]
        for i, bound in enumerate(PAUSE_BUCKETS):
            if seconds <= bound:
                row[i] += 1
                break
        else:
            row[-1] += 1
        self.sums[generation] += seconds
        self.counts[generation] += 1
        if seconds > self.max_s:
            self.max_s = seconds
        if seconds > LONG_PAUSE_S:
            self.long_pauses += 1

    def info(self) -> dict[str, object]:
        """For runtime info: pauses so far, the longest, how many exceeded 5 ms, frozen objects."""
        return {
            "gc_collections": "/".join(str(c) for c in self.counts),
            "gc_pause_max_ms": round(self.max_s * 1000, 3),
            "gc_pauses_over_5ms": self.long_pauses,
            "gc_frozen_objects": gc.get_freeze_count(),
            "gc_thresholds": "/".join(str(t) for t in gc.get_threshold()),
        }


PAUSES = GcPauses()


class GcCollector(Collector):
    """``orbitmq_gc_pause_seconds{generation}`` (histogram), ``orbitmq_gc_pause_max_seconds``
    and ``orbitmq_gc_frozen_objects``, read from ``PAUSES`` at scrape time."""

    def __init__(self, pauses: GcPauses = PAUSES) -> None:
        self.pauses = pauses

    def collect(self) -> Iterator[HistogramMetricFamily | GaugeMetricFamily]:
        p = self.pauses
        h = HistogramMetricFamily(
            "orbitmq_gc_pause_seconds",
            "Cyclic garbage collection pauses of this process, by generation",
            labels=["generation"],
        )
        for gen in range(3):
            row = list(p.buckets[gen])  # a copy: a collection may land while this runs
            running, cumulative = 0, []
            for bound, n in zip((*PAUSE_BUCKETS, float("inf")), row, strict=True):
                running += n
                cumulative.append(("+Inf" if bound == float("inf") else str(bound), running))
            h.add_metric([str(gen)], cumulative, sum_value=p.sums[gen])
        yield h
        yield GaugeMetricFamily(
            "orbitmq_gc_pause_max_seconds", "Longest cyclic GC pause since start", value=p.max_s
        )
        yield GaugeMetricFamily(
            "orbitmq_gc_frozen_objects",
            "Objects moved out of the cyclic GC's reach by gc.freeze",
            value=gc.get_freeze_count(),
        )


class _State:
    settled = False
    loaded = False


def tune(thresholds: tuple[int, ...]) -> None:
    """Apply ``gc.set_threshold`` (an empty tuple leaves the interpreter's)."""
    if thresholds:
        gc.set_threshold(*thresholds)


def settle_heap() -> None:
    """Collect, then freeze everything alive (called by the process entry points once the
    server is ready); later ``settle_if_loaded`` calls freeze again after bulk loads."""
    PAUSES.install()
    PAUSES.recording = False  # the start-up heap's one full walk happens before serving
    try:
        gc.collect()
    finally:
        PAUSES.recording = True
    gc.freeze()
    _State.settled = True
    _State.loaded = False


def note_bulk_load() -> None:
    """A lot of long-lived data was just created: freeze it at the next housekeeping turn."""
    _State.loaded = True


def settle_if_loaded() -> bool:
    """Collect and freeze again if a bulk load happened since the last time and this process
    settled its heap at start. True if it did."""
    if not (_State.settled and _State.loaded):
        return False
    _State.loaded = False
    gc.collect()
    gc.freeze()
    return True

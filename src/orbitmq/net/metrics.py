"""Prometheus view of a listener's refusals: ``orbitmq_net_refused_total{listener, reason}``.

A collector rather than a Counter the net layer increments: :class:`~orbitmq.net.limits.Refusals`
stays a plain Counter (cheap, testable, no registry), and each server registers this view in
its own registry (one per server, so tests can run several).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from orbitmq.net.limits import REASONS, Refusals


class RefusalCollector(Collector):
    def __init__(self, listener: str, refusals: Refusals) -> None:
        self.listener = listener
        self.refusals = refusals

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "orbitmq_net_refused",
            "Connections refused or closed by a listener limit, and reading pauses, by reason",
            labels=["listener", "reason"],
        )
        counts = self.refusals.counts
        for reason in REASONS:
            family.add_metric([self.listener, reason], counts[reason])
        yield family

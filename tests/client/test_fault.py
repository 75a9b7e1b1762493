"""FaultStrategy: the latency table, isolation after failures, and queue selection."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from orbitmq.client.fault import FaultStrategy
from orbitmq.client.route import MessageQueue
from orbitmq.common.errors import ClientError


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000.0

    def __call__(self) -> float:
        return self.ms


def queues(*brokers: str, n: int = 2) -> list[MessageQueue]:
    return sorted(MessageQueue("T", b, i) for b in brokers for i in range(n))


@pytest.mark.parametrize(
    ("latency", "duration"),
    [
        (0, 0), (49, 0), (50, 0), (120, 0), (549, 0), (550, 30_000), (999, 30_000),
        (1000, 60_000), (2500, 120_000), (3000, 180_000), (14_999, 180_000), (15_000, 600_000),
        (99_999, 600_000),
    ],
)  # fmt: skip
def test_not_available_duration_table(latency: int, duration: int) -> None:
    assert FaultStrategy().not_available_duration(latency) == duration


def test_failure_isolates_for_30_s_and_slowness_by_the_table() -> None:
    clock = Clock()
    fs = FaultStrategy(clock=clock)
    fs.update("a", 10, failed=True)
    fs.update("b", 1200)  # slow: 60 s
    fs.update("c", 30)  # fast: fine
    assert not fs.is_available("a") and not fs.is_available("b") and fs.is_available("c")
    clock.ms += 29_999
    assert not fs.is_available("a")
    clock.ms += 1
    assert fs.is_available("a") and not fs.is_available("b")
    clock.ms += 30_000
    assert fs.is_available("b")
    # A fast answer clears a broker at once.
    fs.update("a", 10, failed=True)
    fs.update("a", 5)
    assert fs.is_available("a")


def test_selection_round_robins_and_skips_unavailable_brokers() -> None:
    clock = Clock()
    fs = FaultStrategy(clock=clock, rng=random.Random(7))
    qs = queues("a", "b", "c")
    seen = Counter(fs.select_queue("T", qs) for _ in range(600))
    assert set(seen) == set(qs) and all(v == 100 for v in seen.values())
    fs.update("b", 0, failed=True)
    seen = Counter(fs.select_queue("T", qs) for _ in range(400))
    assert {q.broker_name for q in seen} == {"a", "c"}
    # The skipped broker's share is spread evenly, not piled on its neighbour.
    assert all(v == 100 for v in seen.values()), seen
    clock.ms += 30_000
    assert "b" in {fs.select_queue("T", qs).broker_name for _ in range(10)}


def test_retry_avoids_last_broker_even_when_available() -> None:
    fs = FaultStrategy(rng=random.Random(3))
    qs = queues("a", "b")
    for _ in range(50):
        assert fs.select_queue("T", qs, last_broker="a").broker_name == "b"


def test_all_unavailable_falls_back_to_any_preferring_other_broker() -> None:
    fs = FaultStrategy(rng=random.Random(5))
    qs = queues("a", "b")
    fs.update("a", 0, failed=True)
    fs.update("b", 0, failed=True)
    assert fs.select_queue("T", qs) in qs
    for _ in range(20):
        assert fs.select_queue("T", qs, last_broker="a").broker_name == "b"
    # One broker only: it is the only choice, even right after it failed.
    only = queues("a")
    assert fs.select_queue("T", only, last_broker="a") in only
    # Unavailable brokers still lose to an available one that was the last failure.
    fs2 = FaultStrategy(rng=random.Random(5))
    fs2.update("b", 0, failed=True)
    for _ in range(20):
        assert fs2.select_queue("T", qs, last_broker="a").broker_name == "a"


def test_disabled_strategy_ignores_latency() -> None:
    fs = FaultStrategy(enabled=False, rng=random.Random(1))
    fs.update("a", 0, failed=True)
    assert fs.is_available("a")
    qs = queues("a", "b")
    assert {fs.select_queue("T", qs).broker_name for _ in range(10)} == {"a", "b"}


def test_no_queue_is_a_client_error() -> None:
    with pytest.raises(ClientError):
        FaultStrategy().select_queue("T", [])

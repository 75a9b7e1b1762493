"""The message-size histogram counts a small batch (bisect per message) exactly as a large one
(numpy) would: fed the same lengths both ways, the buckets agree."""

from __future__ import annotations

import random

import numpy as np

from orbitmq.broker.rocketmq_metrics import MESSAGE_SIZE_BUCKETS, RocketMQMetrics


def test_small_and_large_batches_fill_the_same_buckets() -> None:
    rng = random.Random(15)  # fixed seed: replayable
    edges = [int(b) for b in MESSAGE_SIZE_BUCKETS]
    lengths = [rng.choice([0, 1, *edges, *(e + 1 for e in edges)]) for _ in range(64)]
    small, large = RocketMQMetrics("c", "n"), RocketMQMetrics("c", "n")
    for i in range(0, 64, 8):  # batches of 8: the per-message path
        small.on_send("T", "normal", np.array(lengths[i : i + 8], dtype=np.int64))
    large.on_send("T", "normal", np.array(lengths, dtype=np.int64))  # 64: numpy
    key = ("T", "normal")
    assert small.sizes[key].counts == large.sizes[key].counts
    assert small.sizes[key].total == large.sizes[key].total == sum(lengths)

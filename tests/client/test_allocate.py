"""Allocation strategies: every queue has exactly one owner, results are stable, AVG is balanced."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orbitmq.client.allocate import (
    AVG,
    AVG_BY_CIRCLE,
    CONSISTENT_HASH,
    AllocateByConfig,
    AllocateConsistentHash,
    AllocateStrategy,
    resolve_strategy,
)
from orbitmq.client.route import MessageQueue
from orbitmq.common.errors import ClientError

SHARING = [AVG, AVG_BY_CIRCLE, CONSISTENT_HASH, AllocateConsistentHash(virtual_nodes=1)]

queue_lists = st.sets(
    st.builds(
        MessageQueue,
        st.just("T"),
        st.sampled_from(["broker-a", "broker-b", "broker-c"]),
        st.integers(0, 31),
    ),
    max_size=40,
).map(sorted)
client_lists = st.sets(
    st.text("abcdef0123456789@.", min_size=1, max_size=12), min_size=1, max_size=12
).map(sorted)


def allocate_all(
    strategy: AllocateStrategy, queues: list[MessageQueue], clients: list[str]
) -> dict[str, list[MessageQueue]]:
    return {c: strategy.allocate("G", c, queues, clients) for c in clients}


@pytest.mark.parametrize("strategy", SHARING, ids=lambda s: f"{s.name}")
@settings(max_examples=40, deadline=None)
@given(queues=queue_lists, clients=client_lists)
def test_every_queue_exactly_once(
    strategy: AllocateStrategy, queues: list[MessageQueue], clients: list[str]
) -> None:
    shares = allocate_all(strategy, queues, clients)
    owned = [mq for share in shares.values() for mq in share]
    assert sorted(owned) == queues  # each exactly once, none invented
    # Stable: the same inputs give the same answer (every member must agree).
    assert shares == allocate_all(strategy, list(queues), list(clients))


@settings(max_examples=50, deadline=None)
@given(queues=queue_lists, clients=client_lists)
def test_avg_is_balanced_within_one_and_contiguous(
    queues: list[MessageQueue], clients: list[str]
) -> None:
    shares = allocate_all(AVG, queues, clients)
    sizes = [len(s) for s in shares.values()]
    assert max(sizes) - min(sizes) <= 1
    # The larger shares go to the first clients, and each share is a contiguous run.
    assert sizes == sorted(sizes, reverse=True)
    flat = [mq for c in clients for mq in shares[c]]
    assert flat == queues


@settings(max_examples=50, deadline=None)
@given(queues=queue_lists, clients=client_lists)
def test_avg_by_circle_is_balanced_within_one(
    queues: list[MessageQueue], clients: list[str]
) -> None:
    sizes = [len(s) for s in allocate_all(AVG_BY_CIRCLE, queues, clients).values()]
    assert max(sizes) - min(sizes) <= 1


@settings(max_examples=30, deadline=None)
@given(queues=queue_lists, clients=client_lists, newcomer=st.text("xyz", min_size=13, max_size=14))
def test_consistent_hash_moves_queues_only_to_a_newcomer(
    queues: list[MessageQueue], clients: list[str], newcomer: str
) -> None:
    before = {
        mq: c for c, share in allocate_all(CONSISTENT_HASH, queues, clients).items() for mq in share
    }
    grown = sorted([*clients, newcomer])
    after = {
        mq: c for c, share in allocate_all(CONSISTENT_HASH, queues, grown).items() for mq in share
    }
    for mq in queues:
        assert after[mq] in (before[mq], newcomer)


@pytest.mark.parametrize("strategy", SHARING, ids=lambda s: f"{s.name}")
def test_unknown_member_and_empty_topic_get_nothing(strategy: AllocateStrategy) -> None:
    queues = [MessageQueue("T", "b", i) for i in range(4)]
    assert strategy.allocate("G", "stranger", queues, ["a", "b"]) == []
    assert strategy.allocate("G", "a", [], ["a", "b"]) == []


def test_avg_matches_rocketmq_examples() -> None:
    queues = [MessageQueue("T", "b", i) for i in range(10)]
    clients = ["c0", "c1", "c2"]
    got = {c: [mq.queue_id for mq in AVG.allocate("G", c, queues, clients)] for c in clients}
    assert got == {"c0": [0, 1, 2, 3], "c1": [4, 5, 6], "c2": [7, 8, 9]}
    few = queues[:2]
    got = {c: [mq.queue_id for mq in AVG.allocate("G", c, few, clients)] for c in clients}
    assert got == {"c0": [0], "c1": [1], "c2": []}
    got = {
        c: [mq.queue_id for mq in AVG_BY_CIRCLE.allocate("G", c, queues, clients)] for c in clients
    }
    assert got == {"c0": [0, 3, 6, 9], "c1": [1, 4, 7], "c2": [2, 5, 8]}


def test_config_returns_the_configured_queues_that_exist() -> None:
    queues = [MessageQueue("T", "b", i) for i in range(4)]
    mine = AllocateByConfig([queues[3], queues[1], MessageQueue("T", "gone", 0), queues[1]])
    assert mine.allocate("G", "anyone", queues, ["x"]) == [queues[1], queues[3]]
    assert mine.allocate("G", "anyone", queues[:1], ["x"]) == []


def test_resolve_strategy() -> None:
    assert resolve_strategy("avg") is AVG
    assert resolve_strategy("AVG_BY_CIRCLE") is AVG_BY_CIRCLE
    assert resolve_strategy("CONSISTENT_HASH") is CONSISTENT_HASH
    custom = AllocateByConfig([])
    assert resolve_strategy(custom) is custom
    with pytest.raises(ClientError, match="unknown allocate strategy"):
        resolve_strategy("RANDOM")
    with pytest.raises(ClientError):
        resolve_strategy(42)  # type: ignore[arg-type]
    with pytest.raises(ClientError):
        AllocateConsistentHash(virtual_nodes=0)

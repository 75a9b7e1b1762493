"""Queue allocation strategies: which queues of a topic each member of a consumer group reads.

Every member runs the same strategy on the same inputs (the topic's readable queues and the
group's client ids, both sorted) and keeps only its own share, so the group agrees without
talking: each queue goes to exactly one member as long as the members see the same lists. While
they do not (a member joined a moment ago and not everyone has heard), a queue may briefly have
two owners or none; the next rebalance fixes it.

The strategies are RocketMQ's:

- ``AVG`` (:class:`AllocateAveragely`): contiguous ranges; the first ``queues % clients``
  members get one queue more. The default.
- ``AVG_BY_CIRCLE`` (:class:`AllocateAveragelyByCircle`): round-robin, member ``i`` gets queues
  ``i, i + n, i + 2n, ...``; spreads a broker's queues over the members.
- ``CONSISTENT_HASH`` (:class:`AllocateConsistentHash`): a hash ring with virtual nodes; a member
  joining or leaving moves only about ``1/n`` of the queues (fewer handovers, less balance).
- ``CONFIG`` (:class:`AllocateByConfig`): an explicit list of queues for this member, whatever
  the others do (the operator makes sure every queue has an owner).

Each is a small object with a pure ``allocate`` method; pass one, or its name, to a consumer.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

from orbitmq.client.route import MessageQueue
from orbitmq.common.errors import ClientError

__all__ = [
    "AVG",
    "AVG_BY_CIRCLE",
    "CONSISTENT_HASH",
    "AllocateAveragely",
    "AllocateAveragelyByCircle",
    "AllocateByConfig",
    "AllocateConsistentHash",
    "AllocateStrategy",
    "resolve_strategy",
]


@runtime_checkable
class AllocateStrategy(Protocol):
    """``allocate(group, my_id, queues, client_ids)``: this member's queues of one topic.

    ``queues`` and ``client_ids`` are sorted and free of duplicates. A member not among
    ``client_ids`` gets nothing (it has not been seen by the broker yet)."""

    name: str

    def allocate(
        self,
        group: str,
        my_id: str,
        queues: Sequence[MessageQueue],
        client_ids: Sequence[str],
    ) -> list[MessageQueue]: ...


def _index(my_id: str, queues: Sequence[MessageQueue], client_ids: Sequence[str]) -> int | None:
    if not queues or my_id not in client_ids:
        return None
    return client_ids.index(my_id)


class AllocateAveragely:
    """Contiguous ranges, sizes differing by at most one (RocketMQ's default strategy)."""

    name = "AVG"

    def allocate(
        self,
        group: str,
        my_id: str,
        queues: Sequence[MessageQueue],
        client_ids: Sequence[str],
    ) -> list[MessageQueue]:
        index = _index(my_id, queues, client_ids)
        if index is None:
            return []
        n_queues, n_clients = len(queues), len(client_ids)
        base, extra = divmod(n_queues, n_clients)
        size = base + (1 if index < extra else 0)
        start = index * base + min(index, extra)
        return list(queues[start : start + size])


class AllocateAveragelyByCircle:
    """Member ``i`` of ``n`` gets queues ``i, i + n, ...``: neighbours (usually one broker's
    queues) are spread over the members."""

    name = "AVG_BY_CIRCLE"

    def allocate(
        self,
        group: str,
        my_id: str,
        queues: Sequence[MessageQueue],
        client_ids: Sequence[str],
    ) -> list[MessageQueue]:
        index = _index(my_id, queues, client_ids)
        if index is None:
            return []
        return list(queues[index :: len(client_ids)])


def _hash(key: str) -> int:
    # MD5 like RocketMQ's ConsistentHashRouter: stable across processes (hash() is salted).
    return int.from_bytes(hashlib.md5(key.encode(), usedforsecurity=False).digest()[:8], "big")


class AllocateConsistentHash:
    """A hash ring with ``virtual_nodes`` points per member; each queue goes to the first
    member point at or after the queue's hash. Membership changes move few queues; the shares
    are uneven for small groups (more virtual nodes even them out)."""

    name = "CONSISTENT_HASH"

    def __init__(self, virtual_nodes: int = 10) -> None:
        if virtual_nodes < 1:
            raise ClientError("virtual_nodes must be at least 1")
        self.virtual_nodes = virtual_nodes

    def allocate(
        self,
        group: str,
        my_id: str,
        queues: Sequence[MessageQueue],
        client_ids: Sequence[str],
    ) -> list[MessageQueue]:
        if _index(my_id, queues, client_ids) is None:
            return []
        ring = sorted(
            (_hash(f"{cid}-{i}"), cid) for cid in client_ids for i in range(self.virtual_nodes)
        )
        points = [p for p, _ in ring]
        out: list[MessageQueue] = []
        for mq in queues:
            at = bisect.bisect_left(points, _hash(str(mq)))
            if ring[at % len(ring)][1] == my_id:
                out.append(mq)
        return out


class AllocateByConfig:
    """Exactly the configured queues (those of the topic being allocated that exist now)."""

    name = "CONFIG"

    def __init__(self, queues: Iterable[MessageQueue]) -> None:
        self.queues = tuple(sorted(set(queues)))

    def allocate(
        self,
        group: str,
        my_id: str,
        queues: Sequence[MessageQueue],
        client_ids: Sequence[str],
    ) -> list[MessageQueue]:
        present = set(queues)
        return [mq for mq in self.queues if mq in present]


AVG = AllocateAveragely()
AVG_BY_CIRCLE = AllocateAveragelyByCircle()
CONSISTENT_HASH = AllocateConsistentHash()

_BY_NAME: dict[str, AllocateStrategy] = {
    "AVG": AVG,
    "AVERAGELY": AVG,
    "AVG_BY_CIRCLE": AVG_BY_CIRCLE,
    "CONSISTENT_HASH": CONSISTENT_HASH,
}


def resolve_strategy(strategy: str | AllocateStrategy) -> AllocateStrategy:
    """A strategy object from itself or its name ("AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH";
    CONFIG needs its queue list, so pass an :class:`AllocateByConfig`)."""
    if isinstance(strategy, str):
        found = _BY_NAME.get(strategy.upper())
        if found is None:
            raise ClientError(
                f"unknown allocate strategy {strategy!r} (AVG, AVG_BY_CIRCLE, CONSISTENT_HASH, "
                "or an AllocateByConfig)"
            )
        return found
    if not isinstance(strategy, AllocateStrategy):
        raise ClientError(f"not an allocate strategy: {strategy!r}")
    return strategy

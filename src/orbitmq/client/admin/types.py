"""What the admin client returns: pull results, topic and group descriptions."""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field

from orbitmq.common.codes import ResponseCode
from orbitmq.common.record import StoredMessage
from orbitmq.protocol.bodies import (
    TopicRouteData,
    TopicStats,
)
from orbitmq.protocol.consumer import (
    MemberInfo,
    QueueConsumeStats,
)

log = logging.getLogger(__name__)

__all__ = [
    "PULL_STATUS",
    "RESET_POSITIONS",
    "GroupDescription",
    "PullResult",
    "PullStatus",
    "TopicDescription",
]

RESET_POSITIONS = ("earliest", "latest", "timestamp")
"""Where INVOKE_BROKER_TO_RESET_OFFSET can move a group: each queue's min offset, its max
offset, or the first offset stored at or after a time."""


class PullStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    """Nothing at or after the offset (after the long poll, if one was asked for)."""
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    """Messages were there but none matched the tag filter; continue at next_begin_offset."""
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"
    """The offset is outside [min_offset, max_offset]; next_begin_offset says where to go."""


PULL_STATUS = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}


@dataclass(frozen=True, slots=True)
class PullResult:
    status: PullStatus
    messages: list[StoredMessage]
    next_begin_offset: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class RawPull:
    """A pull's answer undecoded: ``body`` holds the stored records back to back."""

    status: PullStatus
    body: bytes
    next_begin_offset: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class TopicDescription:
    topic: str
    route: TopicRouteData
    stats: list[TopicStats]
    """One entry per broker that answered, sorted by broker name."""
    errors: dict[str, str]
    """broker name -> why its stats are missing."""


@dataclass(frozen=True, slots=True)
class GroupDescription:
    """A consumer group as the brokers see it: who is in it and how far it got in each queue."""

    group: str
    members: list[MemberInfo]
    """Online members, one per client id, sorted (the brokers each see the same client; the
    freshest heartbeat wins). Empty when no member is online."""
    queues: list[QueueConsumeStats]
    """Every queue of every broker the group subscribes to or has offsets in (its retry topic
    included), sorted by topic, broker, queue."""
    consume_type: str = ""
    message_model: str = ""
    consume_from_where: str = ""
    """As the members' heartbeats declare them; empty when no member is online."""
    errors: dict[str, str] = field(default_factory=dict)
    """broker name -> why its part is missing (unreachable, an error answer)."""

    @property
    def total_lag(self) -> int:
        return sum(max(0, q.lag) for q in self.queues)

    @property
    def total_inflight(self) -> int:
        return sum(q.inflight for q in self.queues)

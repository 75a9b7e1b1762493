"""The classic Kafka group coordinator (JoinGroup / SyncGroup / Heartbeat / LeaveGroup), in memory.

Kafka's "classic" protocol with client-side assignment: members join, the coordinator waits
until every known member has (re)joined or the rebalance timeout passes, bumps the generation,
elects a leader and sends it every member's metadata; the leader computes the assignment and
sends it with its SyncGroup; the coordinator hands each member its part. Heartbeats answer
REBALANCE_IN_PROGRESS (27) while a rebalance runs, which makes members rejoin; a member silent
longer than its session timeout is removed. JoinGroup v4+ with an empty member id gets
MEMBER_ID_REQUIRED (79) and a fresh id (KIP-394). Parked JoinGroup/SyncGroup answers are
futures, so a rebalance never blocks a connection's other requests or the event loop.

Membership lives in this gateway's memory only: after a restart members rejoin, as they do
after any coordinator move in Kafka. Offsets are not kept here (see offsets in handlers): they
are the broker's consumer offsets.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orbitmq.kafka.names import legal_group

EMPTY, PREPARING, COMPLETING, STABLE = (
    "Empty",
    "PreparingRebalance",
    "CompletingRebalance",
    "Stable",
)

NONE = 0
ILLEGAL_GENERATION = 22
INCONSISTENT_GROUP_PROTOCOL = 23
INVALID_GROUP_ID = 24
UNKNOWN_MEMBER_ID = 25
INVALID_SESSION_TIMEOUT = 26
REBALANCE_IN_PROGRESS = 27
MEMBER_ID_REQUIRED = 79

Body = dict[str, Any]


@dataclass(slots=True)
class Member:
    member_id: str
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    group_instance_id: str | None = None
    assignment: bytes = b""
    last_seen: float = 0.0
    join: asyncio.Future[Body] | None = None
    sync: asyncio.Future[Body] | None = None


@dataclass(slots=True)
class Group:
    group_id: str
    state: str = EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    pending_ids: set[str] = field(default_factory=set)
    timer: asyncio.TimerHandle | None = None


class Coordinator:
    def __init__(
        self,
        *,
        min_session_ms: int,
        max_session_ms: int,
        initial_delay_ms: int,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.groups: dict[str, Group] = {}
        self.min_session_ms = min_session_ms
        self.max_session_ms = max_session_ms
        self.initial_delay_ms = initial_delay_ms
        self._clock = clock or (lambda: asyncio.get_running_loop().time())

    # -- JoinGroup -------------------------------------------------------------------------

    async def join(self, body: Body, version: int, client_id: str, host: str) -> Body:
        gid: str = body["group_id"]
        member_id: str = body["member_id"]
        session = int(body["session_timeout_ms"])
        rebalance = int(body.get("rebalance_timeout_ms") or -1)
        if rebalance < 0:
            rebalance = session
        if not legal_group(gid):  # kafka/names.py: no escaping, Kafka's own refusal
            return _join_error(INVALID_GROUP_ID, member_id)
        if not self.min_session_ms <= session <= self.max_session_ms:
            return _join_error(INVALID_SESSION_TIMEOUT, member_id)
        group = self.groups.setdefault(gid, Group(gid))
        protocols = [(p["name"], bytes(p["metadata"] or b"")) for p in body["protocols"]]
        ptype = body["protocol_type"]
        if not protocols or not ptype:  # Kafka's rule: nothing to choose a protocol from
            return _join_error(INCONSISTENT_GROUP_PROTOCOL, member_id)
        if group.members and (
            ptype != group.protocol_type or not self._compatible(group, member_id, protocols)
        ):
            return _join_error(INCONSISTENT_GROUP_PROTOCOL, member_id)
        if not member_id:
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            if version >= 4:
                group.pending_ids.add(member_id)
                return _join_error(MEMBER_ID_REQUIRED, member_id)
        elif member_id not in group.members and member_id not in group.pending_ids:
            return _join_error(UNKNOWN_MEMBER_ID, member_id)
        group.pending_ids.discard(member_id)
        loop = asyncio.get_running_loop()
        member = group.members.get(member_id)
        if member is None:
            member = Member(member_id, client_id, host, session, rebalance, ptype, protocols,
                            body.get("group_instance_id"))  # fmt: skip
            group.members[member_id] = member
        else:
            member.protocols, member.session_timeout_ms = protocols, session
            member.rebalance_timeout_ms = rebalance
        member.last_seen = self._clock()
        group.protocol_type = ptype
        if member.join is not None and not member.join.done():
            member.join.cancel()
        member.join = loop.create_future()
        fut = member.join
        if group.state in (EMPTY, STABLE, COMPLETING):
            self._prepare(group, first=group.state == EMPTY)
        self._maybe_complete(group)
        return await fut

    def _compatible(self, group: Group, member_id: str, protocols: list[tuple[str, bytes]]) -> bool:
        """Kafka's rule: one protocol every member supports, this one (as it now joins) and the
        others. Sharing one with each member pairwise is not enough ({x,y}, {y,z}, {x,z} have no
        common protocol: the rebalance then had none to choose; found by fuzzing)."""
        common = {n for n, _ in protocols}
        for m in group.members.values():
            if m.member_id != member_id:
                common &= {n for n, _ in m.protocols}
        return bool(common)

    def _prepare(self, group: Group, *, first: bool = False) -> None:
        """Start a rebalance: members must rejoin; parked syncs are told to."""
        group.state = PREPARING
        for m in group.members.values():
            if m.sync is not None and not m.sync.done():
                m.sync.set_result(_sync_error(REBALANCE_IN_PROGRESS))
            m.sync = None
        if group.timer is not None:
            group.timer.cancel()
        loop = asyncio.get_running_loop()
        delay = max((m.rebalance_timeout_ms for m in group.members.values()), default=0)
        if first:
            delay = min(delay, self.initial_delay_ms)
        group.timer = loop.call_later(delay / 1000, self._complete, group, True)

    def _maybe_complete(self, group: Group) -> None:
        if group.state != PREPARING or not group.members:
            return
        if all(m.join is not None and not m.join.done() for m in group.members.values()):
            first_round = group.generation == 0 and self.initial_delay_ms > 0
            if not first_round or group.timer is None:
                self._complete(group, False)

    def _complete(self, group: Group, timed_out: bool) -> None:
        if group.state != PREPARING:
            return
        if group.timer is not None:
            group.timer.cancel()
            group.timer = None
        for mid in [mid for mid, m in group.members.items() if m.join is None or m.join.done()]:
            del group.members[mid]  # did not rejoin in time
        if not group.members:
            group.state, group.leader, group.protocol = EMPTY, None, None
            group.generation += 1
            return
        group.generation += 1
        group.state = COMPLETING
        first = next(iter(group.members.values()))
        if group.leader not in group.members:
            group.leader = first.member_id
        common = set.intersection(*({n for n, _ in m.protocols} for m in group.members.values()))
        group.protocol = next(n for n, _ in group.members[group.leader].protocols if n in common)
        everyone = [
            {"member_id": m.member_id, "group_instance_id": m.group_instance_id,
             "metadata": dict(m.protocols)[group.protocol]}
            for m in group.members.values()
        ]  # fmt: skip
        for m in group.members.values():
            assert m.join is not None
            m.join.set_result({
                "error_code": NONE, "generation_id": group.generation,
                "protocol_type": group.protocol_type, "protocol_name": group.protocol,
                "leader": group.leader, "member_id": m.member_id,
                "members": everyone if m.member_id == group.leader else [],
            })  # fmt: skip
            m.join = None
            m.last_seen = self._clock()

    # -- SyncGroup / Heartbeat / LeaveGroup -------------------------------------------------

    async def sync(self, body: Body) -> Body:
        group = self.groups.get(body["group_id"])
        member = group.members.get(body["member_id"]) if group else None
        if group is None or member is None:
            return _sync_error(UNKNOWN_MEMBER_ID)
        if body["generation_id"] != group.generation:
            return _sync_error(ILLEGAL_GENERATION)
        if group.state == PREPARING:
            return _sync_error(REBALANCE_IN_PROGRESS)
        member.last_seen = self._clock()
        if group.state == STABLE:
            return self._sync_ok(group, member)
        if member.member_id == group.leader:
            given = {a["member_id"]: bytes(a["assignment"] or b"") for a in body["assignments"]}
            for m in group.members.values():
                m.assignment = given.get(m.member_id, b"")
            group.state = STABLE
            for m in group.members.values():
                if m.sync is not None and not m.sync.done():
                    m.sync.set_result(self._sync_ok(group, m))
                m.sync = None
            return self._sync_ok(group, member)
        member.sync = asyncio.get_running_loop().create_future()
        return await member.sync

    def _sync_ok(self, group: Group, m: Member) -> Body:
        return {"error_code": NONE, "protocol_type": group.protocol_type,
                "protocol_name": group.protocol, "assignment": m.assignment}  # fmt: skip

    def heartbeat(self, body: Body) -> int:
        group = self.groups.get(body["group_id"])
        member = group.members.get(body["member_id"]) if group else None
        if group is None or member is None:
            return UNKNOWN_MEMBER_ID
        member.last_seen = self._clock()
        if group.state == PREPARING:
            return REBALANCE_IN_PROGRESS
        if body["generation_id"] != group.generation:
            return ILLEGAL_GENERATION
        return NONE

    def leave(self, group_id: str, member_ids: list[str]) -> list[int]:
        group = self.groups.get(group_id)
        codes = []
        for mid in member_ids:
            member = group.members.pop(mid, None) if group else None
            codes.append(UNKNOWN_MEMBER_ID if member is None else NONE)
            if member is not None and member.join is not None and not member.join.done():
                member.join.set_result(_join_error(UNKNOWN_MEMBER_ID, mid))
        if group is not None and NONE in codes:
            self._after_removal(group)
        return codes

    def _after_removal(self, group: Group) -> None:
        if not group.members:
            if group.timer is not None:
                group.timer.cancel()
                group.timer = None
            group.state, group.leader, group.protocol = EMPTY, None, None
            group.generation += 1
        elif group.state in (STABLE, COMPLETING):
            self._prepare(group)
        else:
            self._maybe_complete(group)

    def expire(self) -> int:
        """Remove members silent for longer than their session timeout; returns how many."""
        now = self._clock()
        removed = 0
        for group in list(self.groups.values()):
            dead = [mid for mid, m in group.members.items()
                    if m.join is None and now - m.last_seen > m.session_timeout_ms / 1000]  # fmt: skip
            for mid in dead:
                del group.members[mid]
                removed += 1
            if dead:
                self._after_removal(group)
        return removed

    def generation_ok(self, group_id: str, member_id: str, generation: int) -> int:
        """OffsetCommit's check: members commit in their generation; -1/"" is a simple consumer."""
        if generation < 0 and not member_id:
            return NONE
        group = self.groups.get(group_id)
        if group is None or member_id not in group.members:
            return UNKNOWN_MEMBER_ID if generation >= 0 else NONE
        if generation != group.generation:
            return ILLEGAL_GENERATION
        return REBALANCE_IN_PROGRESS if group.state == PREPARING else NONE


def _join_error(code: int, member_id: str) -> Body:
    return {"error_code": code, "generation_id": -1, "protocol_name": "", "leader": "",
            "member_id": member_id, "members": []}  # fmt: skip


def _sync_error(code: int) -> Body:
    return {"error_code": code, "assignment": b""}

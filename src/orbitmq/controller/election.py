"""Who becomes master, and when an election may run at all: pure policy, no Raft, no clock.

`choose` is RocketMQ's DefaultElectPolicy (docs/ha.md, "Election"):

- candidates are the alive SyncStateSet members (they hold every acknowledged byte);
- the old master alive and nobody designated (or the old master designated): MASTER_STILL_EXIST;
- a designated broker wins only if it is an alive candidate, else the election fails;
- otherwise rank by last epoch (desc), max offset (desc), election priority (asc), then broker id
  (asc, so every node of the controller computes the same answer);
- with unclean election allowed (off by default) and no alive SyncStateSet member, every alive
  replica is a candidate: acknowledged messages may be lost, which is why it is off;
- the first election of a group (master epoch 0) makes the requester (or the designated
  broker) master.

`choose` runs inside the replicated ``elect_master`` command, on every controller node in log
order, with the liveness snapshot the proposer recorded in the command: the same inputs give the
same master everywhere.

`election_wait` is the timing rule that keeps two masters from acknowledging at once (brief 5.7
(c)(d)): a master stops acknowledging ``master_lease`` after the last heartbeat the Raft leader
answered; so the controller elects only once ``master_lease + margin`` have passed since the
master's last heartbeat *this node* saw, and ``master_lease + leader_fallback + margin`` since
this node became Raft leader (a deposed leader keeps answering heartbeats, and so renewing
leases, for up to ``leader_fallback``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Set
from dataclasses import dataclass

DEFAULT_PRIORITY = 2**31 - 1


@dataclass(frozen=True, slots=True)
class Candidate:
    """What an alive broker last reported in its heartbeat."""

    broker_id: int
    epoch: int = 0
    max_offset: int = 0
    priority: int = DEFAULT_PRIORITY

    def rank(self) -> tuple[int, int, int, int]:
        """Sort key: the smallest is the best candidate."""
        return (-self.epoch, -self.max_offset, self.priority, self.broker_id)


class Verdict(enum.Enum):
    ELECTED = "elected"
    """``master`` is the new master (possibly the requester of a first election)."""
    MASTER_STILL_EXIST = "master_still_exist"
    """The old master is alive and was not replaced: nothing changes."""
    DESIGNATED_NOT_ELIGIBLE = "designated_not_eligible"
    """The designated broker is not an alive candidate: nothing changes."""
    NO_CANDIDATE = "no_candidate"
    """Nobody can be master: the master is cleared, the SyncStateSet kept."""


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    master: int | None = None


def choose(
    *,
    master: int | None,
    master_epoch: int,
    sync_state_set: Set[int],
    replicas: Set[int],
    alive: Mapping[int, Candidate],
    requester: int | None = None,
    designated: int | None = None,
    allow_unclean: bool = False,
) -> Decision:
    """The election's outcome for one group (see the module docstring)."""
    if master_epoch == 0 and master is None:
        # The first election: the requester (or the designated broker), if it is a replica we
        # hear from. Nobody holds acknowledged data yet, so any replica is as good.
        first = designated if designated is not None else requester
        if first is not None and first in replicas and first in alive:
            return Decision(Verdict.ELECTED, first)
        if designated is not None:
            return Decision(Verdict.DESIGNATED_NOT_ELIGIBLE)
        return Decision(Verdict.NO_CANDIDATE)
    clean = [alive[b] for b in sorted(sync_state_set) if b in alive and b in replicas]
    decision = _pick(clean, master, designated)
    if decision is not None:
        return decision
    if allow_unclean:
        unclean = [alive[b] for b in sorted(replicas) if b in alive]
        decision = _pick(unclean, master, designated)
        if decision is not None:
            return decision
    if designated is not None:
        return Decision(Verdict.DESIGNATED_NOT_ELIGIBLE)
    return Decision(Verdict.NO_CANDIDATE)


def _pick(
    candidates: list[Candidate], master: int | None, designated: int | None
) -> Decision | None:
    if not candidates:
        return None
    ids = {c.broker_id for c in candidates}
    if master is not None and master in ids and designated in (None, master):
        return Decision(Verdict.MASTER_STILL_EXIST, master)
    if designated is not None:
        return Decision(Verdict.ELECTED, designated) if designated in ids else None
    best = min(candidates, key=Candidate.rank)
    return Decision(Verdict.ELECTED, best.broker_id)


def election_wait(
    *,
    now: float,
    master_last_heartbeat: float,
    leader_since: float,
    master_lease: float,
    leader_fallback: float,
    margin: float = 0.5,
) -> float:
    """Seconds before an election may run (0.0: now). All times are one monotonic clock's
    seconds; ``master_last_heartbeat`` is when this node last heard from the master (its start
    time if it never did), ``leader_since`` when it became Raft leader."""
    after_master = master_last_heartbeat + master_lease + margin
    after_leader = leader_since + master_lease + leader_fallback + margin
    return max(0.0, after_master - now, after_leader - now)


def next_epoch(current: int, reported_floor: int) -> int:
    """The master epoch an election issues: above the group's and above every epoch a broker
    reported (the epoch floor: a controller that lost committed entries to a power cut must not
    hand out an epoch a broker has already seen)."""
    return max(current, reported_floor) + 1

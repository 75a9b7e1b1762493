"""The election policy and its timing rule, without Raft."""

from __future__ import annotations

from typing import Any

import pytest

from orbitmq.controller.election import (
    Candidate,
    Decision,
    Verdict,
    choose,
    election_wait,
    next_epoch,
)

REPLICAS = {1, 2, 3}


def decide(**kw: Any) -> Decision:
    args: dict[str, Any] = {
        "master": 1,
        "master_epoch": 4,
        "sync_state_set": {1, 2, 3},
        "replicas": REPLICAS,
        "alive": {},
    }
    args.update(kw)
    return choose(**args)


def alive(*cands: Candidate) -> dict[int, Candidate]:
    return {c.broker_id: c for c in cands}


def test_the_first_election_makes_the_requester_master() -> None:
    d = decide(
        master=None,
        master_epoch=0,
        sync_state_set=set(),
        requester=2,
        alive=alive(Candidate(1), Candidate(2)),
    )
    assert d == Decision(Verdict.ELECTED, 2)


def test_a_first_election_needs_an_alive_registered_requester() -> None:
    first = {"master": None, "master_epoch": 0, "sync_state_set": set()}
    assert decide(**first, requester=2, alive={}).verdict is Verdict.NO_CANDIDATE
    assert decide(**first, requester=9, alive=alive(Candidate(9))).verdict is Verdict.NO_CANDIDATE
    # An admin may designate the first master instead.
    assert decide(**first, designated=3, alive=alive(Candidate(3))) == Decision(Verdict.ELECTED, 3)
    assert decide(**first, designated=3, alive={}).verdict is Verdict.DESIGNATED_NOT_ELIGIBLE


def test_an_alive_master_stays_unless_another_broker_is_designated() -> None:
    everyone = alive(Candidate(1), Candidate(2), Candidate(3))
    assert decide(alive=everyone) == Decision(Verdict.MASTER_STILL_EXIST, 1)
    assert decide(alive=everyone, designated=1).verdict is Verdict.MASTER_STILL_EXIST
    assert decide(alive=everyone, designated=3) == Decision(Verdict.ELECTED, 3)


def test_candidates_rank_by_epoch_then_offset_then_priority_then_id() -> None:
    def best(*cands: Candidate) -> int | None:
        return decide(alive=alive(*cands)).master

    assert best(Candidate(2, epoch=4, max_offset=10), Candidate(3, epoch=3, max_offset=99)) == 2
    assert best(Candidate(2, epoch=4, max_offset=10), Candidate(3, epoch=4, max_offset=11)) == 3
    assert best(Candidate(2, 4, 10, priority=7), Candidate(3, 4, 10, priority=1)) == 3
    assert best(Candidate(3, 4, 10, 5), Candidate(2, 4, 10, 5)) == 2


def test_only_sync_state_set_members_are_candidates() -> None:
    d = decide(sync_state_set={1, 2}, alive=alive(Candidate(3, epoch=9, max_offset=10**9)))
    assert d == Decision(Verdict.NO_CANDIDATE)
    # Unclean election (off by default) takes anyone alive once no member is.
    unclean = decide(sync_state_set={1, 2}, alive=alive(Candidate(3)), allow_unclean=True)
    assert unclean == Decision(Verdict.ELECTED, 3)
    # ... but never while a clean candidate exists.
    clean = decide(
        sync_state_set={1, 2}, alive=alive(Candidate(2), Candidate(3, epoch=9)), allow_unclean=True
    )
    assert clean == Decision(Verdict.ELECTED, 2)


def test_a_designated_broker_must_be_an_alive_member() -> None:
    members = alive(Candidate(2), Candidate(3))
    assert decide(sync_state_set={1, 2}, alive=members, designated=3).verdict is (
        Verdict.DESIGNATED_NOT_ELIGIBLE
    )
    assert decide(sync_state_set={1, 2, 3}, alive=alive(Candidate(2)), designated=3).verdict is (
        Verdict.DESIGNATED_NOT_ELIGIBLE
    )
    assert decide(sync_state_set={1, 2}, alive=members, designated=2) == Decision(
        Verdict.ELECTED, 2
    )


def test_members_that_are_no_longer_replicas_are_ignored() -> None:
    d = decide(sync_state_set={1, 2}, replicas={1, 3}, alive=alive(Candidate(2), Candidate(3)))
    assert d.verdict is Verdict.NO_CANDIDATE


@pytest.mark.parametrize(
    ("now", "wait"),
    [
        (100.0, 2.5),  # the master was heard just now: a full lease + margin
        (101.0, 1.5),
        (102.5, 0.0),  # lease + margin after the last heartbeat
        (110.0, 0.0),
    ],
)
def test_the_election_waits_out_the_masters_lease(now: float, wait: float) -> None:
    got = election_wait(
        now=now,
        master_last_heartbeat=100.0,
        leader_since=0.0,
        master_lease=2.0,
        leader_fallback=1.5,
    )
    assert got == pytest.approx(wait)


def test_a_new_leader_also_waits_out_leases_a_deposed_leader_renewed() -> None:
    # The master went silent long ago, but this node became leader at t=100: the old leader may
    # have renewed the master's lease until it stepped down (leader_fallback later).
    kw: dict[str, float] = {
        "master_last_heartbeat": 0.0,
        "leader_since": 100.0,
        "master_lease": 2.0,
        "leader_fallback": 1.5,
    }
    assert election_wait(now=100.0, **kw) == pytest.approx(4.0)
    assert election_wait(now=103.0, **kw) == pytest.approx(1.0)
    assert election_wait(now=104.0, **kw) == 0.0


def test_the_epoch_floor() -> None:
    assert next_epoch(3, 0) == 4
    assert next_epoch(3, 3) == 4
    assert next_epoch(3, 9) == 10  # a broker saw epoch 9: a controller that lost entries skips it

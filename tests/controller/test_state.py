"""The replicated state machine on three in-process pysyncobj nodes, ticked by hand.

Each command is submitted on the leader (or a follower, which forwards it), committed by the
majority and applied on every node: the tests check the leader's Outcome and that every node
holds the same state afterwards. One cluster serves the module; each test uses its own group.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import FAIL_REASON

from orbitmq.common.codes import ResponseCode as RC
from orbitmq.controller.raft import RaftNode
from orbitmq.controller.state import Outcome

from .raftutil import free_ports, leader_of, raft_cluster, run_command, tick_until

ALIVE3 = {1: (0, 100, 5), 2: (0, 100, 5), 3: (0, 100, 5)}


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RaftNode]]:
    with raft_cluster(tmp_path_factory.mktemp("raft")) as cluster:
        yield cluster


def leader(nodes: list[RaftNode]) -> RaftNode:
    tick_until(nodes, lambda: leader_of(nodes) is not None)
    found = leader_of(nodes)
    assert found is not None
    return found


def cmd(nodes: list[RaftNode], name: str, *args: Any) -> Outcome:
    result, err = run_command(nodes, leader(nodes), name, *args)
    assert err == FAIL_REASON.SUCCESS
    assert isinstance(result, Outcome)
    # Every node applies the same command in the same place: wait until all agree.
    tick_until(
        nodes,
        lambda: (
            len({repr(n.state.view(args[1 if name == "apply_broker_id" else 0])) for n in nodes})
            == 1
        ),
    )
    return result


def group_of_three(nodes: list[RaftNode], name: str) -> Outcome:
    for bid in (1, 2, 3):
        out = cmd(nodes, "apply_broker_id", "c1", name, bid, f"127.0.0.1:{10910 + bid}", f"k{bid}")
        assert out.ok, out.remark
    first = cmd(nodes, "elect_master", name, 0, 0, 1, None, ALIVE3, False, 0)
    assert first.ok and first.group is not None and first.group.master == 1
    return first


def test_apply_broker_id_hands_out_ids_in_order_and_retries_are_idempotent(
    nodes: list[RaftNode],
) -> None:
    out = cmd(nodes, "apply_broker_id", "c1", "ids", 1, "127.0.0.1:1", "k1")
    assert out.ok and out.changed and out.group is not None
    assert out.group.next_broker_id == 2 and out.group.replicas == {1: "127.0.0.1:1"}
    again = cmd(nodes, "apply_broker_id", "c1", "ids", 1, "127.0.0.1:1", "k1")
    assert again.ok and not again.changed
    stolen = cmd(nodes, "apply_broker_id", "c1", "ids", 1, "127.0.0.1:9", "other")
    assert stolen.code == RC.CONTROLLER_BROKER_ID_INVALID
    skipped = cmd(nodes, "apply_broker_id", "c1", "ids", 3, "127.0.0.1:3", "k3")
    assert skipped.code == RC.CONTROLLER_BROKER_ID_INVALID
    for node in nodes:
        assert node.state.next_broker_id("ids") == 2
        assert node.state.next_broker_id("unknown") == 1


def test_register_needs_an_id_and_updates_the_address(nodes: list[RaftNode]) -> None:
    assert cmd(nodes, "register", "reg", 1, "h:1").code == RC.CONTROLLER_BROKER_METADATA_NOT_EXIST
    cmd(nodes, "apply_broker_id", "c1", "reg", 1, "127.0.0.1:1", "k1")
    moved = cmd(nodes, "register", "reg", 1, "127.0.0.2:1")
    assert moved.ok and moved.changed and moved.group is not None
    for node in nodes:
        view = node.state.view("reg")
        assert view is not None and view.replicas[1] == "127.0.0.2:1"


def test_first_election_makes_the_requester_master(nodes: list[RaftNode]) -> None:
    first = group_of_three(nodes, "first")
    assert first.group is not None
    assert (first.group.master_epoch, first.group.sync_state_set) == (1, frozenset({1}))
    assert first.group.sync_state_set_epoch == 1


def test_alter_sync_state_set_is_a_compare_and_set(nodes: list[RaftNode]) -> None:
    group_of_three(nodes, "sss")
    alive = [1, 2, 3]
    grown = cmd(nodes, "alter_sync_state_set", "sss", 1, 1, 1, [1, 2, 3], alive)
    assert grown.ok and grown.group is not None
    assert grown.group.sync_state_set == {1, 2, 3} and grown.group.sync_state_set_epoch == 2
    # A second proposal made from the same (now stale) view is refused: no lost update.
    stale = cmd(nodes, "alter_sync_state_set", "sss", 1, 1, 1, [1, 2], alive)
    assert stale.code == RC.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH
    fenced = cmd(nodes, "alter_sync_state_set", "sss", 1, 0, 2, [1, 2], alive)
    assert fenced.code == RC.CONTROLLER_FENCED_MASTER_EPOCH
    not_master = cmd(nodes, "alter_sync_state_set", "sss", 2, 1, 2, [1, 2], alive)
    assert not_master.code == RC.CONTROLLER_INVALID_MASTER
    dead = cmd(nodes, "alter_sync_state_set", "sss", 1, 1, 2, [1, 2, 3], [1, 2])
    assert dead.code == RC.CONTROLLER_BROKER_NOT_ALIVE
    no_master = cmd(nodes, "alter_sync_state_set", "sss", 1, 1, 2, [2, 3], alive)
    assert no_master.code == RC.CONTROLLER_INVALID_REPLICAS
    stranger = cmd(nodes, "alter_sync_state_set", "sss", 1, 1, 2, [1, 7], [*alive, 7])
    assert stranger.code == RC.CONTROLLER_INVALID_REPLICAS
    view = nodes[0].state.view("sss")
    assert view is not None and view.sync_state_set == {1, 2, 3}
    assert view.sync_state_set_epoch == 2


def test_election_picks_the_most_up_to_date_alive_member_above_the_epoch_floor(
    nodes: list[RaftNode],
) -> None:
    group_of_three(nodes, "elect")
    cmd(nodes, "alter_sync_state_set", "elect", 1, 1, 1, [1, 2, 3], [1, 2, 3])
    # Master 1 is alive: nothing to do.
    alive = {1: (1, 500, 5), 2: (1, 400, 5), 3: (1, 500, 9)}
    still = cmd(nodes, "elect_master", "elect", 1, 2, None, None, alive, False, 1)
    assert still.code == RC.CONTROLLER_MASTER_STILL_EXIST
    # Master 1 dead: 3 has more bytes than 2. A broker reported epoch 7: the new one is 8.
    out = cmd(
        nodes, "elect_master", "elect", 1, 2, None, None, {2: alive[2], 3: alive[3]}, False, 7
    )
    assert out.ok and out.group is not None
    assert (out.group.master, out.group.master_epoch) == (3, 8)
    assert out.group.sync_state_set == {3} and out.group.sync_state_set_epoch == 3
    # The same election proposed again from the old view is fenced, not run twice.
    twice = cmd(nodes, "elect_master", "elect", 1, 2, None, None, {2: alive[2]}, False, 7)
    assert twice.code == RC.CONTROLLER_FENCED_MASTER_EPOCH


def test_designated_election_and_no_candidate(nodes: list[RaftNode]) -> None:
    group_of_three(nodes, "manual")
    cmd(nodes, "alter_sync_state_set", "manual", 1, 1, 1, [1, 2], [1, 2, 3])
    # 3 is not in the SyncStateSet: it may not be designated.
    refused = cmd(nodes, "elect_master", "manual", 1, 2, None, 3, ALIVE3, False, 0)
    assert refused.code == RC.CONTROLLER_ELECT_MASTER_FAILED
    moved = cmd(nodes, "elect_master", "manual", 1, 2, None, 2, ALIVE3, False, 0)
    assert moved.ok and moved.group is not None and moved.group.master == 2
    assert moved.group.master_epoch == 2
    # Every SyncStateSet member ({2}) dead, 1 and 3 alive but unclean is off: no master,
    # the epoch moves on (fencing the old master), the set is kept for 2's return.
    none = cmd(
        nodes, "elect_master", "manual", 2, 3, None, None, {1: ALIVE3[1], 3: ALIVE3[3]}, False, 0
    )
    assert none.code == RC.CONTROLLER_MASTER_NOT_AVAILABLE and none.changed
    assert none.group is not None and none.group.master is None
    assert none.group.master_epoch == 3 and none.group.sync_state_set == {2}
    again = cmd(nodes, "elect_master", "manual", 3, 3, None, None, {1: ALIVE3[1]}, False, 0)
    assert again.code == RC.CONTROLLER_MASTER_NOT_AVAILABLE and not again.changed
    # Unclean election allowed: an out-of-set replica wins.
    unclean = cmd(nodes, "elect_master", "manual", 3, 3, None, None, {1: ALIVE3[1]}, True, 0)
    assert unclean.ok and unclean.group is not None and unclean.group.master == 1


def test_a_restarted_master_is_elected_again_at_a_new_epoch_only_when_it_asks(
    nodes: list[RaftNode],
) -> None:
    group_of_three(nodes, "renew")
    cmd(nodes, "alter_sync_state_set", "renew", 1, 1, 1, [1, 2], [1, 2, 3])
    # Designating the alive master is "it is still master" unless it asks to renew.
    still = cmd(nodes, "elect_master", "renew", 1, 2, None, 1, ALIVE3, False, 0)
    assert still.code == RC.CONTROLLER_MASTER_STILL_EXIST
    renewed = cmd(nodes, "elect_master", "renew", 1, 2, None, 1, ALIVE3, False, 4, True)
    assert renewed.ok and renewed.group is not None and renewed.group.master == 1
    assert renewed.group.master_epoch == 5 and renewed.group.sync_state_set == {1}
    # Renewing is only for the master itself.
    other = cmd(nodes, "elect_master", "renew", 5, 3, None, 2, ALIVE3, False, 0, True)
    assert other.code == RC.CONTROLLER_ELECT_MASTER_FAILED


def test_clean_broker_data_refuses_alive_brokers_and_the_master(nodes: list[RaftNode]) -> None:
    group_of_three(nodes, "clean")
    cmd(nodes, "alter_sync_state_set", "clean", 1, 1, 1, [1, 2, 3], [1, 2, 3])
    assert cmd(nodes, "clean_broker_data", "clean", [3], [3]).code == (
        RC.CONTROLLER_INVALID_CLEAN_BROKER_METADATA
    )
    assert cmd(nodes, "clean_broker_data", "clean", [1], []).code == (
        RC.CONTROLLER_INVALID_CLEAN_BROKER_METADATA
    )
    out = cmd(nodes, "clean_broker_data", "clean", [3], [1, 2])
    assert out.ok and out.group is not None
    assert set(out.group.replicas) == {1, 2} and out.group.sync_state_set == {1, 2}
    assert out.group.sync_state_set_epoch == 3


def test_a_follower_forwards_commands_to_the_leader(nodes: list[RaftNode]) -> None:
    follower = next(n for n in nodes if not n.is_leader())
    result, err = run_command(nodes, follower, "apply_broker_id", "c1", "fwd", 1, "h:1", "k")
    assert err == FAIL_REASON.SUCCESS and result.ok


def test_a_restarted_node_rebuilds_its_state_from_its_journal(tmp_path: Path) -> None:
    with raft_cluster(tmp_path) as cluster:
        group_of_three(cluster, "durable")
        victim = next(n for n in cluster if not n.is_leader())
        index = cluster.index(victim)
        others = [n.raft_address for n in cluster if n is not victim]
        victim.destroy()
        reborn = RaftNode(
            victim.raft_address, others, str(tmp_path / f"node{index}"), auto_tick=False
        )
        cluster[index] = reborn
        want = cluster[(index + 1) % 3].state.view("durable")
        tick_until(cluster, lambda: reborn.state.view("durable") == want)
        view = reborn.state.view("durable")
        assert view is not None and view.master == 1 and view.master_epoch == 1


def test_raft_traffic_with_a_shared_secret(tmp_path: Path) -> None:
    addrs = [f"127.0.0.1:{p}" for p in free_ports(3)]
    cluster = [
        RaftNode(
            a,
            [o for o in addrs if o != a],
            str(tmp_path / f"s{i}"),
            auto_tick=False,
            secret="s3cret",
        )
        for i, a in enumerate(addrs)
    ]
    try:
        tick_until(cluster, lambda: leader_of(cluster) is not None)
        out = cmd(cluster, "apply_broker_id", "c1", "secret", 1, "h:1", "k")
        assert out.ok
    finally:
        for node in cluster:
            node.destroy()


def test_a_single_node_controller_leads_alone(tmp_path: Path) -> None:
    node = RaftNode(f"127.0.0.1:{free_ports(1)[0]}", [], str(tmp_path / "one"), auto_tick=False)
    try:
        tick_until([node], node.is_leader)
        assert cmd([node], "apply_broker_id", "c1", "solo", 1, "h:1", "k").ok
    finally:
        node.destroy()

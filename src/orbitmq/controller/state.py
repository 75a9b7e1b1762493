"""The controller's replicated state machine: per broker group, its replicas, master and epochs.

Per group (``broker_name``), as RocketMQ's ReplicasInfoManager keeps it (docs/ha.md):

- ``replicas``: broker id -> [address, register check code]; ``next_broker_id`` (ids from 1);
- ``master`` (None: no master), ``master_epoch`` (from 0, +1 on every election that changes
  the master, including one that leaves none);
- ``sss``, the SyncStateSet (ids holding every acknowledged byte), and ``sss_epoch`` (+1 per
  change).

It is a pysyncobj ``SyncObjConsumer``. The commands below are ``@replicated``: a call from
any thread appends the command to the Raft log and returns at once; pysyncobj then runs the
method body on every node, in log order, on its tick thread, and hands the leader's result to
the callback. The rules that make this safe (brief section 3):

1. liveness is not in the log: the proposer passes the heartbeat snapshot it decided on as a
   command argument, so applying the command is deterministic on every node;
2. every check is made inside the command, against the state at its place in the log, never by
   "read, then propose": two racing proposals cannot both pass. Each state change is a
   compare-and-set on (master_epoch, sss_epoch);
3. nothing here asks whether this node is the leader;
4. the epoch floor: an election never issues an epoch at or below the highest one a broker of
   the group reported (``epoch_floor``), so a controller that lost committed entries (the
   journal is not fsynced) cannot hand out an epoch twice.

State is plain dicts, lists and ints: pysyncobj pickles it into its dump file, and plain types
keep that file independent of OrbitMQ's class names. Commands take plain arguments for the same
reason (they are pickled into the journal). The method names are part of the journal's format:
pysyncobj numbers replicated methods by sorted name, so renaming or adding one is a format change
(a rolling upgrade needs pysyncobj's ``ver=`` mechanism).

Reads (`view`, `group_names`) come from other threads (the asyncio loop) while the tick thread
applies commands, hence the lock around every access. A read is only as fresh as the commands
applied here: a caller that needs every committed command first commits a ``barrier``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

from pysyncobj import SyncObjConsumer, replicated

from orbitmq.common.codes import ResponseCode
from orbitmq.controller.election import Candidate, Decision, Verdict, choose, next_epoch

RC = ResponseCode


class Group(TypedDict):
    cluster: str
    next_broker_id: int
    replicas: dict[int, list[str]]
    master: int | None
    master_epoch: int
    sss: list[int]
    sss_epoch: int


@dataclass(frozen=True, slots=True)
class GroupView:
    """An immutable copy of one group's state."""

    cluster: str
    broker_name: str
    next_broker_id: int
    replicas: Mapping[int, str]
    """broker id -> address."""
    master: int | None
    master_epoch: int
    sync_state_set: frozenset[int]
    sync_state_set_epoch: int

    @property
    def master_address(self) -> str:
        return "" if self.master is None else self.replicas.get(self.master, "")


@dataclass(frozen=True, slots=True)
class Outcome:
    """A command's result: ``code`` is SUCCESS or the refusal, ``group`` the state after it."""

    code: int
    remark: str = ""
    group: GroupView | None = None
    changed: bool = field(default=False)

    @property
    def ok(self) -> bool:
        return self.code == RC.SUCCESS


def _view(name: str, g: Group) -> GroupView:
    return GroupView(
        cluster=g["cluster"],
        broker_name=name,
        next_broker_id=g["next_broker_id"],
        replicas={bid: entry[0] for bid, entry in g["replicas"].items()},
        master=g["master"],
        master_epoch=g["master_epoch"],
        sync_state_set=frozenset(g["sss"]),
        sync_state_set_epoch=g["sss_epoch"],
    )


class ControllerState(SyncObjConsumer):
    def __init__(self) -> None:
        # Attributes set before SyncObjConsumer.__init__ are not serialized into the dump.
        self._lock = threading.RLock()
        super().__init__()
        self.groups: dict[str, Group] = {}
        self.auth: dict[str, Any] = {"version": 0, "users": {}, "acls": {}}
        """Users and ACLs (auth_store "raft"): the auth file's document, secrets sealed;
        replaced whole by `set_auth_data` (docs/security.md)."""

    # ------------------------------------------------------------------ reads (any thread)

    def view(self, broker_name: str) -> GroupView | None:
        with self._lock:
            g = self.groups.get(broker_name)
            return None if g is None else _view(broker_name, g)

    def group_names(self) -> list[str]:
        with self._lock:
            return sorted(self.groups)

    def next_broker_id(self, broker_name: str) -> int:
        with self._lock:
            g = self.groups.get(broker_name)
            return 1 if g is None else g["next_broker_id"]

    def auth_data(self) -> tuple[int, dict[str, Any]]:
        """(version, document) of the users and ACLs; the document is not copied: a caller
        that changes it copies it first (it is replaced whole, never changed in place)."""
        with self._lock:
            return int(self.auth.get("version", 0)), self.auth

    def _deserialize(self, data: dict[str, Any]) -> None:
        with self._lock:
            super()._deserialize(data)

    # ------------------------------------------------------------------ commands (log order)

    def _outcome(self, code: int, remark: str, name: str, *, changed: bool = False) -> Outcome:
        g = self.groups.get(name)
        return Outcome(code, remark, None if g is None else _view(name, g), changed)

    @replicated
    def barrier(self) -> Outcome:
        """A no-op through the log: once it is applied here, so is every command committed
        before it was proposed. Reads wait for one (a new leader has every committed entry in
        its log but applies them only after it commits an entry of its own term)."""
        return Outcome(RC.SUCCESS)

    @replicated
    def apply_broker_id(
        self, cluster: str, broker_name: str, broker_id: int, address: str, check_code: str
    ) -> Outcome:
        """Give ``broker_id`` to the broker holding ``check_code``: the group's next id, or the id
        it already holds (a retry, same code). Creates the group on its first id."""
        with self._lock:
            g = self.groups.get(broker_name)
            next_id = 1 if g is None else g["next_broker_id"]
            held = None if g is None else g["replicas"].get(broker_id)
            if held is not None:
                if held[1] != check_code:
                    return self._outcome(
                        RC.CONTROLLER_BROKER_ID_INVALID,
                        f"broker id {broker_id} of {broker_name} belongs to another broker",
                        broker_name,
                    )
                return self._outcome(RC.SUCCESS, "", broker_name)
            if broker_id != next_id:
                return self._outcome(
                    RC.CONTROLLER_BROKER_ID_INVALID,
                    f"broker id {broker_id} is not {broker_name}'s next id ({next_id})",
                    broker_name,
                )
            if g is None:
                g = self.groups[broker_name] = Group(
                    cluster=cluster,
                    next_broker_id=1,
                    replicas={},
                    master=None,
                    master_epoch=0,
                    sss=[],
                    sss_epoch=0,
                )
            g["replicas"][broker_id] = [address, check_code]
            g["next_broker_id"] = broker_id + 1
            return self._outcome(RC.SUCCESS, "", broker_name, changed=True)

    @replicated
    def register(self, broker_name: str, broker_id: int, address: str) -> Outcome:
        """A broker with an id announces its address (updated if it moved)."""
        with self._lock:
            g = self.groups.get(broker_name)
            if g is None or broker_id not in g["replicas"]:
                return self._outcome(
                    RC.CONTROLLER_BROKER_METADATA_NOT_EXIST,
                    f"broker {broker_name}/{broker_id} has no id here: apply for one first",
                    broker_name,
                )
            entry = g["replicas"][broker_id]
            if entry[0] == address:
                return self._outcome(RC.SUCCESS, "", broker_name)
            entry[0] = address
            return self._outcome(RC.SUCCESS, "", broker_name, changed=True)

    @replicated
    def alter_sync_state_set(
        self,
        broker_name: str,
        master_id: int,
        master_epoch: int,
        sss_epoch: int,
        new_sss: list[int],
        alive: list[int],
    ) -> Outcome:
        """The master's compare-and-set of its SyncStateSet: refused unless the master and both
        epochs are the group's current ones and every member is a registered, alive replica."""
        with self._lock:
            g = self.groups.get(broker_name)
            if g is None:
                return self._outcome(
                    RC.CONTROLLER_BROKER_METADATA_NOT_EXIST, f"no group {broker_name}", broker_name
                )
            if g["master"] != master_id:
                return self._outcome(
                    RC.CONTROLLER_INVALID_MASTER,
                    f"broker {master_id} is not {broker_name}'s master ({g['master']})",
                    broker_name,
                )
            if g["master_epoch"] != master_epoch:
                return self._outcome(
                    RC.CONTROLLER_FENCED_MASTER_EPOCH,
                    f"master epoch {master_epoch} is stale ({g['master_epoch']})",
                    broker_name,
                )
            if g["sss_epoch"] != sss_epoch:
                return self._outcome(
                    RC.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH,
                    f"SyncStateSet epoch {sss_epoch} is stale ({g['sss_epoch']})",
                    broker_name,
                )
            members = sorted(set(new_sss))
            live = set(alive)
            for member in members:
                if member not in g["replicas"]:
                    return self._outcome(
                        RC.CONTROLLER_INVALID_REPLICAS,
                        f"broker {member} is not a replica of {broker_name}",
                        broker_name,
                    )
                if member not in live:
                    return self._outcome(
                        RC.CONTROLLER_BROKER_NOT_ALIVE, f"broker {member} is not alive", broker_name
                    )
            if master_id not in members:
                return self._outcome(
                    RC.CONTROLLER_INVALID_REPLICAS,
                    f"the SyncStateSet must contain the master {master_id}",
                    broker_name,
                )
            if members == g["sss"]:
                return self._outcome(RC.SUCCESS, "", broker_name)
            g["sss"] = members
            g["sss_epoch"] += 1
            return self._outcome(RC.SUCCESS, "", broker_name, changed=True)

    @replicated
    def elect_master(
        self,
        broker_name: str,
        expected_master_epoch: int,
        expected_sss_epoch: int,
        requester: int | None,
        designated: int | None,
        alive: dict[int, tuple[int, int, int]],
        allow_unclean: bool,
        epoch_floor: int,
        renew: bool = False,
    ) -> Outcome:
        """Run the election policy against the state at this place in the log. ``alive`` is the
        proposer's snapshot: broker id -> (epoch, max offset, priority) of alive replicas.
        ``renew``: the designated broker is the master itself, restarted, asking for a new
        epoch (elected again if it is an alive SyncStateSet member).

        A new master gets ``next_epoch(master_epoch, epoch_floor)`` and SSS := {master}. No
        candidate while a master was set: the master is cleared (epoch bumped), the SSS kept."""
        with self._lock:
            g = self.groups.get(broker_name)
            if g is None:
                return self._outcome(
                    RC.CONTROLLER_BROKER_METADATA_NOT_EXIST, f"no group {broker_name}", broker_name
                )
            if (g["master_epoch"], g["sss_epoch"]) != (expected_master_epoch, expected_sss_epoch):
                return self._outcome(
                    RC.CONTROLLER_FENCED_MASTER_EPOCH,
                    f"the group changed under the election (epochs {g['master_epoch']}/"
                    f"{g['sss_epoch']}, expected {expected_master_epoch}/{expected_sss_epoch})",
                    broker_name,
                )
            if (
                renew
                and designated is not None
                and designated == g["master"]
                and designated in alive
                and designated in g["sss"]
            ):
                decision = Decision(Verdict.ELECTED, designated)
            else:
                decision = choose(
                    master=g["master"],
                    master_epoch=g["master_epoch"],
                    sync_state_set=set(g["sss"]),
                    replicas=set(g["replicas"]),
                    alive={b: Candidate(b, e, o, p) for b, (e, o, p) in alive.items()},
                    requester=requester,
                    designated=designated,
                    allow_unclean=allow_unclean,
                )
            if decision.verdict is Verdict.ELECTED:
                assert decision.master is not None
                g["master"] = decision.master
                g["master_epoch"] = next_epoch(g["master_epoch"], epoch_floor)
                g["sss"] = [decision.master]
                g["sss_epoch"] += 1
                return self._outcome(RC.SUCCESS, "", broker_name, changed=True)
            if decision.verdict is Verdict.MASTER_STILL_EXIST:
                return self._outcome(
                    RC.CONTROLLER_MASTER_STILL_EXIST,
                    f"master {g['master']} of {broker_name} is alive",
                    broker_name,
                )
            if decision.verdict is Verdict.DESIGNATED_NOT_ELIGIBLE:
                return self._outcome(
                    RC.CONTROLLER_ELECT_MASTER_FAILED,
                    f"broker {designated} is not an alive SyncStateSet member of {broker_name}",
                    broker_name,
                )
            remark = f"no alive SyncStateSet member of {broker_name} can be master"
            if g["master"] is None:
                return self._outcome(RC.CONTROLLER_MASTER_NOT_AVAILABLE, remark, broker_name)
            g["master"] = None
            g["master_epoch"] = next_epoch(g["master_epoch"], epoch_floor)
            return self._outcome(
                RC.CONTROLLER_MASTER_NOT_AVAILABLE, remark, broker_name, changed=True
            )

    @replicated
    def clean_broker_data(
        self, broker_name: str, broker_ids: list[int] | None, alive: list[int]
    ) -> Outcome:
        """Forget replicas (None: the whole group). Alive brokers and the master are refused:
        forgetting them would let an id be handed out twice."""
        with self._lock:
            g = self.groups.get(broker_name)
            if g is None:
                return self._outcome(
                    RC.CONTROLLER_BROKER_METADATA_NOT_EXIST, f"no group {broker_name}", broker_name
                )
            ids = sorted(g["replicas"]) if broker_ids is None else sorted(set(broker_ids))
            live = set(alive)
            for bid in ids:
                if bid not in g["replicas"]:
                    return self._outcome(
                        RC.CONTROLLER_BROKER_METADATA_NOT_EXIST,
                        f"broker {bid} is not a replica of {broker_name}",
                        broker_name,
                    )
                if bid in live or bid == g["master"]:
                    return self._outcome(
                        RC.CONTROLLER_INVALID_CLEAN_BROKER_METADATA,
                        f"broker {bid} of {broker_name} is alive or master",
                        broker_name,
                    )
            for bid in ids:
                del g["replicas"][bid]
            if not g["replicas"]:
                del self.groups[broker_name]
                return Outcome(RC.SUCCESS, "", None, changed=True)
            if set(ids) & set(g["sss"]):
                g["sss"] = [b for b in g["sss"] if b not in ids]
                g["sss_epoch"] += 1
            return self._outcome(RC.SUCCESS, "", broker_name, changed=True)

    # Named to sort after every older command: pysyncobj numbers replicated methods by sorted
    # name, so older journals keep their numbering (module docstring).
    @replicated
    def set_auth_data(self, expected_version: int, document: dict[str, Any]) -> Outcome:
        """Compare-and-set of the users-and-ACLs document on its version."""
        with self._lock:
            current = int(self.auth.get("version", 0))
            if current != expected_version:
                return Outcome(RC.SYSTEM_BUSY, f"auth data is at version {current}")
            if int(document.get("version", -1)) != expected_version + 1:
                return Outcome(RC.MESSAGE_ILLEGAL, "auth data must move one version up")
            self.auth = document
        return Outcome(RC.SUCCESS, changed=True)

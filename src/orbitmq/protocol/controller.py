"""Controller API bodies (msgpack via msgspec), sans-IO: what brokers and admins send to the
controller and what it answers (docs/ha.md, "The controller").

Every controller request carries its arguments as one of the request Structs below in the frame
body; a SUCCESS answer carries the response Struct named beside the request code. An error
answer has no body, only a code (``CONTROLLER_*``, 2000-2014, RocketMQ's numbers) and a remark;
``CONTROLLER_NOT_LEADER`` adds the header field ``leader_addr`` when the node knows the leader.

    request code                      request body             SUCCESS body
    CONTROLLER_GET_NEXT_BROKER_ID     GetNextBrokerIdRequest   NextBrokerId
    CONTROLLER_APPLY_BROKER_ID        ApplyBrokerIdRequest     ReplicaInfo
    CONTROLLER_REGISTER_BROKER        RegisterRequest          ReplicaInfo
    BROKER_HEARTBEAT                  HeartbeatRequest         HeartbeatResponse
    CONTROLLER_ALTER_SYNC_STATE_SET   AlterSyncStateSetRequest ReplicaInfo
    CONTROLLER_ELECT_MASTER           ElectMasterRequest       ReplicaInfo
    CONTROLLER_GET_REPLICA_INFO       GetReplicaInfoRequest    ReplicaInfo
    CONTROLLER_GET_METADATA_INFO      (no body)                ControllerMetadata
    CLEAN_BROKER_DATA                 CleanBrokerDataRequest   (no body)
    NOTIFY_BROKER_ROLE_CHANGED        ReplicaInfo (one-way, controller to broker)

Field names are snake_case like the rest of OrbitMQ's bodies; readers ignore fields they do not
know (msgspec's default), so fields can be added later without a new code.
"""

from __future__ import annotations

import msgspec

NO_BROKER_ID = -1
"""The broker id of "no master" in a ReplicaInfo."""


class GetNextBrokerIdRequest(msgspec.Struct, kw_only=True):
    cluster: str
    broker_name: str


class NextBrokerId(msgspec.Struct, kw_only=True):
    next_broker_id: int
    """The id a new replica of the group should apply for (ids start at 1)."""


class ApplyBrokerIdRequest(msgspec.Struct, kw_only=True):
    cluster: str
    broker_name: str
    broker_id: int
    address: str
    """The broker's "host:port"."""
    register_check_code: str
    """A token the broker keeps with its id ("host:port;timestamp"): applying again for the same
    id with the same token succeeds (a retry), with another one it is CONTROLLER_BROKER_ID_INVALID."""


class RegisterRequest(msgspec.Struct, kw_only=True):
    cluster: str
    broker_name: str
    broker_id: int
    address: str


class ReplicaLag(msgspec.Struct, kw_only=True):
    """A master's view of one slave, sent in its heartbeats (for ``orbitmq cluster describe``)."""

    broker_id: int
    acked_offset: int
    lag_bytes: int
    """The master's max offset minus what the slave acknowledged."""
    lag_ms: int
    """How long the slave has not been caught up with the master (0: caught up)."""


class HeartbeatRequest(msgspec.Struct, kw_only=True):
    cluster: str
    broker_name: str
    broker_id: int
    address: str
    epoch: int = 0
    """The highest master epoch this broker has seen (its epoch file's last). The controller
    never issues an epoch at or below the highest one a group's brokers reported."""
    max_offset: int = 0
    confirm_offset: int = 0
    election_priority: int = 2**31 - 1
    """Lower wins among equally up-to-date candidates (RocketMQ's default: Integer.MAX_VALUE)."""
    send_time_ms: int = 0
    """The broker's monotonic send time, echoed back so it can renew its lease from it."""
    replica_lag: list[ReplicaLag] = msgspec.field(default_factory=list)
    """From a master: each connected slave's lag."""


class HeartbeatResponse(msgspec.Struct, kw_only=True):
    leader: bool
    """True when the answering node is the Raft leader: only such an answer renews the broker's
    master lease (docs/ha.md, "Leases and election delays")."""
    send_time_ms: int
    """The request's send_time_ms, echoed."""
    master_broker_id: int = NO_BROKER_ID
    master_epoch: int = 0
    sync_state_set_epoch: int = 0


class AlterSyncStateSetRequest(msgspec.Struct, kw_only=True):
    broker_name: str
    master_broker_id: int
    master_epoch: int
    sync_state_set_epoch: int
    new_sync_state_set: list[int]


class ElectMasterRequest(msgspec.Struct, kw_only=True):
    cluster: str
    broker_name: str
    broker_id: int = NO_BROKER_ID
    """The requesting broker (a first election makes it master), or the designated one."""
    designated: bool = False
    """True: elect ``broker_id`` and nobody else (manual failover)."""
    renew: bool = False
    """With ``designated``: ``broker_id`` is the current master, restarted, asking to be elected
    again at a new epoch (what it writes from now on must be told apart from what it wrote
    before its crash). Refused unless it is an alive SyncStateSet member."""


class GetReplicaInfoRequest(msgspec.Struct, kw_only=True):
    broker_name: str


class Replica(msgspec.Struct, kw_only=True):
    broker_id: int
    address: str
    alive: bool
    """Whether the answering node has a live heartbeat from it."""
    max_offset: int = -1
    """Its CommitLog end as of its last heartbeat (-1: never heard of)."""
    lag_bytes: int = -1
    """Bytes behind the master, as the master's last heartbeat says (-1: not known; 0 for
    the master itself)."""
    lag_ms: int = -1
    """How long it has not been caught up, as the master says (-1: not known)."""


class ReplicaInfo(msgspec.Struct, kw_only=True):
    cluster: str
    broker_name: str
    master_broker_id: int = NO_BROKER_ID
    master_address: str = ""
    master_epoch: int = 0
    sync_state_set: list[int] = msgspec.field(default_factory=list)
    sync_state_set_epoch: int = 0
    replicas: list[Replica] = msgspec.field(default_factory=list)

    @property
    def has_master(self) -> bool:
        return self.master_broker_id != NO_BROKER_ID


class CleanBrokerDataRequest(msgspec.Struct, kw_only=True):
    broker_name: str
    broker_ids: list[int] | None = None
    """The ids to forget; None forgets the whole group. Alive brokers and the master are refused."""


class ControllerMetadata(msgspec.Struct, kw_only=True):
    self_address: str
    leader_address: str | None
    """The Remoting address of the Raft leader as this node last knew it (None: unknown)."""
    is_leader: bool
    peers: list[str]
    """Every controller node's Remoting address, this one included."""
    term: int = 0
    leader_for_ms: int = 0
    """How long this node has been leader (0: it is not). Elections wait until the leader has
    led for the lease + leader fallback + margin (docs/ha.md)."""

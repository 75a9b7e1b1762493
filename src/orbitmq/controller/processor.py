"""Controller request handling: a request frame in, a response frame out (docs/ha.md).

Who answers what:

- any node: BROKER_HEARTBEAT (every node keeps liveness; ``leader`` in the answer says whether
  it renews the broker's lease) and CONTROLLER_GET_METADATA_INFO;
- the Raft leader only: everything else. A follower answers CONTROLLER_NOT_LEADER with the
  leader's Remoting address in the ``leader_addr`` field when it knows it. Asking pysyncobj
  "am I the leader?" only routes requests: every decision is re-checked inside the replicated
  command, so a deposed leader that still believes it leads cannot change anything the new
  leader decided.

A write request becomes one replicated command whose arguments include the liveness this node
sees (alive ids, candidates' epochs and offsets, the epoch floor); the answer waits for the
commit (at most ``commit_timeout_ms``, then SYSTEM_BUSY: the outcome is unknown, read the replica
info). Bodies that do not decode, or fields out of range, are MESSAGE_ILLEGAL, changing nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec

from orbitmq.common.clock import SYSTEM_CLOCK, Clock
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MQError
from orbitmq.controller.auth_data import auth_data_answer
from orbitmq.controller.config import ControllerConfig
from orbitmq.controller.election import election_wait
from orbitmq.controller.heartbeats import Heartbeats
from orbitmq.controller.raft import CommandFailed, RaftNode
from orbitmq.controller.state import GroupView, Outcome
from orbitmq.protocol.bodies import encode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.controller import (
    NO_BROKER_ID,
    AlterSyncStateSetRequest,
    ApplyBrokerIdRequest,
    CleanBrokerDataRequest,
    ControllerMetadata,
    ElectMasterRequest,
    GetNextBrokerIdRequest,
    GetReplicaInfoRequest,
    HeartbeatRequest,
    HeartbeatResponse,
    NextBrokerId,
    RegisterRequest,
    Replica,
    ReplicaInfo,
)
from orbitmq.protocol.fields import FieldError
from orbitmq.protocol.frame import Frame

log = logging.getLogger(__name__)

RC = ResponseCode
T = TypeVar("T", bound=msgspec.Struct)
MAX_NAME = 127
MAX_ID = 2**63 - 1
MAX_EPOCH = 2**31 - 1
"""Epochs are RocketMQ's int32; a larger reported one would poison the epoch floor."""

Handler = Callable[[Frame, object], Awaitable[Frame]]


def decode(frame: Frame, typ: type[T]) -> T:
    """The request body as ``typ``, names and ids checked; FieldError (MESSAGE_ILLEGAL) if not."""
    try:
        body = msgspec.msgpack.decode(frame.body, type=typ)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
        raise FieldError(f"body is not a {typ.__name__}: {exc}") from None
    for name in ("cluster", "broker_name", "address"):
        value = getattr(body, name, None)
        if value is not None and not 0 < len(value) <= MAX_NAME:
            raise FieldError(f"field {name!r} must be 1-{MAX_NAME} characters")
    return body


def check_id(value: int, name: str = "broker_id") -> int:
    if not 0 < value <= MAX_ID:
        raise FieldError(f"field {name!r} = {value} must be a broker id >= 1")
    return value


def replica_info(view: GroupView, heartbeats: Heartbeats) -> ReplicaInfo:
    alive = set(heartbeats.alive_ids(view.broker_name))
    master = None if view.master is None else heartbeats.get(view.broker_name, view.master)
    lags = (master.replica_lag if master is not None else None) or {}

    def replica(bid: int, addr: str) -> Replica:
        seen = heartbeats.get(view.broker_name, bid)
        lag = (0, 0) if bid == view.master else lags.get(bid, (-1, -1))
        return Replica(
            broker_id=bid,
            address=addr,
            alive=bid in alive,
            max_offset=-1 if seen is None else seen.max_offset,
            lag_bytes=lag[0],
            lag_ms=lag[1],
        )

    return ReplicaInfo(
        cluster=view.cluster,
        broker_name=view.broker_name,
        master_broker_id=NO_BROKER_ID if view.master is None else view.master,
        master_address=view.master_address,
        master_epoch=view.master_epoch,
        sync_state_set=sorted(view.sync_state_set),
        sync_state_set_epoch=view.sync_state_set_epoch,
        replicas=[replica(bid, addr) for bid, addr in sorted(view.replicas.items())],
    )


class NotLeader(Exception):
    """This node lost the leadership while serving a request: answer CONTROLLER_NOT_LEADER."""


class CommitTimeout(Exception):
    """A command or barrier did not commit in time: answer SYSTEM_BUSY."""


class ControllerProcessor:
    def __init__(
        self,
        config: ControllerConfig,
        raft: RaftNode,
        heartbeats: Heartbeats,
        *,
        leader_address: Callable[[], str | None],
        peers: list[str],
        on_outcome: Callable[[str, Outcome], None] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.config = config
        self.raft = raft
        self.heartbeats = heartbeats
        self.leader_address = leader_address
        self.peers = peers
        self.on_outcome = on_outcome
        """Called with every committed command's name and Outcome (notifications, metrics)."""
        self.clock = clock
        self._handlers: dict[int, Handler] = {
            RequestCode.BROKER_HEARTBEAT: self.heartbeat,
            RequestCode.CONTROLLER_GET_METADATA_INFO: self.metadata,
        }
        if config.auth_store == "raft":
            self._handlers[RequestCode.CONTROLLER_GET_AUTH_DATA] = self.auth_data
        self._leader_handlers: dict[int, Handler] = {
            RequestCode.CONTROLLER_GET_NEXT_BROKER_ID: self.next_broker_id,
            RequestCode.CONTROLLER_APPLY_BROKER_ID: self.apply_broker_id,
            RequestCode.CONTROLLER_REGISTER_BROKER: self.register,
            RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET: self.alter_sync_state_set,
            RequestCode.CONTROLLER_ELECT_MASTER: self.elect_master,
            RequestCode.CONTROLLER_GET_REPLICA_INFO: self.get_replica_info,
            RequestCode.CLEAN_BROKER_DATA: self.clean_broker_data,
        }
        self.codes = frozenset(self._handlers) | frozenset(self._leader_handlers)
        """The request codes a controller answers."""

    async def process(self, request: Frame, connection: object = None) -> Frame:
        handler = self._handlers.get(request.code)
        if handler is None:
            handler = self._leader_handlers.get(request.code)
            if handler is None:
                return request.reply(
                    RC.REQUEST_CODE_NOT_SUPPORTED,
                    f"request code {request.code} is not supported by the controller",
                )
            if not self.raft.is_leader():
                return self.not_leader(request)
        try:
            return await handler(request, connection)
        except NotLeader:
            return self.not_leader(request)
        except CommitTimeout as exc:
            return request.reply(RC.SYSTEM_BUSY, f"controller: {exc}")
        except MQError as exc:
            return request.reply(exc.code, str(exc) or type(exc).__name__)

    def not_leader(self, request: Frame) -> Frame:
        leader = self.leader_address()
        fields = {} if leader is None else {"leader_addr": leader}
        remark = f"not the controller leader; the leader is {leader or 'unknown'}"
        return request.reply(RC.CONTROLLER_NOT_LEADER, remark, fields=fields)

    # ------------------------------------------------------------------ any node

    async def heartbeat(self, request: Frame, connection: object) -> Frame:
        hb = decode(request, HeartbeatRequest)
        check_id(hb.broker_id)
        if not 0 <= hb.epoch <= MAX_EPOCH:
            raise FieldError(f"field 'epoch' = {hb.epoch} is outside [0, {MAX_EPOCH}]")
        if hb.max_offset < 0 or hb.confirm_offset < 0:
            raise FieldError("offsets must not be negative")
        self.heartbeats.beat(
            hb.broker_name,
            hb.broker_id,
            hb.address,
            epoch=hb.epoch,
            max_offset=hb.max_offset,
            confirm_offset=hb.confirm_offset,
            priority=hb.election_priority,
            channel=connection,
            replica_lag={r.broker_id: (r.lag_bytes, r.lag_ms) for r in hb.replica_lag[:64]},
        )
        view = self.raft.state.view(hb.broker_name)
        answer = HeartbeatResponse(leader=self.raft.is_leader(), send_time_ms=hb.send_time_ms)
        if view is not None:
            answer.master_broker_id = NO_BROKER_ID if view.master is None else view.master
            answer.master_epoch = view.master_epoch
            answer.sync_state_set_epoch = view.sync_state_set_epoch
        return request.reply(RC.SUCCESS, body=encode_body(answer))

    async def metadata(self, request: Frame, _connection: object) -> Frame:
        meta = ControllerMetadata(
            self_address=self.config.address,
            leader_address=self.leader_address(),
            is_leader=self.raft.is_leader(),
            peers=list(self.peers),
            term=self.raft.term,
        )
        since = self.raft.leader_since
        if since is not None:
            meta.leader_for_ms = max(0, int((self.clock.monotonic() - since) * 1000))
        return request.reply(RC.SUCCESS, body=encode_body(meta))

    async def auth_data(self, request: Frame, _connection: object) -> Frame:
        return auth_data_answer(request, self.raft)

    # ------------------------------------------------------------------ leader only

    async def next_broker_id(self, request: Frame, _connection: object) -> Frame:
        req = decode(request, GetNextBrokerIdRequest)
        await self.fresh()
        body = NextBrokerId(next_broker_id=self.raft.state.next_broker_id(req.broker_name))
        return request.reply(RC.SUCCESS, body=encode_body(body))

    async def get_replica_info(self, request: Frame, _connection: object) -> Frame:
        req = decode(request, GetReplicaInfoRequest)
        await self.fresh()
        view = self.raft.state.view(req.broker_name)
        if view is None:
            return request.reply(
                RC.CONTROLLER_BROKER_METADATA_NOT_EXIST, f"no group {req.broker_name}"
            )
        return request.reply(RC.SUCCESS, body=encode_body(replica_info(view, self.heartbeats)))

    async def apply_broker_id(self, request: Frame, _connection: object) -> Frame:
        req = decode(request, ApplyBrokerIdRequest)
        args = (req.cluster, req.broker_name, check_id(req.broker_id), req.address)
        return await self.command(request, "apply_broker_id", *args, req.register_check_code)

    async def register(self, request: Frame, _connection: object) -> Frame:
        req = decode(request, RegisterRequest)
        return await self.command(
            request, "register", req.broker_name, check_id(req.broker_id), req.address
        )

    async def alter_sync_state_set(self, request: Frame, _connection: object) -> Frame:
        req = decode(request, AlterSyncStateSetRequest)
        check_id(req.master_broker_id, "master_broker_id")
        for member in req.new_sync_state_set:
            check_id(member, "new_sync_state_set")
        return await self.command(
            request,
            "alter_sync_state_set",
            req.broker_name,
            req.master_broker_id,
            req.master_epoch,
            req.sync_state_set_epoch,
            sorted(set(req.new_sync_state_set)),
            self.heartbeats.alive_ids(req.broker_name),
        )

    async def elect_master(self, request: Frame, _connection: object) -> Frame:
        req = decode(request, ElectMasterRequest)
        broker_id = None if req.broker_id == NO_BROKER_ID else check_id(req.broker_id)
        if req.designated and broker_id is None:
            raise FieldError("a designated election needs a broker_id")
        await self.fresh()
        view = self.raft.state.view(req.broker_name)
        if view is None:
            return request.reply(
                RC.CONTROLLER_BROKER_METADATA_NOT_EXIST, f"no group {req.broker_name}"
            )
        wait = self.election_wait(view)
        if wait > 0:
            return request.reply(
                RC.CONTROLLER_ELECT_MASTER_FAILED,
                f"master {view.master} of {req.broker_name} may still hold its lease:"
                f" retry in {wait * 1000:.0f} ms",
            )
        designated = broker_id if req.designated else None
        requester = None if req.designated else broker_id
        args = self.elect_args(view, requester, designated)
        if req.renew and req.designated:
            args = (*args, True)
        return await self.command(request, "elect_master", *args)

    async def clean_broker_data(self, request: Frame, _connection: object) -> Frame:
        req = decode(request, CleanBrokerDataRequest)
        ids = None if req.broker_ids is None else [check_id(b) for b in req.broker_ids]
        await self.fresh()
        before = self.raft.state.view(req.broker_name)
        alive = self.heartbeats.alive_ids(req.broker_name)
        reply = await self.command(request, "clean_broker_data", req.broker_name, ids, alive)
        if reply.code != RC.SUCCESS:
            return reply
        forgotten = ids if ids is not None else [] if before is None else list(before.replicas)
        for bid in forgotten:
            self.heartbeats.forget(req.broker_name, bid)
        return request.reply(RC.SUCCESS)

    # ------------------------------------------------------------------ elections

    def election_wait(self, view: GroupView) -> float:
        """Seconds before an election of ``view``'s group may run here (0.0: now). Only a
        master that is set and silent holds a lease that must run out."""
        if view.master is None or self.heartbeats.alive(view.broker_name, view.master):
            return 0.0
        leader_since = self.raft.leader_since
        if leader_since is None:
            return self.config.master_lease_ms / 1000  # not leader (any more): not now
        return election_wait(
            now=self.clock.monotonic(),
            master_last_heartbeat=self.heartbeats.last_seen(view.broker_name, view.master),
            leader_since=leader_since,
            master_lease=self.config.master_lease_ms / 1000,
            leader_fallback=self.config.leader_fallback_ms / 1000,
            margin=self.config.election_margin_ms / 1000,
        )

    def elect_args(
        self, view: GroupView, requester: int | None, designated: int | None
    ) -> tuple[Any, ...]:
        name = view.broker_name
        return (
            name,
            view.master_epoch,
            view.sync_state_set_epoch,
            requester,
            designated,
            self.heartbeats.candidates(name),
            self.config.enable_unclean_election,
            self.heartbeats.epoch_floor(name),
        )

    async def fresh(self) -> None:
        """Commit a barrier: afterwards the local state holds every command committed before
        this call (a linearizable read; a new leader may not have applied them yet).
        NotLeader or CommitTimeout when it does not commit."""
        try:
            await asyncio.wait_for(
                self.raft.submit("barrier"), self.config.commit_timeout_ms / 1000
            )
        except CommandFailed as exc:
            raise (NotLeader() if exc.leadership_lost else CommitTimeout(str(exc))) from None
        except TimeoutError:
            raise CommitTimeout("the read barrier did not commit in time") from None

    async def run(self, name: str, *args: Any) -> Outcome:
        """Submit a command and wait for its Outcome (CommandFailed, TimeoutError)."""
        fut = self.raft.submit(name, *args)
        outcome = await asyncio.wait_for(fut, self.config.commit_timeout_ms / 1000)
        if self.on_outcome is not None:
            self.on_outcome(name, outcome)
        return outcome

    async def command(self, request: Frame, name: str, *args: Any) -> Frame:
        try:
            outcome = await self.run(name, *args)
        except CommandFailed as exc:
            if exc.leadership_lost:
                return self.not_leader(request)
            return request.reply(RC.SYSTEM_BUSY, f"controller command {name} failed: {exc}")
        except TimeoutError:
            return request.reply(
                RC.SYSTEM_BUSY,
                f"controller command {name} did not commit within"
                f" {self.config.commit_timeout_ms} ms; its outcome is unknown",
            )
        if not outcome.ok:
            return request.reply(outcome.code, outcome.remark)
        if outcome.group is None:
            return request.reply(RC.SUCCESS)
        body = encode_body(replica_info(outcome.group, self.heartbeats))
        return request.reply(RC.SUCCESS, body=body)

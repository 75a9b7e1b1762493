"""A controller-mode broker's side of the controller (RocketMQ 5's ReplicasManager; docs/ha.md,
"Brokers in controller mode"): its id, its registration, its heartbeats and lease, and the
replica info that decides its role (applied through :class:`~orbitmq.broker.ha.roles.RoleSwitch`).

- **Id.** Kept in ``<store>/config/ha_broker_id.json``. On first start the broker asks
  CONTROLLER_GET_NEXT_BROKER_ID, writes the id and a check code (``host:port;timestamp``) to a
  temp file (fsynced), applies with CONTROLLER_APPLY_BROKER_ID, then renames the temp file into
  place. A crash in between re-applies the same id and code (the controller takes that as a
  retry); CONTROLLER_BROKER_ID_INVALID (someone else took it) asks again.
- **Heartbeats** to every controller node every ``controller_heartbeat_interval_ms``, with the
  epoch file's last epoch, the max and confirm offsets, the election priority and the send time.
  An answer of the Raft leader (``leader: true``) renews the **master lease** to that send time
  + ``master_lease_ms``; every answer names the group's master and epochs, so a change is
  noticed within one heartbeat.
- **Replica info** from the leader (CONTROLLER_NOT_LEADER: its ``leader_addr``, else the next
  node) after registering, on every NOTIFY_BROKER_ROLE_CHANGED, on a heartbeat that shows a
  change, on a fencing, and every ``replica_info_poll_ms`` as the fallback. Applied in one task:
  master = this broker at an epoch above the epoch file's last -> master; at one not above it
  (this broker restarted as master) -> it asks the controller to elect it again (designated), so
  what it writes from now on is told apart from what it wrote before the crash; another master
  -> slave of it (its HA address is its broker address with port + 1); no master -> ask
  CONTROLLER_ELECT_MASTER with its own id (at most once a second) and hold no master role.

It carries its own leader-following loop: ``orbitmq.controller.client`` sits in a sibling layer
the broker may not import.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import TypeVar

import msgspec

from orbitmq.broker.config import BrokerConfig
from orbitmq.broker.ha.master import HaMaster, StaleEpochError
from orbitmq.broker.ha.roles import RoleSwitch
from orbitmq.common.clock import Clock
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MQError, RequestTimeoutError
from orbitmq.common.tasks import TaskSet
from orbitmq.net.client import RemotingClient
from orbitmq.net.connection import Connection
from orbitmq.protocol.bodies import decode_body, encode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.controller import (
    AlterSyncStateSetRequest,
    ApplyBrokerIdRequest,
    ElectMasterRequest,
    GetNextBrokerIdRequest,
    GetReplicaInfoRequest,
    HeartbeatRequest,
    HeartbeatResponse,
    NextBrokerId,
    RegisterRequest,
    ReplicaInfo,
    ReplicaLag,
)
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.signature import Signer
from orbitmq.store.message_store import MessageStore

log = logging.getLogger(__name__)
T = TypeVar("T", bound=msgspec.Struct)
_NEXT_NODE = frozenset({ResponseCode.CONTROLLER_NOT_LEADER, ResponseCode.SYSTEM_BUSY})
ID_FILE = "ha_broker_id.json"


def ha_address(broker_address: str) -> str:
    """A broker's HA address in controller mode: its broker port + 1."""
    host, _, port = broker_address.rpartition(":")
    return f"{host}:{int(port) + 1}"


class ReplicasManager:
    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore,
        roles: RoleSwitch,
        clock: Clock,
    ) -> None:
        self.config = config
        self.store = store
        self.roles = roles
        self.clock = clock
        self.addrs = list(config.controller_addrs)
        self.address = ""
        self.leader: str | None = None
        self.info: ReplicaInfo | None = None
        """The last replica info read or notified."""
        self.lease_until = 0.0
        """Monotonic seconds until which this broker may act as master."""
        self.elections_asked = 0
        # Signed as its NameServer registrations are: a controller with auth on refuses the rest.
        self.client = RemotingClient(
            name="broker-to-controller",
            handler=self._incoming,
            signer=None
            if config.access_key is None
            else Signer(config.access_key, config.secret_key or ""),
        )
        self._tasks = TaskSet("ha-replicas", logger=log)
        self._changed = asyncio.Event()
        self._seen: tuple[int, int, int] = (-2, -1, -1)
        self._last_elect = 0.0
        self._lease_was_ok = False
        roles.lease_ok = self.lease_ok
        roles.alter = self.alter
        roles.on_fenced = self.fenced

    # ------------------------------------------------------------------ lifecycle

    async def start(self, address: str) -> None:
        self.address = address
        self._tasks.spawn(self._run(), name="ha-replicas")

    async def stop(self) -> None:
        await self._tasks.close(timeout=5.0)
        await self.client.close(1.0)

    def lease_ok(self) -> bool:
        return self.clock.monotonic() < self.lease_until

    def fenced(self, why: str) -> None:
        log.warning("fenced: %s; reading the replica info again", why)
        self._changed.set()

    # ------------------------------------------------------------------ controller calls

    async def call(self, code: int, body: msgspec.Struct, timeout: float = 5.0) -> Frame:
        """The leader's answer (any code but NOT_LEADER and SYSTEM_BUSY)."""
        deadline = time.monotonic() + timeout
        last = "no controller answered"
        while True:
            order: list[str] = [self.leader] if self.leader else []
            order += [a for a in self.addrs if a != self.leader]
            tried: set[str] = set()
            while order:
                addr = order.pop(0)
                if addr in tried:
                    continue
                tried.add(addr)
                frame = Frame(code, body=encode_body(body))
                try:
                    resp = await self.client.invoke(addr, frame, timeout=2.0)
                except (MQError, OSError) as exc:
                    last = f"{addr}: {exc}"
                    continue
                if resp.code not in _NEXT_NODE:
                    self.leader = addr
                    return resp
                last = f"{addr}: {resp.remark}"
                hint = resp.fields.get("leader_addr")
                if isinstance(hint, str) and hint not in tried:
                    order.insert(0, hint)
            self.leader = None
            if time.monotonic() >= deadline:
                raise RequestTimeoutError(f"no controller leader answered code {code}: {last}")
            await asyncio.sleep(0.1)

    async def _info_call(self, code: int, body: msgspec.Struct) -> ReplicaInfo | None:
        resp = await self.call(code, body)
        if resp.code != ResponseCode.SUCCESS:
            log.info("controller answered %s to %s: %s", resp.code, code, resp.remark)
            return None
        return decode_body(memoryview(resp.body), ReplicaInfo)

    async def alter(
        self, members: list[int], master_epoch: int, set_epoch: int
    ) -> tuple[list[int], int] | None:
        request = AlterSyncStateSetRequest(
            broker_name=self.config.broker_name,
            master_broker_id=self.roles.broker_id,
            master_epoch=master_epoch,
            sync_state_set_epoch=set_epoch,
            new_sync_state_set=members,
        )
        info = await self._info_call(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, request)
        if info is None:
            self._changed.set()  # fenced or refused: read where the group stands
            return None
        self.info = info
        return list(info.sync_state_set), info.sync_state_set_epoch

    # ------------------------------------------------------------------ id

    async def _acquire_id(self) -> int:
        config_dir = self.config.store.store_path / "config"
        final, temp = config_dir / ID_FILE, config_dir / (ID_FILE + ".tmp")
        known = await asyncio.to_thread(_read_id, final)
        if known is not None:
            return known[0]
        pending = await asyncio.to_thread(_read_id, temp)
        ident = {"cluster": self.config.cluster, "broker_name": self.config.broker_name}
        for _ in range(20):
            if pending is None:
                resp = await self.call(
                    RequestCode.CONTROLLER_GET_NEXT_BROKER_ID, GetNextBrokerIdRequest(**ident)
                )
                if resp.code != ResponseCode.SUCCESS:
                    raise MQError(f"cannot get a broker id: {resp.remark}")
                want = decode_body(memoryview(resp.body), NextBrokerId).next_broker_id
                pending = (want, f"{self.address};{time.time_ns()}")
                await asyncio.to_thread(_write_id, temp, pending)
            bid, code = pending
            request = ApplyBrokerIdRequest(
                **ident, broker_id=bid, address=self.address, register_check_code=code
            )
            resp = await self.call(RequestCode.CONTROLLER_APPLY_BROKER_ID, request)
            if resp.code == ResponseCode.SUCCESS:
                await asyncio.to_thread(_commit_id, temp, final)
                log.info("broker %s got id %d from the controller", self.config.broker_name, bid)
                return bid
            log.info("broker id %d refused (%s): asking again", bid, resp.remark)
            pending = None
        raise MQError("no broker id after 20 tries")

    # ------------------------------------------------------------------ heartbeats

    async def _heartbeats(self, addr: str) -> None:
        interval = self.config.controller_heartbeat_interval_ms / 1000
        lease = self.config.master_lease_ms / 1000
        while True:
            sent = self.clock.monotonic()
            cl = self.store.commit_log
            request = HeartbeatRequest(
                cluster=self.config.cluster,
                broker_name=self.config.broker_name,
                broker_id=self.roles.broker_id,
                address=self.address,
                epoch=max(self.store.epochs.last_epoch, self.roles.master_epoch),
                max_offset=cl.max_offset,
                confirm_offset=self.store.confirm_offset,
                election_priority=self.config.election_priority,
                send_time_ms=int(sent * 1000),
                replica_lag=self._lags(),
            )
            frame = Frame(RequestCode.BROKER_HEARTBEAT, body=encode_body(request))
            with contextlib.suppress(MQError, OSError):
                resp = await self.client.invoke(addr, frame, timeout=max(interval, 1.0))
                if resp.code == ResponseCode.SUCCESS:
                    answer = decode_body(memoryview(resp.body), HeartbeatResponse)
                    if answer.leader:
                        self.leader = addr
                        self.lease_until = max(self.lease_until, sent + lease)
                    seen = (answer.master_broker_id, answer.master_epoch,
                            answer.sync_state_set_epoch)  # fmt: skip
                    if answer.leader and seen != self._seen:
                        self._seen = seen
                        self._changed.set()
            await asyncio.sleep(max(0.0, sent + interval - self.clock.monotonic()))

    def _lags(self) -> list[ReplicaLag]:
        role = self.roles.role
        if not isinstance(role, HaMaster):
            return []
        return [
            ReplicaLag(broker_id=bid, acked_offset=acked, lag_bytes=lb, lag_ms=lm)
            for bid, acked, lb, lm in role.replica_lag()
        ]

    async def _incoming(self, frame: Frame, _conn: Connection) -> Frame | None:
        if frame.code == RequestCode.NOTIFY_BROKER_ROLE_CHANGED:
            with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                info = decode_body(memoryview(frame.body), ReplicaInfo)
                if info.broker_name == self.config.broker_name:
                    self._changed.set()
        return None

    # ------------------------------------------------------------------ the role

    async def _run(self) -> None:
        while True:
            try:
                self.roles.broker_id = await self._acquire_id()
                break
            except (MQError, OSError) as exc:
                log.warning("cannot get a broker id from the controller: %s", exc)
                await asyncio.sleep(1.0)
        for addr in self.addrs:
            self._tasks.spawn(self._heartbeats(addr), name=f"ha-heartbeat-{addr}")
        while True:
            try:
                request = RegisterRequest(
                    cluster=self.config.cluster, broker_name=self.config.broker_name,
                    broker_id=self.roles.broker_id, address=self.address,
                )  # fmt: skip
                if await self._info_call(RequestCode.CONTROLLER_REGISTER_BROKER, request):
                    break
            except (MQError, OSError) as exc:
                log.warning("cannot register with the controller: %s", exc)
            await asyncio.sleep(1.0)
        poll = self.config.replica_info_poll_ms / 1000
        next_poll = 0.0
        while True:
            if self._changed.is_set() or time.monotonic() >= next_poll:
                self._changed.clear()
                next_poll = time.monotonic() + poll
                try:
                    await self._sync()
                except (MQError, OSError, StaleEpochError) as exc:
                    log.warning("role from the controller not applied: %s", exc)
                    self._changed.set()
                    await asyncio.sleep(0.2)
                except Exception:
                    log.exception("role switch failed; retrying")
                    self._changed.set()
                    await asyncio.sleep(1.0)
            self._check_lease()
            with contextlib.suppress(TimeoutError):  # the lease is checked 4 times a second
                async with asyncio.timeout(0.25):
                    await self._changed.wait()

    def _check_lease(self) -> None:
        """A master whose lease lapsed re-registers under its own id (so the NameServers stop
        naming it master), and again as master once renewed."""
        ok = self.lease_ok()
        if self.roles.is_master and ok != self._lease_was_ok:
            if not ok:
                log.warning("master lease lapsed: no send is acknowledged until it is renewed")
            self.roles.hooks.role_changed()
        self._lease_was_ok = ok

    async def _sync(self) -> None:
        request = GetReplicaInfoRequest(broker_name=self.config.broker_name)
        info = await self._info_call(RequestCode.CONTROLLER_GET_REPLICA_INFO, request)
        if info is None:
            return
        self.info = info
        me = self.roles.broker_id
        if not info.has_master:
            if self.roles.is_master:
                await self.roles.become_none("the controller names no master")
            await self._ask_election(me, designated=False)
            return
        if info.master_broker_id == me:
            role_epoch = self.roles.master_epoch if self.roles.is_master else -1
            if role_epoch == info.master_epoch or info.master_epoch > self.store.epochs.last_epoch:
                await self.roles.become_master(
                    info.master_epoch, set(info.sync_state_set), info.sync_state_set_epoch
                )
            else:  # restarted as master: a new epoch for what this run writes
                await self._ask_election(me, designated=True, renew=True)
            return
        await self.roles.become_slave(ha_address(info.master_address), info.master_epoch)

    async def _ask_election(self, broker_id: int, *, designated: bool, renew: bool = False) -> None:
        now = time.monotonic()
        if now - self._last_elect < 1.0:
            return
        self._last_elect = now
        self.elections_asked += 1
        request = ElectMasterRequest(
            cluster=self.config.cluster, broker_name=self.config.broker_name,
            broker_id=broker_id, designated=designated, renew=renew,
        )  # fmt: skip
        info = await self._info_call(RequestCode.CONTROLLER_ELECT_MASTER, request)
        if info is not None:
            self._changed.set()


def _read_id(path: Path) -> tuple[int, str] | None:
    try:
        data = json.loads(path.read_text())
        return int(data["broker_id"]), str(data["check_code"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("%s is damaged (%s): ignored", path, exc)
        return None


def _write_id(path: Path, value: tuple[int, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump({"broker_id": value[0], "check_code": value[1]}, f)
        f.flush()
        os.fsync(f.fileno())


def _commit_id(temp: Path, final: Path) -> None:
    os.replace(temp, final)
    fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

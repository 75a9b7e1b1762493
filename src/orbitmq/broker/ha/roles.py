"""Runtime role switches of a broker in controller mode (docs/ha.md, "Brokers in controller
mode"): the broker's :class:`~orbitmq.broker.context.ReplicationGate` whose side (master, slave
or none yet) changes without a restart.

Why a gate that delegates: the send and pull paths hold the gate for the broker's lifetime
(the context is frozen), while the side behind it is rebuilt on every switch. Every switch runs
under one lock, in this order:

- **to master** (epoch E from the controller): refuse sends while switching; stop the slave's
  link; let the dispatcher catch up; take office (E appended to the epoch file, fsynced;
  refused when E is not above the file's last: :class:`~orbitmq.broker.ha.master.StaleEpochError`);
  listen on the HA port; start the services that append (Pop revive, transaction checks,
  timers); then take sends and register with the NameServers as the group's master.
- **to slave** (master M, epoch E): refuse sends at once; stop the master's side (its pending
  sync sends answer FLUSH_SLAVE_TIMEOUT: stored, outcome unknown); stop the appending services;
  wait for the store's writer to drain (no append of the old role lands after the cut); then
  follow M, whose handshake makes the slave cut its divergent tail crash-safely (epoch file +
  ``MessageStore.truncate_to``) before it takes any byte; register under its own id.
- **to none** (the controller has no master, or this master was deposed and nobody else won
  yet): refuse sends, stop the master's side and its services.

While it has no role the broker answers sends and pulls NO_PERMISSION, whose error policy
(``refresh_route``) sends clients back to their routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from orbitmq.broker.config import BrokerConfig
from orbitmq.broker.ha.link import Link, LinkClosedError
from orbitmq.broker.ha.master import HaMaster, Office
from orbitmq.broker.ha.slave import HaSlave
from orbitmq.broker.store_bridge import StoreBridge
from orbitmq.common.clock import Clock
from orbitmq.common.errors import FlushSlaveTimeoutError, NoPermissionError, ProtocolError
from orbitmq.protocol.ha import ERR_NOT_MASTER, HaError
from orbitmq.store.message_store import MessageStore

log = logging.getLogger(__name__)
_DRAIN_TIMEOUT_S = 10.0


class BrokerHooks(Protocol):
    """What a role switch asks of the broker around it (the BrokerController)."""

    async def start_master_services(self) -> None:
        """Start the services that append (Pop revive, transaction checks, timers)."""
        ...

    async def stop_master_services(self) -> None: ...

    def role_changed(self) -> None:
        """Register with the NameServers again now (the route's broker id changed)."""
        ...


class RoleSwitch:
    """The gate of a controller-mode broker and the switches behind it."""

    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore,
        bridge: StoreBridge,
        clock: Clock,
        hooks: BrokerHooks,
    ) -> None:
        self.config = config
        self.store = store
        self.bridge = bridge
        self.clock = clock
        self.hooks = hooks
        self.role: HaMaster | HaSlave | None = None
        self.broker_id = -1
        """This broker's id in its group, from the controller (-1 until known)."""
        self.ha_port = 0
        self.switches = 0
        self.fenced = 0
        """Sends refused or unacknowledged because this broker is not (or no more) master."""
        self._lock = asyncio.Lock()
        self._server: asyncio.Server | None = None
        self._installing: HaMaster | None = None
        self.lease_ok: Callable[[], bool] = lambda: False
        self.alter: Callable[[list[int], int, int], Awaitable[tuple[list[int], int] | None]]
        self.alter = _refuse_alter
        self.on_fenced: Callable[[str], None] = lambda _why: None
        self.truncation_guard: Callable[[], contextlib.AbstractAsyncContextManager[object]]
        self.truncation_guard = contextlib.nullcontext
        """Given to every slave side (``HaSlave.truncation_guard``)."""

    def describe(self) -> dict[str, object]:
        """Replication state for GET_BROKER_RUNTIME_INFO (the console's overview): the role,
        the epoch, and a master's in-sync count and per-replica lag, or a slave's master and
        whether its link is up."""
        role = self.role
        info: dict[str, object] = {"ha_role": "none", "ha_epoch": self.master_epoch,
                                   "ha_switches": self.switches}  # fmt: skip
        if isinstance(role, HaMaster):
            info.update(ha_role="master", ha_in_sync=role.in_sync_replicas,
                        ha_replicas={str(bid): [lag_bytes, lag_ms]
                                     for bid, _acked, lag_bytes, lag_ms in role.replica_lag()})  # fmt: skip
        elif isinstance(role, HaSlave):
            info.update(ha_role="slave", ha_master=f"{role.master[0]}:{role.master[1]}",
                        ha_connected=role.connected.is_set(), ha_last_error=role.last_error)  # fmt: skip
        return info

    # ------------------------------------------------------------------ the gate

    @property
    def is_master(self) -> bool:
        return isinstance(self.role, HaMaster)

    @property
    def master_epoch(self) -> int:
        """The epoch of the master this broker is (or is taking office as: valid inside
        ``start_master_services``) or follows; 0 without a role."""
        role = self.role or self._installing
        if isinstance(role, HaMaster):
            return role.epoch
        if isinstance(role, HaSlave):
            return role.expected_epoch
        return 0

    def check_send(self) -> None:
        role = self.role
        if role is None:
            self.fenced += 1
            raise NoPermissionError(
                f"broker {self.config.broker_name} id {self.broker_id} is not master (no role "
                "from the controller yet): send to the group's master"
            )
        if isinstance(role, HaSlave):
            self.fenced += 1  # a client still sending to a former or would-be master
        role.check_send()

    def check_read(self) -> None:
        role = self.role
        if role is None:
            raise NoPermissionError(
                f"broker {self.config.broker_name} id {self.broker_id} has no role yet"
            )
        role.check_read()

    async def wait_replicated(self, end_offset: int) -> None:
        role = self.role
        if role is None and self._installing is not None:
            # The broker's own writes while it takes office (the metadata log's snapshot):
            # no client waits on them (sends and metadata changes are refused until the
            # switch ends), slaves cannot link before it ends, and the ack of any later
            # client write covers these bytes too.
            return
        if not isinstance(role, HaMaster):
            self.fenced += 1
            raise FlushSlaveTimeoutError(
                f"stored up to {end_offset}, but this broker stopped being master before the "
                "ack: outcome unknown"
            )
        await role.wait_replicated(end_offset)

    # ------------------------------------------------------------------ the HA port

    async def listen(self, host: str, port: int) -> None:
        """Listen on the HA port for the broker's whole life: the port is this broker's
        whatever its role (nothing else can take it between switches), and a slave that
        follows a stale address is told at once (ERROR not master) instead of waiting."""
        self.ha_port = port
        self._server = await asyncio.start_server(
            self._accept, host, port, ssl=self.config.ha_server_ssl()
        )

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        role = self.role
        if isinstance(role, HaMaster):
            await role.serve(reader, writer)
            return
        link = Link(reader, writer, 1.0)
        with contextlib.suppress(LinkClosedError, ProtocolError):
            why = f"broker {self.config.broker_name} id {self.broker_id} is not master"
            await link.send(HaError(self.master_epoch, ERR_NOT_MASTER, why))
        await link.close()

    # ------------------------------------------------------------------ switches

    async def become_master(self, epoch: int, members: set[int], set_epoch: int) -> None:
        """Take office at ``epoch`` (StaleEpochError: not above the epoch file's last)."""
        async with self._lock:
            role = self.role
            if isinstance(role, HaMaster) and role.epoch == epoch:
                role.set_sync_state_set(members, set_epoch)
                return
            self.role = None
            await self._stop(role)
            await self.bridge.call(self.store.wait_for_dispatch, _DRAIN_TIMEOUT_S)
            office = Office(
                epoch=epoch,
                broker_id=self.broker_id,
                sync_state_set=set(members),
                sync_state_set_epoch=set_epoch,
                port=self.ha_port,
                lease_ok=self.lease_ok,
                alter=self.alter,
                fenced=self.on_fenced,
            )
            master = HaMaster(self.config, self.store, self.bridge, self.clock, office)
            await master.start()  # StaleEpochError propagates: no role
            self._installing = master
            try:
                await self.hooks.start_master_services()
            except BaseException:
                await master.stop()  # no role; the next replica info read tries again
                await self.hooks.stop_master_services()
                raise
            finally:
                self._installing = None
            self.role = master
            self.switches += 1
            log.warning("broker %s id %d is MASTER at epoch %d (SyncStateSet %s)",
                        self.config.broker_name, self.broker_id, epoch, sorted(members))  # fmt: skip
        self.hooks.role_changed()

    async def become_slave(self, master_ha: str, epoch: int) -> None:
        """Follow the master at ``master_ha`` ("host:ha_port") in ``epoch``."""
        async with self._lock:
            role = self.role
            if (
                isinstance(role, HaSlave)
                and role.expected_epoch == epoch
                and f"{role.master[0]}:{role.master[1]}" == master_ha
            ):
                return
            self.role = None
            await self._stop(role)
            slave = HaSlave(
                self.config, self.store, master=master_ha, master_epoch=epoch,
                broker_id=self.broker_id,
            )  # fmt: skip
            slave.truncation_guard = self.truncation_guard
            await slave.start()
            self.role = slave
            self.switches += 1
            log.warning("broker %s id %d is SLAVE of %s at epoch %d",
                        self.config.broker_name, self.broker_id, master_ha, epoch)  # fmt: skip
        self.hooks.role_changed()

    async def become_none(self, why: str) -> None:
        async with self._lock:
            role = self.role
            if role is None:
                return
            self.role = None
            await self._stop(role)
            self.switches += 1
            log.warning("broker %s id %d has no role: %s",
                        self.config.broker_name, self.broker_id, why)  # fmt: skip
        self.hooks.role_changed()

    async def stop(self) -> None:
        async with self._lock:
            role, self.role = self.role, None
            await self._stop(role)
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _stop(self, role: HaMaster | HaSlave | None) -> None:
        if isinstance(role, HaMaster):
            await role.stop()  # pending sync sends: FLUSH_SLAVE_TIMEOUT (stored, unknown)
            await self.hooks.stop_master_services()
            await self._drain()
        elif isinstance(role, HaSlave):
            await role.stop()

    async def _drain(self) -> None:
        """Wait until the store's writer has no append queued (sends that passed the gate
        before the switch): none may land after a slave's cut."""
        deadline = time.monotonic() + _DRAIN_TIMEOUT_S
        while self.bridge.pending and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self.bridge.pending:
            log.error("store writer still busy after %.0fs at a role switch", _DRAIN_TIMEOUT_S)


async def _refuse_alter(_members: list[int], _epoch: int, _set_epoch: int) -> None:
    return None

"""The master's side of replication (static mode): the HA server, the in-sync set, the confirm
offset and the sync-mode send waiters.

On start the master takes office: it appends ``(last epoch + 1, its max offset)`` to the epoch
file (every start, so bytes a crash lost and a slave kept are told apart from what this run
writes), then listens on the HA port. A slave connects and sends HANDSHAKE; the master answers
with its own and computes the same cut the slave will
(:func:`orbitmq.store.epoch.divergence_offset`; no common epoch: ERROR and close). The slave
truncates and ACKs its end; the master streams TRANSFER frames from there (whole records,
never across an epoch or a segment, read off the event loop), each carrying the confirm
offset, and a HEARTBEAT when idle for ``ha_heartbeat_interval_ms`` or when only the confirm
offset moved. A link silent for ``ha_link_timeout_ms`` is closed.

In-sync set: a slave joins once it has acked what the master held a tick earlier (and at
least the current confirm offset, so the confirm offset never goes back while the set grows);
it leaves on disconnect or after ``ha_max_time_slave_not_catchup_ms`` without catching up.
Confirm offset (sync mode): the smallest ack of the in-sync slaves, capped by the master's
end; with no slave in sync, it follows the master's end (RocketMQ 5 with
``minInSyncReplicas`` 1). Async mode: it always follows the end, and the slaves' lag is the
loss window. A sync send waits (:meth:`HaMaster.wait_replicated`) until the confirm offset
covers it, else FLUSH_SLAVE_TIMEOUT after ``slave_timeout_ms``; fewer than
``min_in_sync_replicas`` replicas in sync (the master counted) refuses it before it is stored.

Controller mode (an :class:`Office` given): the master takes office at the epoch the controller
elected it in (refusing one at or below its epoch file's last), and the in-sync set is the
controller's SyncStateSet: the master proposes every change (``Office.alter``, a compare-and-set
on the epochs) and, until it commits, counts acks against the union of the committed and the
proposed set, so neither a shrink nor an expand weakens an ack (RocketMQ #5663). A slave whose
frames carry a master epoch above this one means this master is deposed (``Office.fenced``).
While ``Office.lease_ok()`` is false (no heartbeat answered by the controller leader for the
lease) the master takes no send and answers none SEND_OK: an appended one gets
FLUSH_SLAVE_TIMEOUT (stored, outcome unknown).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from orbitmq.broker.config import BrokerConfig
from orbitmq.broker.ha.link import Link, LinkClosedError
from orbitmq.broker.store_bridge import StoreBridge
from orbitmq.common.clock import SYSTEM_CLOCK, Clock
from orbitmq.common.errors import (
    FlushSlaveTimeoutError,
    MQError,
    NoPermissionError,
    ProtocolError,
    ServiceNotAvailableError,
)
from orbitmq.common.tasks import TaskSet
from orbitmq.protocol.ha import (
    ERR_BAD_DATA,
    ERR_FENCED,
    ERR_NO_COMMON_EPOCH,
    Ack,
    HaError,
    Handshake,
    Heartbeat,
    SegmentKey,
    Transfer,
)
from orbitmq.store.epoch import NoCommonEpochError, divergence_offset
from orbitmq.store.message_store import MessageStore

log = logging.getLogger(__name__)
CHUNK_BYTES = 256 * 1024
_TICK_S = 0.05


class StaleEpochError(Exception):
    """The controller's epoch for this master is not above the epoch file's last: refused (an
    epoch is never written twice, even by a controller that lost committed entries)."""


@dataclass(slots=True, eq=False)
class Office:
    """A master's term in controller mode: what the controller elected it with, and how the
    master talks back (the broker's :mod:`~orbitmq.broker.ha.replicas` provides the calls)."""

    epoch: int
    broker_id: int
    sync_state_set: set[int]
    sync_state_set_epoch: int
    port: int
    """The HA port (the broker port + 1), listened on by the broker's RoleSwitch for its whole
    life, whatever its role: it hands a master's links to :meth:`HaMaster.serve`."""
    lease_ok: Callable[[], bool]
    alter: Callable[[list[int], int, int], Awaitable[tuple[list[int], int] | None]]
    """Propose (set, master epoch, set epoch); the committed (set, set epoch), or None when
    refused (the proposer re-reads the replica info)."""
    fenced: Callable[[str], None]
    """A peer showed a higher master epoch: this master is deposed."""


@dataclass(slots=True, eq=False)
class SlaveState:
    """One connected slave, as the master sees it."""

    broker_id: int
    link: Link
    acked: int = 0
    flushed: int = 0
    in_sync: bool = False
    caught_up_at: float = 0.0
    prev_max: int = 0
    ready: bool = False  # its first ACK (after truncation) came
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    keys_sent: set[int] = field(default_factory=set)
    """Segments whose DEK this link carried (encryption at rest)."""


class HaMaster:
    """The master's replication service and the send path's :class:`ReplicationGate`."""

    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore,
        bridge: StoreBridge,
        clock: Clock = SYSTEM_CLOCK,
        office: Office | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.bridge = bridge
        self.clock = clock
        self.office = office
        self.sync = config.replication_mode == "sync"
        self.epoch = 0
        self.pending_set: set[int] | None = None
        """Controller mode: a proposed SyncStateSet not yet committed."""
        self.alter_count = 0
        self.fenced_count = 0
        self._last_acks: dict[int, int] = {}
        self.slaves: dict[int, SlaveState] = {}
        self._server: asyncio.Server | None = None
        self._tasks = TaskSet("ha-master", logger=log)
        self._waiters: list[tuple[int, int, asyncio.Future[None], float]] = []
        self._seq = itertools.count()
        self._confirm = 0
        self._port = 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await self.bridge.call(self._take_office)
        self._confirm = self.store.commit_log.max_offset
        self.store.set_confirm_offset(None)
        if self.office is not None:  # the broker's RoleSwitch listens and hands links over
            self._port = self.office.port
        else:
            port = self.config.ha_port
            if port is None:
                port = self.config.port + 1 if self.config.port else 0
            self._server = await asyncio.start_server(
                self._serve, self.config.host, port, ssl=self.config.ha_server_ssl()
            )
            self._port = self._server.sockets[0].getsockname()[1]
        self._tasks.spawn(self._monitor(), name="ha-monitor")
        log.info(
            "HA master %s epoch %d listening on %s:%d (%s)",
            self.config.broker_name, self.epoch, self.config.host, self._port,
            self.config.replication_mode,
        )  # fmt: skip

    def _take_office(self) -> None:
        """On a thread: a new epoch for what this run writes (the epoch file is fsynced)."""
        epochs = self.store.epochs
        if self.office is not None:
            epoch = self.office.epoch
            if epochs.entries and epoch <= epochs.last_epoch:
                raise StaleEpochError(
                    f"master epoch {epoch} is not above the epoch file's last {epochs.last_epoch}"
                )
            epochs.append(epoch, self.store.commit_log.max_offset if epochs.entries else 0)
        elif not epochs.entries:
            epochs.append(1, 0)  # everything written before replication was on
        else:
            epochs.append(epochs.last_epoch + 1, self.store.commit_log.max_offset)
        self.epoch = epochs.last_epoch
        if self.store.sealer is not None and self.epoch < 1 << 16:
            # writer epochs unique in the group: the segment keys are shared (keys.py)
            self.store.sealer.epoch.bump(floor=self.epoch << 16)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for slave in list(self.slaves.values()):
            await slave.link.close()
        await self._tasks.close(timeout=5.0)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        for _e, _s, fut, _d in self._waiters:
            if not fut.done():
                fut.set_exception(FlushSlaveTimeoutError("broker is stopping"))
        self._waiters.clear()

    @property
    def port(self) -> int:
        return self._port

    @property
    def in_sync_replicas(self) -> int:
        """Replicas in sync, the master counted (controller mode: the committed SyncStateSet,
        or the proposed one while it is smaller)."""
        if self.office is not None:
            n = len(self.office.sync_state_set | {self.office.broker_id})
            if self.pending_set is not None:
                n = min(n, len(self.pending_set))
            return n
        return 1 + sum(1 for s in self.slaves.values() if s.in_sync)

    def ack_members(self) -> set[int]:
        """The slaves whose acks a sync send waits for: the in-sync ones; in controller mode the
        union of the committed and the proposed SyncStateSet, the master left out."""
        if self.office is None:
            return {s.broker_id for s in self.slaves.values() if s.in_sync}
        members = set(self.office.sync_state_set)
        if self.pending_set is not None:
            members |= self.pending_set
        members.discard(self.office.broker_id)
        return members

    def replica_lag(self) -> list[tuple[int, int, int, int]]:
        """(slave id, acked offset, lag bytes, lag ms) of every connected slave."""
        end = self.store.commit_log.max_offset
        now = self.clock.monotonic()
        return [
            (s.broker_id, s.acked, max(0, end - s.acked),
             0 if s.acked >= end else int((now - s.caught_up_at) * 1000))
            for s in self.slaves.values()
        ]  # fmt: skip

    def lease_ok(self) -> bool:
        return self.office is None or self.office.lease_ok()

    # ------------------------------------------------------------------ the gate

    def check_send(self) -> None:
        if not self.lease_ok():
            self.fenced_count += 1
            raise NoPermissionError(
                f"broker {self.config.broker_name} is not master: its lease from the controller "
                "lapsed (send to the group's current master)"
            )
        if self.sync and self.in_sync_replicas < self.config.min_in_sync_replicas:
            raise ServiceNotAvailableError(
                f"in-sync replicas not enough: {self.in_sync_replicas} < "
                f"min_in_sync_replicas {self.config.min_in_sync_replicas}"
            )

    def check_read(self) -> None:
        return None

    async def wait_replicated(self, end_offset: int) -> None:
        self._notify()  # new bytes: wake the senders now rather than at their next tick
        if self.sync and end_offset > self._confirm:
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[None] = loop.create_future()
            deadline = loop.time() + self.config.slave_timeout_ms / 1000
            heapq.heappush(self._waiters, (end_offset, next(self._seq), fut, deadline))
            await fut
        if not self.lease_ok():  # checked at ack time: a paused master must not ack late
            self.fenced_count += 1
            raise FlushSlaveTimeoutError(
                f"stored up to {end_offset}, but the master lease lapsed before the ack: "
                "outcome unknown"
            )

    # ------------------------------------------------------------------ confirm offset

    def _recompute(self) -> None:
        """The confirm offset from the in-sync slaves' acks; release the sends it covers."""
        end = self.store.commit_log.max_offset
        for s in self.slaves.values():
            self._last_acks[s.broker_id] = s.acked
        # A member not connected counts with its last ack (0 if never seen): the confirm offset
        # waits for the controller to commit its removal.
        acks = [self._last_acks.get(m, 0) for m in self.ack_members()]
        if not self.sync or not acks:
            confirm, setting = end, None
        else:
            confirm = min(min(acks), end)
            setting = confirm
        if setting != self.store.commit_log.confirmed or confirm != self._confirm:
            self.store.set_confirm_offset(setting)
            self._notify()  # the senders pass the news on
        self._confirm = confirm
        waiters = self._waiters
        while waiters and waiters[0][0] <= confirm:
            _e, _s, fut, _d = heapq.heappop(waiters)
            if not fut.done():
                fut.set_result(None)

    def _expire(self) -> None:
        now = asyncio.get_running_loop().time()
        kept = []
        for item in self._waiters:
            end, _s, fut, deadline = item
            if deadline > now:
                kept.append(item)
            elif not fut.done():
                fut.set_exception(
                    FlushSlaveTimeoutError(
                        f"bytes up to {end} not acknowledged by every in-sync slave within "
                        f"{self.config.slave_timeout_ms} ms"
                    )
                )
        if len(kept) != len(self._waiters):
            heapq.heapify(kept)
            self._waiters = kept

    def _update_in_sync(self, slave: SlaveState, now: float) -> None:
        if not slave.ready:
            return
        if slave.acked >= slave.prev_max:
            slave.caught_up_at = now
        if self.office is not None:
            self._want_in_sync(slave, now)
            return
        limit = self.config.ha_max_time_slave_not_catchup_ms / 1000
        if slave.in_sync and now - slave.caught_up_at > limit:
            slave.in_sync = False
            log.warning(
                "slave %d leaves the in-sync set: not caught up for %.1fs (acked %d of %d)",
                slave.broker_id, now - slave.caught_up_at, slave.acked,
                self.store.commit_log.max_offset,
            )  # fmt: skip
        elif not slave.in_sync and slave.caught_up_at == now:
            others = [s.acked for s in self.slaves.values() if s.in_sync]
            if not others or slave.acked >= self._confirm:
                slave.in_sync = True
                log.info("slave %d joins the in-sync set at %d", slave.broker_id, slave.acked)

    def _want_in_sync(self, slave: SlaveState, now: float) -> None:
        """Controller mode: mark whether ``slave`` belongs in the SyncStateSet (the proposal is
        made by :meth:`_propose`). Join: acked at least the confirm offset and this epoch's
        start; leave: behind for ha_max_time_slave_not_catchup_ms."""
        limit = self.config.ha_max_time_slave_not_catchup_ms / 1000
        start = self.store.epochs.entries[-1][1] if self.store.epochs.entries else 0
        if slave.in_sync:
            slave.in_sync = now - slave.caught_up_at <= limit
        else:
            slave.in_sync = (
                slave.caught_up_at == now and slave.acked >= self._confirm and slave.acked >= start
            )

    def _propose(self) -> None:
        """Controller mode: propose the SyncStateSet the links say, unless one is pending."""
        office = self.office
        if office is None or self.pending_set is not None:
            return
        wanted = {office.broker_id} | {s.broker_id for s in self.slaves.values() if s.in_sync}
        if wanted == office.sync_state_set | {office.broker_id}:
            return
        self.pending_set = wanted
        self._tasks.spawn(self._alter(office, wanted), name="ha-alter-sync-state-set")

    async def _alter(self, office: Office, wanted: set[int]) -> None:
        try:
            result = await office.alter(sorted(wanted), self.epoch, office.sync_state_set_epoch)
        except (MQError, OSError) as exc:
            log.warning("SyncStateSet change to %s failed: %s", sorted(wanted), exc)
            result = None
        if result is not None:
            members, set_epoch = result
            office.sync_state_set, office.sync_state_set_epoch = set(members), set_epoch
            self.alter_count += 1
            log.info("SyncStateSet of %s is now %s (epoch %d)",
                     self.config.broker_name, members, set_epoch)  # fmt: skip
        else:
            await asyncio.sleep(0.5)  # refused or unreachable: the next tick proposes again
        self.pending_set = None
        self._recompute()

    def set_sync_state_set(self, members: set[int], set_epoch: int) -> None:
        """Controller mode: the committed set as the controller reports it (a newer epoch)."""
        office = self.office
        if office is not None and set_epoch > office.sync_state_set_epoch:
            office.sync_state_set, office.sync_state_set_epoch = set(members), set_epoch
            self._recompute()

    async def _monitor(self) -> None:
        while True:
            await asyncio.sleep(_TICK_S)
            now = self.clock.monotonic()
            end = self.store.commit_log.max_offset
            for slave in self.slaves.values():
                self._update_in_sync(slave, now)
                slave.prev_max = end
            self._propose()
            self._recompute()
            self._expire()
            if end > self._confirm or self._waiters:
                self._notify()

    def _notify(self) -> None:
        for slave in self.slaves.values():
            slave.wake.set()

    # ------------------------------------------------------------------ one slave

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one slave's link until it closes (controller mode: called by the RoleSwitch)."""
        await self._serve(reader, writer)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = Link(reader, writer, self.config.ha_link_timeout_ms / 1000)
        slave: SlaveState | None = None
        try:
            slave = await self._handshake(link)
            if slave is None:
                return
            sender = self._tasks.spawn(self._send_loop(slave), name=f"ha-send-{slave.broker_id}")
            try:
                while True:
                    frame = await link.recv()
                    if isinstance(frame, Ack):
                        slave.acked, slave.flushed = frame.max_offset, frame.flushed_offset
                        self._update_in_sync(slave, self.clock.monotonic())
                        self._recompute()
                    elif isinstance(frame, HaError):
                        log.warning("slave %d: %s", slave.broker_id, frame.message)
                        return
            finally:
                sender.cancel()
        except (LinkClosedError, ProtocolError, MQError, OSError) as exc:
            log.info("HA link to %s closed: %s", link.peer, exc)
        finally:
            if slave is not None and self.slaves.get(slave.broker_id) is slave:
                del self.slaves[slave.broker_id]
                if slave.in_sync:
                    log.warning("slave %d leaves the in-sync set: link lost", slave.broker_id)
                self._propose()
                self._recompute()
            await link.close()

    async def _handshake(self, link: Link) -> SlaveState | None:
        hello = await link.recv()
        if not isinstance(hello, Handshake) or hello.broker_name != self.config.broker_name:
            await self._refuse(link, ERR_BAD_DATA, f"expected a handshake from group "
                               f"{self.config.broker_name}, got {hello!r:.200}")  # fmt: skip
            return None
        if self.office is not None and hello.master_epoch > self.epoch:
            self.fenced_count += 1
            why = (
                f"slave {hello.broker_id} follows master epoch {hello.master_epoch} > {self.epoch}"
            )
            await self._refuse(link, ERR_FENCED, why)
            self.office.fenced(why)
            return None
        entries = self.store.epochs.entries
        end = self.store.commit_log.max_offset
        await link.send(Handshake(self.epoch, self.config.broker_id, self.config.broker_name,
                                  entries, end))  # fmt: skip
        try:
            cut = divergence_offset(hello.epochs, hello.max_offset, entries, end)
        except NoCommonEpochError as exc:
            await self._refuse(link, ERR_NO_COMMON_EPOCH, str(exc))
            return None
        first = await link.recv()  # the slave's end after its truncation
        if not isinstance(first, Ack) or first.max_offset != cut:
            await self._refuse(link, ERR_BAD_DATA, f"expected an ACK at {cut}, got {first!r:.200}")
            return None
        old = self.slaves.get(hello.broker_id)
        if old is not None:
            await old.link.close()  # a reconnect replaces a link that has not noticed yet
        slave = SlaveState(hello.broker_id, link, acked=cut, flushed=first.flushed_offset)
        slave.ready = True
        slave.caught_up_at = self.clock.monotonic()
        self.slaves[hello.broker_id] = slave
        log.info("slave %d of %s connected from %s at %d (master end %d)",
                 hello.broker_id, hello.broker_name, link.peer, cut, end)  # fmt: skip
        return slave

    @staticmethod
    async def _refuse(link: Link, code: int, message: str) -> None:
        log.warning("refusing HA link from %s: %s", link.peer, message)
        with contextlib.suppress(LinkClosedError, ProtocolError):
            await link.send(HaError(0, code, message))

    def _epoch_at(self, pos: int) -> tuple[int, int, int | None]:
        """(epoch, its start, the next epoch's start or None) of the byte at ``pos``."""
        entries = self.store.epochs.entries
        for i in range(len(entries) - 1, -1, -1):
            epoch, start = entries[i]
            if start <= pos:
                nxt = next((s for _e, s in entries[i + 1 :] if s > pos), None)
                return epoch, start, nxt
        raise ProtocolError(f"offset {pos} lies before the first epoch {entries[:1]}")

    async def _send_loop(self, slave: SlaveState) -> None:
        """The sender; if it fails (a chunk the log no longer holds, a closed socket), the link
        is closed, so the reader ends too and the slave reconnects."""
        try:
            await self._stream(slave)
        except (LinkClosedError, ProtocolError, MQError, OSError) as exc:
            log.warning("HA sender to slave %d stops: %s", slave.broker_id, exc)
            slave.link.writer.close()

    async def _send_key(self, slave: SlaveState, seg_start: int) -> None:
        """Before a segment's first bytes: its DEK file (wrapped under the master key, which
        every replica holds), so the slave reads, dispatches and later writes it as we do."""
        if seg_start in slave.keys_sent or self.store.sealer is None:
            return
        raw = await self.bridge.call(self.store.sealer.deks.raw, seg_start)
        if raw is not None:  # None: a segment written before encryption was on
            await slave.link.send(SegmentKey(self.epoch, seg_start, raw))
        slave.keys_sent.add(seg_start)

    async def _stream(self, slave: SlaveState) -> None:
        """Send the log from the slave's end on, and heartbeats when idle."""
        cl = self.store.commit_log
        pos = slave.acked
        if pos == 0 and cl.min_offset > 0:
            pos = cl.min_offset  # an empty slave of a master whose first segments are gone
        heartbeat_s = self.config.ha_heartbeat_interval_ms / 1000
        last_sent = self.clock.monotonic()
        sent_confirm = -1
        while True:
            confirm = self.store.confirm_offset
            if pos < cl.max_offset:
                epoch, start, limit = self._epoch_at(pos)
                chunk = await self.bridge.read(_read_copy, self.store, pos, limit)
                if chunk and self.store.sealer is not None:
                    await self._send_key(slave, pos - pos % cl.segment_size)
                if chunk:
                    frame = Transfer(self.epoch, pos, epoch, start, min(confirm, pos + len(chunk)),
                                     chunk)  # fmt: skip
                    await slave.link.send(frame)
                    pos = frame.end
                    sent_confirm, last_sent = frame.confirm_offset, self.clock.monotonic()
                    continue
            now = self.clock.monotonic()
            if confirm != sent_confirm or now - last_sent >= heartbeat_s:
                await slave.link.send(Heartbeat(self.epoch, cl.max_offset, min(confirm, pos)))
                sent_confirm, last_sent = confirm, now
            slave.wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_TICK_S):
                    await slave.wake.wait()


def _read_copy(store: MessageStore, pos: int, limit: int | None) -> bytes:
    """On a reader thread: a chunk, copied (retention may unmap its segment later)."""
    return bytes(store.read_replication(pos, CHUNK_BYTES, limit))

"""The slave's side of replication (static mode): copy the master's CommitLog, verbatim.

The slave connects to ``ha_master_address`` and sends HANDSHAKE (its id, group, epoch list and
end). From the master's answer it computes where its log stops agreeing with the master's
(:func:`orbitmq.store.epoch.divergence_offset`), cuts its log there crash-safely
(``MessageStore.truncate_to``) if it holds more, and ACKs its end. Then, for every TRANSFER:
record a new epoch in the epoch file, append the bytes at its end
(``MessageStore.append_replicated``: checked record by record, written at the same offsets, so
the logs stay byte-identical), optionally fdatasync them (``ha_slave_ack_after_flush``), set its
confirm offset to min(the master's, its end) and ACK. Every HEARTBEAT is answered with an ACK,
which is also the slave's heartbeat. A lost link is retried with a backoff up to 5 s; no common
epoch is logged as an error on every try (the store must be resynced: docs/ha.md).

Store calls run on one thread of the slave's own, in order, never on the event loop. A slave
refuses sends (NO_PERMISSION, whose policy sends the client to refresh its route: RocketMQ's
slave store refuses a put too, and a route lists only the master as writable), and serves
pulls only with ``slave_read_enable``, never above its confirm offset (the store's gate).

Controller mode (``master`` and ``master_epoch`` given by the controller): the slave's frames
carry that epoch, and it drops a master whose handshake or TRANSFER carries a lower one (a
deposed master that has not noticed yet: fencing).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from orbitmq.broker.config import BrokerConfig
from orbitmq.broker.ha.link import Link, LinkClosedError
from orbitmq.common.errors import MQError, NoPermissionError, ProtocolError, StoreError
from orbitmq.common.tasks import TaskSet
from orbitmq.protocol.ha import (
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
_MAX_BACKOFF_S = 5.0


class HaSlave:
    """The slave's replication client and the broker's :class:`ReplicationGate` on a slave."""

    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore,
        *,
        master: str | None = None,
        master_epoch: int = 0,
        broker_id: int | None = None,
    ) -> None:
        address = master or config.ha_master_address
        if not address:
            raise ValueError("a slave with ha_enable needs ha_master_address")
        host, _, port = address.rpartition(":")
        self.master = (host, int(port))
        self.expected_epoch = master_epoch
        """Controller mode: the master epoch the controller gave (0 in static mode)."""
        self.broker_id = config.broker_id if broker_id is None else broker_id
        self.fenced_count = 0
        self.config = config
        self.store = store
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="orbitmq-ha-slave")
        self._tasks = TaskSet("ha-slave", logger=log)
        self._link: Link | None = None
        self.connected = asyncio.Event()
        """Set while a link is up and past its handshake (tests wait on it)."""
        self.master_epoch = -1
        self.sessions = 0
        self.last_error = ""
        self.truncation_guard: Callable[[], contextlib.AbstractAsyncContextManager[object]]
        self.truncation_guard = contextlib.nullcontext
        """Held around a cut: the broker's metadata tail (``MetadataService.paused``) reads
        the store, and a truncation wants reads quiesced."""

    # ------------------------------------------------------------------ the gate

    def check_send(self) -> None:
        raise NoPermissionError(
            f"broker {self.config.broker_name} id {self.broker_id} is a slave: send to its master"
        )

    def check_read(self) -> None:
        if not self.config.slave_read_enable:
            raise NoPermissionError(
                f"broker {self.config.broker_name} id {self.broker_id} is a slave "
                "without slave_read_enable: read from its master"
            )

    async def wait_replicated(self, end_offset: int) -> None:
        return None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._tasks.spawn(self._run(), name="ha-slave")

    async def stop(self) -> None:
        if self._link is not None:
            await self._link.close()
        await self._tasks.close(timeout=5.0)
        await asyncio.get_running_loop().run_in_executor(None, self._thread.shutdown)

    async def _call(self, fn: object, *args: object) -> object:
        assert callable(fn)
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def _run(self) -> None:
        backoff = 0.1
        while True:
            try:
                await self._session()
                backoff = 0.1
            except NoCommonEpochError as exc:
                self.last_error = str(exc)
                log.error("cannot join master %s:%d: %s (resync this store: docs/ha.md)",
                          *self.master, exc)  # fmt: skip
            except (LinkClosedError, ProtocolError, MQError, OSError, TimeoutError) as exc:
                self.last_error = str(exc)
                log.info("HA link to master %s:%d lost: %s", *self.master, exc)
            finally:
                self.connected.clear()
                if self._link is not None:
                    await self._link.close()
                    self._link = None
            await asyncio.sleep(backoff)
            backoff = min(_MAX_BACKOFF_S, backoff * 2)

    # ------------------------------------------------------------------ one session

    async def _session(self) -> None:
        timeout_s = self.config.ha_link_timeout_ms / 1000
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(
                *self.master, ssl=self.config.ha_client_ssl()
            )
        link = self._link = Link(reader, writer, timeout_s)
        store, cl = self.store, self.store.commit_log
        mine = self.expected_epoch
        await link.send(Handshake(mine, self.broker_id, self.config.broker_name,
                                  store.epochs.entries, cl.max_offset))  # fmt: skip
        hello = await link.recv()
        if isinstance(hello, HaError):
            raise LinkClosedError(f"master refused the link: {hello.message}")
        if not isinstance(hello, Handshake):
            raise ProtocolError(f"expected the master's handshake, got {hello!r:.200}")
        if hello.master_epoch < mine:
            self.fenced_count += 1
            with contextlib.suppress(LinkClosedError):
                await link.send(HaError(mine, ERR_FENCED, f"master epoch {hello.master_epoch} "
                                        f"is below {mine}"))  # fmt: skip
            raise LinkClosedError(f"master epoch {hello.master_epoch} is below {mine} (fenced)")
        try:
            cut = divergence_offset(store.epochs.entries, cl.max_offset, hello.epochs,
                                    hello.max_offset)  # fmt: skip
        except NoCommonEpochError as exc:
            with contextlib.suppress(LinkClosedError):
                await link.send(HaError(mine, ERR_NO_COMMON_EPOCH, str(exc)))
            raise
        if cut < cl.max_offset:
            log.warning("slave %d truncates its log from %d to %d (diverged from the master)",
                        self.broker_id, cl.max_offset, cut)  # fmt: skip
            async with self.truncation_guard():
                await self._call(store.truncate_to, cut)
        store.set_confirm_offset(min(cut, store.confirm_offset))  # until the master says more
        self.master_epoch = hello.master_epoch
        await link.send(Ack(mine, cl.max_offset, cl.flushed_offset))
        self.sessions += 1
        self.connected.set()
        log.info("slave %d following master %s:%d epoch %d from %d",
                 self.broker_id, *self.master, hello.master_epoch, cut)  # fmt: skip
        while True:
            frame = await link.recv()
            if isinstance(frame, Transfer):
                end, flushed = await self._apply(frame)
                self._confirm(frame.confirm_offset)
                await link.send(Ack(mine, end, flushed))
            elif isinstance(frame, Heartbeat):
                self._confirm(frame.confirm_offset)
                await link.send(Ack(mine, cl.max_offset, cl.flushed_offset))
            elif isinstance(frame, SegmentKey):
                await self._install_key(frame)
            elif isinstance(frame, HaError):
                raise LinkClosedError(f"master closed the link: {frame.message}")

    async def _install_key(self, frame: SegmentKey) -> None:
        """The master's DEK for a segment, before that segment's bytes (encryption at rest:
        same master key on every replica; docs/security.md)."""
        sealer = self.store.sealer
        if sealer is None:
            raise LinkClosedError("the master encrypts at rest and this replica does not: "
                                  "set store.encrypt_at_rest and the same master key")  # fmt: skip
        try:
            await self._call(sealer.install_key, frame.segment_start, frame.wrapped)
        except StoreError as exc:
            raise LinkClosedError(f"segment key from the master not usable here: {exc}") from None

    def _confirm(self, master_confirm: int) -> None:
        cl = self.store.commit_log
        offset = min(master_confirm, cl.max_offset)
        if offset != cl.confirmed:
            self.store.set_confirm_offset(offset)

    async def _apply(self, t: Transfer) -> tuple[int, int]:
        if t.master_epoch < self.master_epoch:
            self.fenced_count += 1
            raise ProtocolError(f"TRANSFER of epoch {t.master_epoch} below {self.master_epoch}")
        result = await self._call(_apply_on_thread, self.store, t,
                                  self.config.ha_slave_ack_after_flush)  # fmt: skip
        assert isinstance(result, tuple)
        return result


def _apply_on_thread(store: MessageStore, t: Transfer, flush: bool) -> tuple[int, int]:
    """On the slave's thread: epoch, append, optional fdatasync; (new end, flushed offset)."""
    if t.epoch > store.epochs.last_epoch:
        store.epochs.append(t.epoch, t.epoch_start)
    end = store.append_replicated(t.offset, t.payload)
    if flush:
        store.commit_log.flush(end)
    return end, store.commit_log.flushed_offset

"""BrokerContext: what the broker's processors and services share, built once by the controller.

A service takes the context (and, by constructor argument, the one or two other services it
calls), never the :class:`~orbitmq.broker.controller.BrokerController`: so a reader sees what a
service can touch from its constructor, and the import graph points one way (controller ->
routes -> processors and services -> context -> managers). This module imports no processor
or service; the ``layers`` contract in pyproject.toml keeps it so.

`SystemLog` is how the Pop and transaction services append to and read their system topics
(the revive log, the half and op topics; Kafka's ``PartitionWriter`` + ``CoordinatorLoader``):
appends are durable as a send is, reads run off the event loop, and a record is also found by
the CommitLog offset its append returned (a half message is named by it). `StoreSystemLog` is
the one over the broker's store; the tests have an in-memory one. What those services read or
write in user topics (the messages a Pop checkpoint names, retry and DLQ copies, committed
copies) goes through ``store`` and ``bridge``, as every other handler's does. The timer topic
is still wholly the store's: its index loads the topic's ConsumeQueue tags (the due times), and
a fire pass appends deliveries and rolled copies in one store call outside the writer queue
(background work is never refused SYSTEM_BUSY), then fsyncs them once before its checkpoint,
which SystemLog.append (durable "as a send", not fsynced in ASYNC_FLUSH) cannot promise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from orbitmq.broker.config import BrokerConfig
from orbitmq.broker.consumer_manager import ConsumerManager
from orbitmq.broker.group_config_manager import SubscriptionGroupManager
from orbitmq.broker.lock_manager import LockManager
from orbitmq.broker.metadata.records import REPLICATED_FILES, FilePut, Journal
from orbitmq.broker.metrics import BrokerMetrics
from orbitmq.broker.offset_manager import ConsumerOffsetManager
from orbitmq.broker.store_bridge import StoreBridge
from orbitmq.broker.topic_manager import TopicConfigManager
from orbitmq.common.clock import Clock
from orbitmq.common.message import MessageBatch
from orbitmq.protocol.bodies import TopicConfig
from orbitmq.store.commit_log import AppendResult
from orbitmq.store.message_store import GetResult, MessageStore


class SystemLog(Protocol):
    """Appends to and reads of the broker's system topics (revive log, timer, half/op)."""

    async def append(self, batch: MessageBatch) -> AppendResult:
        """Store ``batch``; returns once it is as durable as a send (FlushTimeoutError if not)."""
        ...

    async def read(
        self, topic: str, queue_id: int, offset: int, max_count: int, max_bytes: int
    ) -> GetResult:
        """Up to ``max_count`` records (``max_bytes`` at most) from ``offset`` on, off the loop."""
        ...

    async def read_records(self, physical_offsets: list[int]) -> list[bytes | None]:
        """The records at these CommitLog offsets (as returned by ``append``), None where
        gone, off the loop."""
        ...

    def max_offset(self, topic: str, queue_id: int) -> int:
        """The queue offset the next append to (topic, queue) gets, once settled."""
        ...

    def min_offset(self, topic: str, queue_id: int) -> int:
        """The queue's first offset still kept (retention may have dropped older ones)."""
        ...

    async def settle(self, timeout: float = 10.0) -> None:
        """Wait until everything appended is readable (``max_offset`` counts it), at most
        ``timeout`` seconds. A closed log is settled."""
        ...


class StoreSystemLog:
    """`SystemLog` over the broker's store: appends through the store bridge's writer."""

    def __init__(self, store: MessageStore, bridge: StoreBridge) -> None:
        self._store = store
        self._bridge = bridge

    async def append(self, batch: MessageBatch) -> AppendResult:
        return await self._bridge.put(batch)

    async def read(
        self, topic: str, queue_id: int, offset: int, max_count: int, max_bytes: int
    ) -> GetResult:
        store = self._store
        return await self._bridge.read(
            store.get_messages, topic, queue_id, offset, max_count, max_bytes, None
        )

    async def read_records(self, physical_offsets: list[int]) -> list[bytes | None]:
        return await self._bridge.read(_read_records, self._store, physical_offsets)

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self._store.max_offset(topic, queue_id)

    def min_offset(self, topic: str, queue_id: int) -> int:
        return self._store.min_offset(topic, queue_id)

    async def settle(self, timeout: float = 10.0) -> None:
        store = self._store
        if store.is_open:
            await self._bridge.call(store.wait_for_dispatch, timeout)


class ReplicationGate(Protocol):
    """What the send and pull paths ask of replication (docs/ha.md; ``orbitmq.broker.ha``)."""

    def check_send(self) -> None:
        """Raise before anything is stored if this broker may not take a send now (a slave:
        NoPermissionError; sync mode below min_in_sync_replicas: ServiceNotAvailableError)."""
        ...

    def check_read(self) -> None:
        """Raise NoPermissionError if this broker serves no reads (a slave without
        slave_read_enable)."""
        ...

    async def wait_replicated(self, end_offset: int) -> None:
        """Return once the bytes before ``end_offset`` are as replicated as the mode asks
        (sync: on every in-sync slave; FlushSlaveTimeoutError after slave_timeout_ms)."""
        ...


class NoReplication:
    """A broker without replicas: every send and read is allowed, nothing is waited for."""

    def check_send(self) -> None:
        return None

    def check_read(self) -> None:
        return None

    async def wait_replicated(self, end_offset: int) -> None:
        return None


def _read_records(store: MessageStore, physical_offsets: list[int]) -> list[bytes | None]:
    """On a reader thread: copies (the views' segment may be unmapped by retention later)."""
    out: list[bytes | None] = []
    for p in physical_offsets:
        view = store.read_record(p)
        out.append(bytes(view) if view is not None else None)
    return out


@dataclass(frozen=True, slots=True, eq=False)
class BrokerContext:
    """The broker's shared parts. Frozen: a service cannot swap one for the others."""

    config: BrokerConfig
    store: MessageStore
    """The message store, for reads on the event loop (tail reads, offsets, stats)."""
    bridge: StoreBridge
    """Appends (one writer thread, durable per the flush mode) and reads off the loop."""
    log: SystemLog
    topics: TopicConfigManager
    offsets: ConsumerOffsetManager
    groups: SubscriptionGroupManager
    """Consumer-group configs (retry policy, DLQ limit): ``groups.get(g)``."""
    consumers: ConsumerManager
    locks: LockManager
    metrics: BrokerMetrics
    clock: Clock
    topics_changed: Callable[[], None]
    """Register with the NameServers again soon (a topic was made, changed or deleted)."""
    apply_retention: Callable[[TopicConfig], None]
    """Give the store a topic's retention (after the topic is made or changed)."""
    writable: Callable[[], bool]
    """Whether the broker accepts writes now (False: every write is NO_PERMISSION)."""
    replication: ReplicationGate = NoReplication()
    """The send path's replication checks and ack wait (docs/ha.md)."""
    journal: Journal | None = None
    """The metadata log (replicated brokers only; docs/ha.md, "Metadata replication")."""

    def check_metadata_change(self) -> None:
        """Raise before a client's metadata change on a broker that takes none (a slave:
        NO_PERMISSION, as its sends; sync mode short of in-sync replicas)."""
        self.replication.check_send()

    def metadata_writable(self) -> bool:
        """Whether this broker changes metadata on its own (False on a slave, whose managers
        follow its master's records only: a piggy-backed commit there is dropped)."""
        return self.journal is None or self.journal.active

    async def metadata_logged(self) -> None:
        """Return once every metadata change made so far is logged and replicated as the
        mode asks (a broker without replicas: at once)."""
        if self.journal is not None:
            await self.journal.sync()

    def file_written(self, name: str, data: bytes) -> None:
        """A service wrote one of the replicated files of ``<store>/config`` (the Pop secret,
        the revive, timer and transaction checkpoints): log it for the replicas."""
        if self.journal is not None and name in REPLICATED_FILES:
            self.journal.record(FilePut(name=name, data=data))

    def topic_created(self, config: TopicConfig) -> None:
        """A topic the broker made itself (DLQ, retry, system): retention, then registration."""
        self.apply_retention(config)
        self.topics_changed()

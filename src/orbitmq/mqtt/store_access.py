"""StoreAccess: what the MQTT gateway asks of the broker it runs in, in one narrow object.

The gateway is a service beside the broker in the same process and event loop (as the local
gRPC proxy is), but unlike the proxy it does not speak Remoting to it: it appends through the
broker's :class:`~orbitmq.broker.store_bridge.StoreBridge` (the same writer thread, group
commit, flush and replication waits as a native send), reads the ConsumeQueues on the bridge's
reader threads (or, for the records a dispatch round just made readable, from what that round
holds: ``read_recent``), and hears arrivals from the store's dispatcher. Everything it needs is
here, so the rest of the package never touches a broker attribute.
"""

from __future__ import annotations

from collections.abc import Callable

from orbitmq.auth.server import ServerAuth
from orbitmq.broker.controller import BrokerController
from orbitmq.common.errors import NoPermissionError, TopicNotExistError
from orbitmq.common.message import MessageBatch
from orbitmq.common.record import StoredMessage, decode
from orbitmq.mqtt.mapping import is_user_topic
from orbitmq.protocol.bodies import PERM_READ, PERM_WRITE
from orbitmq.store.message_store import MessageStore

READ_BATCH = 64
RECENT_MAX_BYTES = 4 * 1024 * 1024
TAIL_READ = 4 * READ_BATCH
"""A read this close to the queue's end runs on the event loop, not on the read pool."""


def _read(
    store: MessageStore, topic: str, queue_id: int, offset: int, count: int
) -> tuple[list[StoredMessage], int]:
    """On a reader thread: up to ``count`` decoded messages from ``offset`` and the next offset."""
    result = store.get_messages(topic, queue_id, offset, count)
    msgs = [decode(view) for view in result.messages]
    nxt = result.next_begin_offset
    if not msgs and nxt <= offset and result.max_offset > offset:
        nxt = max(offset, result.min_offset)  # a hole (retention) before the first kept record
    return msgs, nxt


class StoreAccess:
    def __init__(self, broker: BrokerController) -> None:
        self._broker = broker
        self.store = broker.store
        self.store_path = broker.config.store.store_path

    def server_auth(self) -> ServerAuth | None:
        """The broker's users, policies and audit log (its guard is None when auth is off)."""
        return self._broker.auth

    def queues(self, topic: str) -> int:
        """The topic's read queue count, 0 when it does not exist or is not readable."""
        config = self._broker.topics.get(topic)
        if config is None or not config.perm & PERM_READ:
            return 0
        return int(config.read_queue_nums)

    def user_topics(self) -> list[str]:
        return [t for t in self._broker.topics.topics if is_user_topic(t)]

    def write_queues(self, topic: str, create: bool) -> int:
        """The topic's write queue count, creating the topic when ``create``; raises
        TopicNotExistError / NoPermissionError."""
        config = self._broker.topics.get(topic)
        if config is None:
            if not create:
                raise TopicNotExistError(f"topic {topic} does not exist on this broker")
            config = self._broker.topics.auto_create(topic)
            self._broker.topics_changed()
        if not config.perm & PERM_WRITE or not self._broker.writable:
            raise NoPermissionError(f"topic {topic} is not writable here")
        return int(config.write_queue_nums)

    async def append(
        self, topic: str, queue_id: int, bodies: list[bytes], props: list[bytes], born_ms: int,
        born_host: tuple[str, int],
    ) -> None:  # fmt: skip
        """Store messages (one batch, in order) as a native send would; returns once they
        are as durable as the broker's flush and replication modes ask."""
        self._broker.ctx.replication.check_send()
        batch = MessageBatch(
            topic, queue_id, bodies, props, born_timestamp_ms=born_ms, born_host=born_host
        )
        result = await self._broker.bridge.put(batch)
        await self._broker.ctx.replication.wait_replicated(result.end_offset)
        self._broker.metrics.messages_in.inc(len(bodies))
        self._broker.metrics.bytes_in.inc(sum(map(len, bodies)))

    async def read(
        self, topic: str, queue_id: int, offset: int, count: int = READ_BATCH
    ) -> tuple[list[StoredMessage], int]:
        store = self.store
        tier = store.tier
        if store.max_offset(topic, queue_id) - offset <= TAIL_READ and (
            tier is None or not tier.wants(topic, queue_id, offset)
        ):
            # Near the tail the records are in the page cache: reading here costs less than
            # the two thread hand-offs (and GIL switches) of the read pool, as for pulls.
            msgs, nxt = _read(store, topic, queue_id, offset, count)
        else:
            msgs, nxt = await self._broker.bridge.read(_read, store, topic, queue_id, offset, count)
        if msgs:
            self._broker.metrics.messages_out.inc(len(msgs))
        return msgs, nxt

    def read_recent(
        self, topic: str, queue_id: int, offset: int, count: int = READ_BATCH
    ) -> tuple[list[StoredMessage], int] | None:
        """Inside a dispatch round, on its thread: the messages from ``offset`` that this round
        made readable, cut from the CommitLog where the append wrote them (no ConsumeQueue
        read-back, no reader thread), and the next offset. None when the round cannot answer
        exactly as a read would (``MessageStore.read_told``: the offset is behind the round's
        records, encryption at rest, tiered storage, a TTL cut): read instead. The round only
        covers records up to the replication confirm offset, as every read does."""
        result = self.store.read_told(topic, queue_id, offset, count, RECENT_MAX_BYTES)
        if result is None:
            return None
        msgs = [decode(view) for view in result.messages]
        if msgs:
            self._broker.metrics.messages_out.inc(len(msgs))
        return msgs, result.next_begin_offset

    async def read_one(self, topic: str, queue_id: int, offset: int) -> StoredMessage | None:
        msgs, _ = await self.read(topic, queue_id, offset, 1)
        return msgs[0] if msgs and msgs[0].queue_offset == offset else None

    def add_arrival_listener(self, listener: Callable[[str, int, int], None]) -> None:
        self.store.add_arrival_listener(listener)

    def remove_arrival_listener(self, listener: Callable[[str, int, int], None]) -> None:
        listeners = self.store.dispatcher.listeners
        if listener in listeners:
            listeners.remove(listener)

    def max_offset(self, topic: str, queue_id: int) -> int:
        return int(self.store.max_offset(topic, queue_id))

"""Markers: the durable record of which half batches of a Spark micro-batch are committed.

A marker is a keyed message of a dedicated topic (:data:`DEFAULT_MARKER_TOPIC`, one queue per
master, created on first use), keyed ``<queryId>:<batchId>`` and found through the broker's key
index, so it is as durable as any message and needs no new server feature. This module holds
what markers are and where they live: :class:`HalfRef` (one half batch), :class:`Marker` (the
chosen halves, as JSON), :class:`MarkerStore` (find and write them), and
:class:`MarkerChecker`, which answers the broker's transaction check-backs from them.

The protocol that writes markers and then commits (:func:`orbitmq.spark.commit.commit_batch`)
is in :mod:`orbitmq.spark.commit`; nothing here imports pyspark.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from orbitmq.client import _codec
from orbitmq.client.admin.client import AsyncAdminClient
from orbitmq.client.producer.producer import AsyncProducer
from orbitmq.client.producer.types import SendStatus
from orbitmq.client.transaction.types import HalfBatchResult, LocalTransactionState
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import ClientError, MQError, error_for
from orbitmq.common.message import Message
from orbitmq.common.record import StoredMessage
from orbitmq.protocol.messages import decode_records
from orbitmq.protocol.requests import QueryMessageRequest

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MARKER_TOPIC",
    "PROPERTY_ATTEMPT",
    "PROPERTY_BATCH",
    "PROPERTY_MARKER_TOPIC",
    "PROPERTY_QUERY",
    "RETRY_PAUSE_S",
    "HalfRef",
    "Marker",
    "MarkerChecker",
    "MarkerStore",
    "MarkerStoreFactory",
    "SinkCommitError",
    "attempt_id",
    "marker_key",
]

DEFAULT_MARKER_TOPIC = "OrbitMQSparkCommits"
PROPERTY_QUERY = "SPARK_QUERY"
"""Batch-level property of every half: the Spark query id (stable across restarts)."""
PROPERTY_BATCH = "SPARK_BATCH"
PROPERTY_ATTEMPT = "SPARK_ATTEMPT"
"""``<partition>.<attemptNumber>.<taskAttemptId>``: which task attempt wrote the half."""
PROPERTY_MARKER_TOPIC = "SPARK_MARKERS"
"""Where the marker of the half's batch lives, so any checker of the group can answer."""

_MARKER_VERSION = 1
RETRY_PAUSE_S = 0.2
"""Pause between retries of a marker lookup, write or decision."""


class SinkCommitError(ClientError):
    """The sink could not commit a micro-batch: names the query, the batch and why."""


def marker_key(query_id: str, batch_id: int) -> str:
    return f"{query_id}:{batch_id}"


@dataclass(frozen=True, slots=True)
class HalfRef:
    """One half batch as the protocol needs it: where it is and its transaction id. The broker
    is kept by name (its address may change across a restart); ``broker_addr`` is a hint."""

    broker_name: str
    offset: int
    transaction_id: str
    topic: str
    queue_id: int
    count: int
    broker_addr: str = ""
    writer: str = field(default="", compare=False)
    """Which task attempt sent it (halves of one writer and queue are committed in the order
    they were sent); not part of the marker."""

    @classmethod
    def of(cls, hb: HalfBatchResult, writer: str = "") -> HalfRef:
        return cls(
            hb.broker_name,
            hb.offset,
            hb.transaction_id,
            hb.topic,
            hb.queue_id,
            hb.count,
            hb.broker_addr,
            writer,
        )

    def as_result(self) -> HalfBatchResult:
        """What ``end_many`` takes."""
        return HalfBatchResult(
            topic=self.topic,
            queue_id=self.queue_id,
            broker_name=self.broker_name,
            broker_addr=self.broker_addr,
            offset=self.offset,
            queue_offset=-1,
            transaction_id=self.transaction_id,
            count=self.count,
            msg_ids=(),
            status=SendStatus.SEND_OK,
        )

    def as_json(self) -> list[Any]:
        return [
            self.broker_name,
            self.offset,
            self.transaction_id,
            self.topic,
            self.queue_id,
            self.count,
        ]

    @classmethod
    def from_json(cls, item: Any) -> HalfRef:
        if not isinstance(item, list) or len(item) != 6:
            raise ValueError(f"half entry {item!r}")
        broker, offset, txid, topic, qid, count = item
        if not (
            isinstance(broker, str)
            and isinstance(txid, str)
            and isinstance(topic, str)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in (offset, qid, count))
        ):
            raise ValueError(f"half entry {item!r}")
        return cls(broker, offset, txid, topic, qid, count)


@dataclass(frozen=True, slots=True)
class Marker:
    """The durable choice for one micro-batch: exactly these halves are (to be) committed."""

    query_id: str
    batch_id: int
    halves: tuple[HalfRef, ...]
    attempts: tuple[str, ...] = ()
    rows: int = 0
    chosen: frozenset[str] = field(default=frozenset(), compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "chosen", frozenset(h.transaction_id for h in self.halves))

    @property
    def key(self) -> str:
        return marker_key(self.query_id, self.batch_id)

    def encode(self) -> bytes:
        doc = {
            "v": _MARKER_VERSION,
            "query": self.query_id,
            "batch": self.batch_id,
            "rows": self.rows,
            "attempts": list(self.attempts),
            "halves": [h.as_json() for h in self.halves],
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, body: bytes) -> Marker:
        """ValueError for anything that is not a marker this code wrote."""
        try:
            doc = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"marker body is not JSON: {exc}") from None
        if not isinstance(doc, dict) or doc.get("v") != _MARKER_VERSION:
            raise ValueError("not a version-1 marker")
        query, batch, rows = doc.get("query"), doc.get("batch"), doc.get("rows", 0)
        attempts, halves = doc.get("attempts", []), doc.get("halves")
        if not isinstance(query, str) or not isinstance(batch, int) or not isinstance(rows, int):
            raise ValueError("marker lacks query/batch")
        if not isinstance(halves, list) or not isinstance(attempts, list):
            raise ValueError("marker lacks halves")
        return cls(
            query,
            batch,
            tuple(HalfRef.from_json(h) for h in halves),
            tuple(str(a) for a in attempts),
            rows,
        )


class MarkerStore:
    """Markers as keyed messages of ``topic``, looked up through the key index."""

    def __init__(self, admin: AsyncAdminClient, producer: AsyncProducer, topic: str) -> None:
        self.admin = admin
        self.producer = producer
        self.topic = topic
        self._ready = False
        self._lock = asyncio.Lock()

    async def ensure_topic(self) -> None:
        """Create the marker topic (one queue on every master) if no NameServer routes it."""
        if self._ready:
            return
        async with self._lock:
            try:
                await self.admin.queues(self.topic, writable=True)
            except MQError:
                await self.admin.create_topic(self.topic, read_queue_nums=1, write_queue_nums=1)
                deadline = time.monotonic() + 15.0
                while True:
                    try:
                        if await self.admin.queues(self.topic, writable=True):
                            break
                    except MQError:
                        if time.monotonic() > deadline:
                            raise
                    await asyncio.sleep(RETRY_PAUSE_S)
            self._ready = True

    async def find(self, query_id: str, batch_id: int, *, strict: bool) -> Marker | None:
        """The marker of (query, batch), or None. ``strict``: raise unless every broker of the
        marker topic answered (a None must then mean "written nowhere"). Several markers for
        one key (a retried write) hold the same halves; the oldest stored one wins."""
        key = marker_key(query_id, batch_id)
        # A strict lookup must know every broker of the topic now; others may use the cache.
        routes = self.admin.routes
        info = await (routes.refresh(self.topic) if strict else routes.get(self.topic))
        if info.route is None or not info.broker_addrs:
            if strict:
                raise ClientError(f"marker topic {self.topic!r} has no route")
            return None
        query = QueryMessageRequest(topic=self.topic, key=key, max_num=16)
        ok = {ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND}

        async def ask(addr: str) -> list[StoredMessage]:
            frame = query.frame()  # a fresh frame per broker: the opaque is the connection's
            resp = await self.admin.remoting.invoke(addr, frame, self.admin.timeout_s)
            if resp.code not in ok:
                raise error_for(resp.code, resp.remark)
            if resp.code != ResponseCode.SUCCESS or not resp.body:
                return []
            return decode_records(memoryview(resp.body))

        addrs = sorted(set(info.broker_addrs.values()))
        answers = await asyncio.gather(*(ask(a) for a in addrs), return_exceptions=True)
        found: list[StoredMessage] = []
        for addr, ans in zip(addrs, answers, strict=True):
            if isinstance(ans, BaseException):
                if not isinstance(ans, MQError):
                    raise ans
                if strict:
                    raise ClientError(f"marker lookup on {addr} failed: {ans}") from ans
                log.info("marker lookup on %s failed: %s", addr, ans)
                continue
            found.extend(ans)
        markers: list[tuple[int, int, Marker]] = []
        for rec in found:
            if rec.topic != self.topic or key not in rec.keys:
                continue  # the index is a hint: hash collisions
            try:
                marker = Marker.decode(_plain_body(rec))
            except ValueError as exc:
                log.warning("unreadable marker at offset %s: %s", rec.physical_offset, exc)
                continue
            if marker.key == key:
                markers.append((rec.store_timestamp_ms, rec.physical_offset, marker))
        if not markers:
            return None
        return min(markers, key=lambda m: (m[0], m[1]))[2]

    async def write(self, marker: Marker, deadline: float) -> None:
        """Store the marker durably (retrying failed sends, and sends not answered SEND_OK,
        with the same content until ``deadline``, a loop time). A retry after a lost answer may
        store it twice: same halves, so harmless."""
        await self.ensure_topic()
        queues = await self.admin.queues(self.topic, writable=True)
        if not queues:
            raise ClientError(f"marker topic {self.topic!r} has no writable queue")
        loop = asyncio.get_running_loop()
        body = marker.encode()
        last: MQError | None = None
        while True:
            msg = Message(self.topic, body, keys=[marker.key])
            try:
                result = await self.producer.send(msg)
            except MQError as exc:
                last = exc
            else:
                if result.status is SendStatus.SEND_OK:
                    return
                # Stored on the master only (FLUSH_SLAVE_TIMEOUT) or not yet durable: a
                # failover could lose it after the halves it names were committed, so a
                # replay would choose again. Write it again (same halves: harmless).
                log.warning("marker %s stored as %s; writing it again", marker.key,
                            result.status.value)  # fmt: skip
                last = ClientError(f"marker {marker.key} stored as {result.status.value}")
            if loop.time() > deadline:
                raise SinkCommitError(f"could not write marker {marker.key}: {last}") from last
            await asyncio.sleep(RETRY_PAUSE_S)


def _plain_body(rec: StoredMessage) -> bytes:
    return _codec.plain(rec).body


class MarkerChecker:
    """Answers the broker's check-backs for the sink's producer group from the markers.

    In the marker: COMMIT. A marker exists without it: ROLLBACK. No marker (not written yet,
    the lookup failed, not a sink half): UNKNOWN, so the broker asks again later. Found
    markers are cached: they never change.
    """

    def __init__(self, stores: MarkerStoreFactory | None = None, *, cache_size: int = 1024) -> None:
        self.stores = stores
        """Set before the producer starts (the factory needs the producer, which needs this)."""
        self._cache: OrderedDict[tuple[str, str, int], Marker] = OrderedDict()
        self._cache_size = cache_size
        self.answers: dict[str, int] = {"COMMIT": 0, "ROLLBACK": 0, "UNKNOWN": 0}

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN  # the sink never uses send_in_transaction

    async def check_local_transaction(self, msg: StoredMessage) -> LocalTransactionState:
        state = await self._check(msg)
        self.answers[state.value] += 1
        return state

    async def _check(self, msg: StoredMessage) -> LocalTransactionState:
        props = msg.properties
        query, batch_raw = props.get(PROPERTY_QUERY), props.get(PROPERTY_BATCH)
        topic = props.get(PROPERTY_MARKER_TOPIC, DEFAULT_MARKER_TOPIC)
        txid = msg.msg_id
        if not query or not batch_raw or not txid:
            return LocalTransactionState.UNKNOWN
        try:
            batch = int(batch_raw)
        except ValueError:
            return LocalTransactionState.UNKNOWN
        cache_key = (topic, query, batch)
        marker = self._cache.get(cache_key)
        if marker is None:
            if self.stores is None:
                return LocalTransactionState.UNKNOWN
            try:
                marker = await self.stores(topic).find(query, batch, strict=False)
            except MQError as exc:
                log.info("check-back of %s: marker lookup failed: %s", txid, exc)
                return LocalTransactionState.UNKNOWN
            if marker is None:
                return LocalTransactionState.UNKNOWN
            self._cache[cache_key] = marker
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        if txid in marker.chosen:
            return LocalTransactionState.COMMIT
        return LocalTransactionState.ROLLBACK


class MarkerStoreFactory:
    """Marker stores by topic (a check-back names its batch's marker topic), sharing one admin
    client and producer."""

    def __init__(
        self, admin: AsyncAdminClient, producer: AsyncProducer, default_topic: str
    ) -> None:
        self.admin = admin
        self.producer = producer
        self._stores: dict[str, MarkerStore] = {}
        self.default = self(default_topic)

    def __call__(self, topic: str) -> MarkerStore:
        store = self._stores.get(topic)
        if store is None:
            store = self._stores[topic] = MarkerStore(self.admin, self.producer, topic)
        return store


def attempt_id(partition: int, attempt_number: int, task_attempt_id: int) -> str:
    return f"{partition}.{attempt_number}.{task_attempt_id}"

"""The write side of the ``orbitmq`` format: ``df.write`` and ``df.writeStream``.

Columns (anything else fails at query start, naming the column):

=================  ============================  =============================================
column             type                          becomes
=================  ============================  =============================================
``value``          binary or string (required)   the body (null or empty: the task fails)
``topic``          string                        the topic; the ``topic`` option overrides it
``key``            binary or string              KEYS; also picks the queue (CRC32C % queues)
``tags``           string                        TAGS
``properties``     map<string,string>            user properties
``queue_id``       integer                       that queue (with ``broker`` when several hold it)
``broker``         string                        the broker of ``queue_id``
``delay``          integer (ms)                  TIMER_DELAY_MS (at-least-once only)
``delivery_time``  timestamp                     TIMER_DELIVER_MS (at-least-once only)
=================  ============================  =============================================

Rows with neither ``queue_id`` nor ``key`` go to the topic's queues in turn, a run of up to
``maxBatchMessages`` rows at a time, so each send is one large batch.

Streaming writes are exactly-once per micro-batch (``deliveryGuarantee=exactlyOnce``, the
default): each task sends its rows as transactional half batches, and the driver commits the
micro-batch's halves through :mod:`orbitmq.spark.commit`. Batch writes send plain batches and
are at-least-once (a retried task sends its rows again); ``deliveryGuarantee=exactlyOnce`` on a
batch write makes the job all-or-nothing (a failed job leaves nothing visible), still not
idempotent across re-runs of the job.

Spark makes a new stream writer for the tasks of every micro-batch and another for its commit,
so writers hold only their parsed options; identity comes from ``TaskContext`` (query id,
batch id, attempt) and connections from a per-process cache (workers are reused).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampType,
)

from orbitmq.client._loop_thread import LoopThread
from orbitmq.client.admin.client import AsyncAdminClient
from orbitmq.client.route import MessageQueue, TopicPublishInfo
from orbitmq.client.transaction.producer import AsyncTransactionProducer
from orbitmq.client.transaction.types import HalfBatchResult, TransactionConfig
from orbitmq.common.errors import ClientError, MQError
from orbitmq.common.message import (
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_UNIQ_KEY,
    Message,
    decode_properties,
)
from orbitmq.common.validation import DEFAULT_MAX_MESSAGE_SIZE, DEFAULT_MAX_PROPERTIES_SIZE
from orbitmq.spark import commit as protocol
from orbitmq.spark.commit import HalfRef, MarkerChecker, MarkerStoreFactory
from orbitmq.spark.options import (
    OptionError,
    get_duration_ms,
    get_int,
    normalize,
    reject_unknown,
)

if TYPE_CHECKING:
    from pyspark import TaskContext

log = logging.getLogger(__name__)

__all__ = [
    "SINK_COLUMNS",
    "SINK_OPTIONS",
    "OrbitMQBatchWriter",
    "OrbitMQStreamWriter",
    "SinkCommitMessage",
    "SinkOptions",
    "batch_writer",
    "parse_sink_options",
    "stream_writer",
]

SINK_OPTIONS = (
    "namesrv",
    "topic",
    "producerGroup",
    "deliveryGuarantee",
    "markerTopic",
    "maxBatchMessages",
    "maxBatchBytes",
    "sendTimeout",
    "commitTimeout",
    "path",  # save(path) arrives as an option: refused below when set
    "checkpointLocation",  # Spark's own options, passed through to every sink: ignored
    "queryName",
)
DEFAULT_PRODUCER_GROUP = "orbitmq-spark-sink"
EXACTLY_ONCE = "exactlyOnce"
AT_LEAST_ONCE = "atLeastOnce"
_MAX_IN_FLIGHT = 16
"""Sends a task keeps in flight while it converts the next rows."""
_RESERVED_PROPERTIES = frozenset(
    {
        PROPERTY_UNIQ_KEY,
        "TRAN_MSG",
        "PGROUP",
        "REAL_TOPIC",
        "REAL_QID",
        "TRAN_BATCH",
        protocol.PROPERTY_QUERY,
        protocol.PROPERTY_BATCH,
        protocol.PROPERTY_ATTEMPT,
        protocol.PROPERTY_MARKER_TOPIC,
    }
)


# ---------------------------------------------------------------------------------- options


@dataclass(frozen=True, slots=True)
class SinkOptions:
    namesrv: str
    topic: str | None
    group: str
    exactly_once: bool
    marker_topic: str
    max_batch_messages: int
    max_batch_bytes: int
    send_timeout_s: float
    commit_timeout_s: float


def parse_sink_options(options: Mapping[str, str], *, streaming: bool) -> SinkOptions:
    """Parse and check the write options; OptionError naming the option otherwise."""
    opts = normalize(options)
    reject_unknown(opts, SINK_OPTIONS, "sink")
    if opts.get("path"):
        raise OptionError("option path: the orbitmq sink writes to topics (use option topic)")
    namesrv = opts.get("namesrv", "").strip()
    if not namesrv:
        raise OptionError("option namesrv is required (NameServer host:port, ';' between several)")
    topic = opts.get("topic")
    if topic is not None and not topic.strip():
        raise OptionError("option topic is empty")
    guarantee = opts.get("deliveryguarantee", EXACTLY_ONCE if streaming else AT_LEAST_ONCE)
    by_lower = {EXACTLY_ONCE.lower(): True, AT_LEAST_ONCE.lower(): False}
    if guarantee.strip().lower() not in by_lower:
        raise OptionError(
            f"option deliveryGuarantee={guarantee!r}: expected {EXACTLY_ONCE} or {AT_LEAST_ONCE}"
        )
    max_msgs = get_int(opts, "maxBatchMessages", 1000, lo=1)
    max_bytes = get_int(opts, "maxBatchBytes", 1024 * 1024, lo=1024)
    assert max_msgs is not None and max_bytes is not None
    if max_bytes > DEFAULT_MAX_MESSAGE_SIZE - 64 * 1024:
        raise OptionError(
            f"option maxBatchBytes={max_bytes}: at most {DEFAULT_MAX_MESSAGE_SIZE - 64 * 1024} "
            "(a half batch is one message on the broker)"
        )
    send_ms = get_duration_ms(opts, "sendTimeout", 10_000)
    commit_ms = get_duration_ms(opts, "commitTimeout", 60_000)
    if send_ms <= 0 or commit_ms <= 0:
        raise OptionError("options sendTimeout and commitTimeout must be > 0")
    group = opts.get("producergroup", DEFAULT_PRODUCER_GROUP).strip()
    if not group:
        raise OptionError("option producerGroup is empty")
    return SinkOptions(
        namesrv=namesrv,
        topic=topic.strip() if topic else None,
        group=group,
        exactly_once=by_lower[guarantee.strip().lower()],
        marker_topic=opts.get("markertopic", protocol.DEFAULT_MARKER_TOPIC).strip(),
        max_batch_messages=max_msgs,
        max_batch_bytes=max_bytes,
        send_timeout_s=send_ms / 1000.0,
        commit_timeout_s=commit_ms / 1000.0,
    )


# ---------------------------------------------------------------------------------- columns

_INTEGRAL = (ByteType, ShortType, IntegerType, LongType)
SINK_COLUMNS: dict[str, tuple[tuple[type[DataType], ...], str]] = {
    "value": ((BinaryType, StringType), "binary or string"),
    "topic": ((StringType,), "string"),
    "key": ((BinaryType, StringType), "binary or string"),
    "tags": ((StringType,), "string"),
    "properties": ((MapType,), "map<string,string>"),
    "queue_id": (_INTEGRAL, "an integer type"),
    "broker": ((StringType,), "string"),
    "delay": (_INTEGRAL, "an integer type (milliseconds)"),
    "delivery_time": ((TimestampType,), "timestamp"),
}


def check_columns(schema: StructType, opts: SinkOptions) -> tuple[str, ...]:
    """The columns to write, checked against :data:`SINK_COLUMNS`; OptionError naming the
    first offending column otherwise (Kafka's ``validateQuery``, stricter: an unknown column is
    refused rather than ignored, so a typo such as ``vaule`` cannot silently drop data)."""
    names: list[str] = []
    for f in schema.fields:
        name = f.name
        if name not in SINK_COLUMNS:
            raise OptionError(
                f"column {name!r} is not a sink column (expected some of: "
                f"{', '.join(SINK_COLUMNS)}); select() only the columns to write"
            )
        types, text = SINK_COLUMNS[name]
        dt = f.dataType
        ok = isinstance(dt, types)
        if ok and isinstance(dt, MapType):
            ok = isinstance(dt.keyType, StringType) and isinstance(dt.valueType, StringType)
        if not ok:
            raise OptionError(f"column {name!r} is {dt.simpleString()}, expected {text}")
        names.append(name)
    if "value" not in names:
        raise OptionError("column 'value' is required (binary or string): the message body")
    if "topic" not in names and opts.topic is None:
        raise OptionError("no topic: set option topic or give a 'topic' column")
    if "broker" in names and "queue_id" not in names:
        raise OptionError("column 'broker' needs a 'queue_id' column")
    if "delay" in names and "delivery_time" in names:
        raise OptionError("columns 'delay' and 'delivery_time' exclude each other")
    if opts.exactly_once:
        for timer in ("delay", "delivery_time"):
            if timer in names:
                raise OptionError(
                    f"column {timer!r} needs option deliveryGuarantee={AT_LEAST_ONCE}: "
                    "transactional messages cannot be delayed"
                )
    return tuple(names)


# ---------------------------------------------------------------------------------- clients


@dataclass
class _Clients:
    """One process's connections for one (namesrv, group, marker topic): reused by every task
    and commit the process runs (Spark reuses Python workers)."""

    thread: LoopThread
    tx: AsyncTransactionProducer
    admin: AsyncAdminClient
    stores: MarkerStoreFactory
    checker: MarkerChecker
    next_queue: itertools.count[int]


_CLIENTS: dict[tuple[str, str, str, float], _Clients] = {}
_CLIENTS_LOCK = threading.Lock()
_CLIENTS_PID = os.getpid()


def _clients(opts: SinkOptions) -> _Clients:
    """The process's clients for these options, made on first use. A forked child starts with
    none (the parent's loop thread does not exist in it)."""
    global _CLIENTS_PID
    key = (opts.namesrv, opts.group, opts.marker_topic, opts.send_timeout_s)
    with _CLIENTS_LOCK:
        if os.getpid() != _CLIENTS_PID:
            _CLIENTS.clear()
            _CLIENTS_PID = os.getpid()
        found = _CLIENTS.get(key)
        if found is not None:
            return found
        thread = LoopThread("orbitmq-spark-sink")
        try:
            made = thread.run(_make_clients(opts, thread))
        except BaseException:
            thread.stop()
            raise
        _CLIENTS[key] = made
        return made


async def _make_clients(opts: SinkOptions, thread: LoopThread) -> _Clients:
    checker = MarkerChecker()
    # The producer heartbeats its group to the marker topic's brokers (every master) from the
    # start, so this process answers check-backs: this is the sink's transaction checker.
    tx = AsyncTransactionProducer(
        opts.namesrv,
        opts.group,
        checker,
        TransactionConfig(
            send_timeout_s=opts.send_timeout_s,
            batch_max_bytes=max(opts.max_batch_bytes, 1024 * 1024),
        ),
        topics=[opts.marker_topic],
    )
    admin = AsyncAdminClient(opts.namesrv)
    stores = MarkerStoreFactory(admin, tx.producer, opts.marker_topic)
    checker.stores = stores
    try:
        await stores.default.ensure_topic()
        await tx.start()
    except BaseException:
        await tx.close()
        await admin.close()
        raise
    start = int.from_bytes(os.urandom(2), "big")
    return _Clients(thread, tx, admin, stores, checker, itertools.count(start))


# ---------------------------------------------------------------------------------- rows


class _Ids:
    """Unique message ids (UNIQ_KEY) for a whole record batch at once, in RocketMQ's 32-hex
    shape: 20 hex digits of creator (IPv4, pid, random, as orbitmq.common.ids) then a 48-bit
    sequence that starts at the milliseconds since the month's start << 16 and only grows, so
    ids stay unique in the process however many rows a millisecond sees (the client's
    generator allows 65,536 per millisecond; one record batch can hold more)."""

    _HEX = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)

    def __init__(self) -> None:
        self._pid = -1
        self._prefix = np.zeros(20, dtype=np.uint8)
        self._next = 0
        self._month = (0, 0)
        self._lock = threading.Lock()

    def _reset(self) -> None:
        """New creator digits in each process (a forked worker must not repeat its parent)."""
        try:
            ip = socket.inet_aton(socket.gethostbyname(socket.gethostname()))
        except OSError:
            ip = b"\x7f\x00\x00\x01"
        head = ip + (os.getpid() & 0xFFFF).to_bytes(2, "big") + os.urandom(4)
        self._prefix = np.frombuffer(head.hex().upper().encode(), dtype=np.uint8)
        self._pid = os.getpid()
        self._next = 0

    def _month_offset(self, now_ms: int) -> int:
        start, end = self._month
        if not start <= now_ms < end:
            now = datetime.fromtimestamp(now_ms / 1000, UTC)
            first = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
            nxt = first.replace(year=first.year + (first.month == 12), month=first.month % 12 + 1)
            self._month = (int(first.timestamp() * 1000), int(nxt.timestamp() * 1000))
        return now_ms - self._month[0]

    def take(self, n: int) -> pa.Array:
        """``n`` ids as a binary array (fixed 32 bytes each)."""
        now = time.time_ns() // 1_000_000
        with self._lock:
            if self._pid != os.getpid():
                self._reset()
            start = max(self._next, (self._month_offset(now) & 0xFFFFFFFF) << 16)
            self._next = start + n
        seq = np.arange(start, start + n, dtype=np.uint64) & np.uint64(0xFFFFFFFFFFFF)
        shifts = np.arange(44, -4, -4, dtype=np.uint64)
        nibbles = (seq[:, None] >> shifts[None, :]) & np.uint64(0xF)
        chars = np.empty((n, 32), dtype=np.uint8)
        chars[:, :20] = self._prefix
        chars[:, 20:] = self._HEX[nibbles.astype(np.intp)]
        offsets = np.arange(0, 32 * n + 1, 32, dtype=np.int32)
        return pa.Array.from_buffers(
            pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(chars.tobytes())]
        )


_IDS = _Ids()


def _prop(name: str, values: pa.Array) -> pa.Array:
    """``name\\x01value\\x02`` per row; "" where the value is null."""
    joined = pc.binary_join_element_wise(
        pa.scalar(f"{name}\x01".encode()), values, pa.scalar(b"\x02"), b"",
        null_handling="emit_null",
    )  # fmt: skip
    return joined.fill_null(b"")


def _as_binary(arr: pa.Array) -> pa.Array:
    if pa.types.is_binary(arr.type):
        return arr
    return arr.cast(pa.binary())


def _buffer_of(arr: pa.Array) -> tuple[np.ndarray, bytes]:
    """The lengths and the concatenated bytes of a binary array (any offset/slice)."""
    offsets = np.frombuffer(
        arr.buffers()[1], dtype=np.int32, count=len(arr) + 1, offset=4 * arr.offset
    )
    data = arr.buffers()[2]
    lo, hi = int(offsets[0]), int(offsets[-1])
    raw = data[lo:hi].to_pybytes() if data is not None else b""
    return np.diff(offsets), raw


@dataclass(slots=True)
class _Run:
    """Rows of one record batch bound for one queue (``queue`` None: the producer picks)."""

    topic: str
    queue: MessageQueue | None
    rows: np.ndarray | range


class _Prepared:
    """One record batch made ready to send: bodies and fully encoded properties (with each
    row's unique id) as Arrow arrays, built column-wise, so a send of n rows costs a take and
    a join, not n Python objects."""

    def __init__(self, rb: pa.RecordBatch, topic_option: str | None) -> None:
        n = self.n = rb.num_rows
        cols = self.cols = {name: rb.column(name) for name in rb.schema.names}
        value = _as_binary(cols["value"])
        lengths = pc.binary_length(value)
        if value.null_count or pc.min(lengths).as_py() == 0:
            bad = _first(pc.or_kleene(pc.is_null(value), pc.equal(lengths, 0)))
            raise ClientError(f"column 'value' is null or empty in row {bad} of a record batch")
        if pc.max(lengths).as_py() > DEFAULT_MAX_MESSAGE_SIZE:
            raise ClientError(f"column 'value': a body is over {DEFAULT_MAX_MESSAGE_SIZE} bytes")
        self.value = value
        if topic_option is not None:
            self.topics: str | list[str] = topic_option  # Kafka's rule: the option wins
        else:
            col = cols["topic"]
            if col.null_count:
                raise ClientError(f"column 'topic' is null in row {_first(pc.is_null(col))}")
            self.topics = col.to_pylist()
        self.keys: pa.Array | None = None
        if "key" in cols:
            key = cols["key"]
            try:
                self.keys = key.cast(pa.string()) if not pa.types.is_string(key.type) else key
            except pa.ArrowInvalid:
                raise ClientError("column 'key' holds bytes that are not UTF-8") from None
        self.ids = _IDS.take(n)
        self.props = self._properties()
        plens = pc.binary_length(self.props)
        if pc.max(plens).as_py() > DEFAULT_MAX_PROPERTIES_SIZE:
            raise ClientError(
                f"a row's properties are over {DEFAULT_MAX_PROPERTIES_SIZE} bytes encoded"
            )
        self.sizes = np.asarray(lengths, dtype=np.int64) + np.asarray(plens, dtype=np.int64) + 6

    def _properties(self) -> pa.Array:
        cols = self.cols
        parts: list[pa.Array] = []
        pairs = self.n  # UNIQ_KEY on every row
        if "properties" in cols:
            m = cols["properties"]
            keys, items = m.keys, m.items
            if len(keys):
                entries = pc.binary_join_element_wise(
                    _as_binary(keys), pa.scalar(b"\x01"), _as_binary(items.fill_null("")),
                    pa.scalar(b"\x02"), b"",
                )  # fmt: skip
                # Properties the sink sets itself (the message id, the transaction's) are
                # dropped, not refused: a row read by the orbitmq source carries them, and
                # read -> write must work as it does with Kafka's headers.
                reserved = pc.is_in(keys, pa.array(sorted(_RESERVED_PROPERTIES)))
                dropped = pc.sum(reserved).as_py() or 0
                if dropped:
                    entries = pc.if_else(reserved, pa.scalar(b""), entries)
                pairs -= dropped
                lists = pa.ListArray.from_arrays(m.offsets, entries, mask=m.is_null())
                parts.append(pc.binary_join(lists, b"").fill_null(b""))
                pairs += len(keys)
        for column, name in (("key", PROPERTY_KEYS), ("tags", PROPERTY_TAGS)):
            if column in cols:
                values = self.keys if column == "key" else cols[column]
                assert values is not None
                values = pc.if_else(pc.equal(pc.binary_length(values), 0), None, values)
                parts.append(_prop(name, _as_binary(values)))
                pairs += len(values) - values.null_count
        if "delay" in cols:
            delay = cols["delay"].cast(pa.int64())
            parts.append(_prop(PROPERTY_TIMER_DELAY_MS, delay.cast(pa.string()).cast(pa.binary())))
            pairs += len(delay) - delay.null_count
        if "delivery_time" in cols:
            ts = cols["delivery_time"]
            raw = ts.cast(pa.int64())
            per_ms = {"s": 0, "ms": 1, "us": 1000, "ns": 1_000_000}[ts.type.unit]
            ms = pc.multiply(raw, 1000) if per_ms == 0 else pc.divide(raw, per_ms)
            parts.append(_prop(PROPERTY_TIMER_DELIVER_MS, ms.cast(pa.string()).cast(pa.binary())))
            pairs += len(ms) - ms.null_count
        parts.append(_prop(PROPERTY_UNIQ_KEY, self.ids))
        props = parts[0] if len(parts) == 1 else pc.binary_join_element_wise(*parts, b"")
        if len(parts) > 1:
            _, raw = _buffer_of(props)
            block = np.frombuffer(raw, dtype=np.uint8)
            if np.count_nonzero(block == 1) != pairs or np.count_nonzero(block == 2) != pairs:
                raise ClientError(
                    "a key, tag or property holds \\x01 or \\x02, which properties cannot carry"
                )
        return props

    def packed(self, rows: np.ndarray | range) -> tuple[bytes, list[str]]:
        """The send body (encode_send_body's layout) of ``rows`` and their ids."""
        if isinstance(rows, range):
            value = self.value.slice(rows.start, len(rows))
            props = self.props.slice(rows.start, len(rows))
            ids = self.ids.slice(rows.start, len(rows))
        else:
            idx = pa.array(rows)
            value, props, ids = self.value.take(idx), self.props.take(idx), self.ids.take(idx)
        n = len(value)
        blens, bodies = _buffer_of(value)
        plens, props_raw = _buffer_of(props)
        head = np.empty(1 + 2 * n, dtype=">u4")
        head[0] = n
        head[1 : n + 1] = blens
        table = head[: n + 1].tobytes() + plens.astype(">u2").tobytes()
        return b"".join((table, bodies, props_raw)), [b.decode() for b in ids.to_pylist()]

    def messages(self, topic: str, rows: np.ndarray | range) -> list[Message]:
        """The same rows as Message objects (for sends that take them)."""
        idx = list(rows)
        value = self.value.to_pylist()
        props = self.props.to_pylist()
        return [Message(topic, value[i], properties=decode_properties(props[i])) for i in idx]


class _Converter:
    """Record batches -> (topic, queue, rows) sends: rows grouped per target queue and cut
    under maxBatchMessages / maxBatchBytes."""

    def __init__(self, opts: SinkOptions, columns: Sequence[str], clients: _Clients) -> None:
        self.opts = opts
        self.columns = frozenset(columns)
        self.clients = clients
        self._routes: dict[str, TopicPublishInfo] = {}

    def _route(self, topic: str) -> TopicPublishInfo:
        info = self._routes.get(topic)
        if info is None:
            c = self.clients
            info = self._routes[topic] = c.thread.run(c.tx.producer.routes.get(topic))
        return info

    def convert(self, rb: pa.RecordBatch) -> Iterator[tuple[_Prepared, _Run]]:
        if rb.num_rows == 0:
            return
        prep = _Prepared(rb, self.opts.topic)
        for run in self._runs(prep):
            for part in self._split(prep, run.rows):
                yield prep, _Run(run.topic, run.queue, part)

    def _runs(self, prep: _Prepared) -> Iterator[_Run]:
        n, topics, cols = prep.n, prep.topics, prep.cols
        groups: list[tuple[str, np.ndarray | range]]
        if isinstance(topics, str):
            groups = [(topics, range(n))]
        else:
            per_topic: dict[str, list[int]] = {}
            for i, t in enumerate(topics):
                per_topic.setdefault(t, []).append(i)
            groups = [(t, np.asarray(r, dtype=np.int64)) for t, r in per_topic.items()]
        qids = cols["queue_id"].cast(pa.int64()) if "queue_id" in cols else None
        brokers = cols["broker"].to_pylist() if "broker" in cols else None
        hashes: np.ndarray | None = None
        if prep.keys is not None:  # CRC32C of the key, as the client's hash_selector
            crc = crc32c.crc32c
            hashes = np.fromiter(
                (crc(k) if k else -1 for k in _as_binary(prep.keys).to_pylist()),
                dtype=np.int64,
                count=n,
            )
        for topic, rows in groups:
            info = self._route(topic)
            queues = info.write_queues
            if not queues:
                raise ClientError(f"topic {topic!r} has no writable queue")
            if info.auto_create:  # unknown topic: the producer's first send creates it
                yield _Run(topic, None, rows)
                continue
            if qids is None and hashes is None:
                yield from self._spread(topic, queues, rows)
                continue
            at = np.arange(rows.start, rows.stop) if isinstance(rows, range) else rows
            target = np.full(len(at), -1, dtype=np.int64)
            if hashes is not None:
                h = hashes[at]
                target = np.where(h >= 0, h % len(queues), -1)
            if qids is not None:
                q_of = qids.take(pa.array(at)).to_pylist()
                for j, q in enumerate(q_of):
                    if q is not None:
                        b = brokers[int(at[j])] if brokers else None
                        target[j] = _queue_index(queues, int(q), b)
            free = target < 0
            if free.any():
                yield from self._spread(topic, queues, at[free])
            fixed, fixed_rows = target[~free], at[~free]
            if not len(fixed):
                continue
            order = np.argsort(fixed, kind="stable")
            fixed, fixed_rows = fixed[order], fixed_rows[order]
            cuts = np.flatnonzero(np.diff(fixed)) + 1
            for part_q, part_rows in zip(
                np.split(fixed, cuts), np.split(fixed_rows, cuts), strict=True
            ):
                yield _Run(topic, queues[int(part_q[0])], part_rows)

    def _spread(
        self, topic: str, queues: Sequence[MessageQueue], rows: np.ndarray | range
    ) -> Iterator[_Run]:
        """Rows without a queue or key: runs of maxBatchMessages to the queues in turn."""
        step = self.opts.max_batch_messages
        for at in range(0, len(rows), step):
            q = queues[next(self.clients.next_queue) % len(queues)]
            yield _Run(topic, q, rows[at : at + step])

    def _split(self, prep: _Prepared, rows: np.ndarray | range) -> Iterator[np.ndarray | range]:
        """Cut rows into sends under maxBatchMessages and maxBatchBytes."""
        limit_n, limit_b = self.opts.max_batch_messages, self.opts.max_batch_bytes
        sizes = prep.sizes[rows.start : rows.stop] if isinstance(rows, range) else prep.sizes[rows]
        if len(sizes) <= limit_n and int(sizes.sum()) <= limit_b:
            yield rows
            return
        total = np.cumsum(sizes)
        start, base = 0, 0
        while start < len(sizes):
            end = int(np.searchsorted(total, base + limit_b, side="right"))
            end = min(max(end, start + 1), start + limit_n, len(sizes))
            yield rows[start:end]
            base = int(total[end - 1])
            start = end


def _first(mask: pa.Array) -> int:
    hits = np.flatnonzero(np.asarray(mask.fill_null(False)))
    return int(hits[0]) if len(hits) else -1


def _queue_index(queues: Sequence[MessageQueue], queue_id: int, broker: str | None) -> int:
    hits = [
        i
        for i, q in enumerate(queues)
        if q.queue_id == queue_id and (broker is None or q.broker_name == broker)
    ]
    if not hits:
        where = f" on broker {broker!r}" if broker else ""
        raise ClientError(
            f"column 'queue_id': {queue_id} is not a writable queue of {queues[0].topic!r}{where}"
        )
    if len(hits) > 1:
        raise ClientError(
            f"column 'queue_id': several brokers hold queue {queue_id} of {queues[0].topic!r}; "
            "add a 'broker' column"
        )
    return hits[0]


# ---------------------------------------------------------------------------------- tasks


@dataclass(frozen=True)
class SinkCommitMessage(WriterCommitMessage):
    """What a task tells the driver: the halves it stored (exactly-once) and how many rows."""

    query_id: str
    batch_id: int
    attempt: str
    halves: tuple[HalfRef, ...] = ()
    rows: int = 0
    skipped: bool = False
    """The marker of this batch already existed: the task wrote nothing (a replay)."""
    first_sent_ms: float | None = None
    """When the task sent its first half (epoch ms): the driver probes old halves."""


@dataclass(frozen=True, slots=True)
class _Identity:
    query_id: str
    batch_id: int
    attempt: str


def _identity(ctx: TaskContext | None, job_id: str | None) -> _Identity:
    if ctx is None:
        raise ClientError("the orbitmq sink's write() runs only inside a Spark task")
    attempt = protocol.attempt_id(ctx.partitionId(), ctx.attemptNumber(), ctx.taskAttemptId())
    if job_id is not None:
        return _Identity(job_id, 0, attempt)
    query = ctx.getLocalProperty("sql.streaming.queryId")
    batch = ctx.getLocalProperty("streaming.sql.batchId")
    if not query or batch is None:
        raise ClientError("no streaming query id / batch id in the task's local properties")
    return _Identity(query, int(batch), attempt)


class _Sender:
    """Sends (topic, queue, messages) groups from the task thread through the loop thread,
    keeping a few in flight so conversion and network overlap."""

    def __init__(self, clients: _Clients, opts: SinkOptions, ident: _Identity) -> None:
        self.c = clients
        self.opts = opts
        self.ident = ident
        self.pending: list[concurrent.futures.Future[Any]] = []
        self.halves: list[HalfBatchResult] = []
        self.rows = 0
        self.first_sent_ms: float | None = None
        self.batch_props = {
            protocol.PROPERTY_QUERY: ident.query_id,
            protocol.PROPERTY_BATCH: str(ident.batch_id),
            protocol.PROPERTY_ATTEMPT: ident.attempt,
            protocol.PROPERTY_MARKER_TOPIC: opts.marker_topic,
        }

    def submit(self, prep: _Prepared, run: _Run) -> None:
        while len(self.pending) >= _MAX_IN_FLIGHT:
            self._collect(self.pending.pop(0))
        tx = self.c.tx
        if self.first_sent_ms is None:
            self.first_sent_ms = time.time() * 1000
        coro: Any
        if self.opts.exactly_once:
            packed, ids = prep.packed(run.rows)
            coro = tx.send_packed_half_batch(
                run.topic, packed, ids, queue=run.queue, properties=self.batch_props
            )
        else:
            coro = tx.producer.send_batch(prep.messages(run.topic, run.rows), queue=run.queue)
        self.pending.append(self.c.thread.submit(coro))
        self.rows += len(run.rows)

    def _collect(self, fut: concurrent.futures.Future[Any]) -> None:
        result = fut.result(self.opts.send_timeout_s * 3 + 5)
        if isinstance(result, HalfBatchResult):
            self.halves.append(result)

    def finish(self) -> list[HalfRef]:
        while self.pending:
            self._collect(self.pending.pop(0))
        return [HalfRef.of(h, self.ident.attempt) for h in self.halves]

    def fail(self) -> None:
        """Best effort: roll back what this attempt stored (the check-backs would, later)."""
        for fut in self.pending:
            with contextlib.suppress(Exception):  # already failing: the first error matters
                self._collect(fut)
        self.pending.clear()
        if self.halves:
            refs = [HalfRef.of(h) for h in self.halves]
            try:
                self.c.thread.run(
                    protocol.abort_batch(
                        self.c.tx,
                        self.c.stores.default,
                        self.ident.query_id,
                        self.ident.batch_id,
                        refs,
                        timeout_s=5.0,
                    ),
                    timeout=10.0,
                )
            except Exception:
                log.warning("rolling back a failed task's halves failed", exc_info=True)


def _write(
    opts: SinkOptions,
    columns: Sequence[str],
    iterator: Iterator[pa.RecordBatch],
    job_id: str | None,
) -> SinkCommitMessage:
    from pyspark import TaskContext

    ident = _identity(TaskContext.get(), job_id)
    c = _clients(opts)
    if opts.exactly_once and job_id is None:
        # A replay of a committed batch (the driver died before recording it): write nothing.
        try:
            marker = c.thread.run(
                c.stores.default.find(ident.query_id, ident.batch_id, strict=False)
            )
        except MQError:
            marker = None
        if marker is not None:
            for _ in iterator:  # Spark expects its input read to the end
                pass
            return SinkCommitMessage(ident.query_id, ident.batch_id, ident.attempt, skipped=True)
    converter = _Converter(opts, columns, c)
    sender = _Sender(c, opts, ident)
    try:
        for rb in iterator:
            for prep, run in converter.convert(rb):
                sender.submit(prep, run)
        halves = sender.finish()
    except BaseException:
        sender.fail()
        raise
    return SinkCommitMessage(
        ident.query_id,
        ident.batch_id,
        ident.attempt,
        tuple(halves),
        sender.rows,
        first_sent_ms=sender.first_sent_ms,
    )


def _commit(
    opts: SinkOptions,
    messages: Sequence[WriterCommitMessage | None],
    query_id: str | None,
    batch_id: int,
) -> None:
    mine = [m for m in messages if isinstance(m, SinkCommitMessage)]
    if not opts.exactly_once:
        return
    if query_id is None:
        if not mine:
            return  # no task wrote anything (an empty batch): nothing to decide
        query_id = mine[0].query_id
    halves = [h for m in mine for h in m.halves]
    c = _clients(opts)
    outcome = c.thread.run(
        protocol.commit_batch(
            c.tx,
            c.stores.default,
            query_id,
            batch_id,
            halves,
            attempts=[m.attempt for m in mine],
            rows=sum(m.rows for m in mine),
            timeout_s=opts.commit_timeout_s,
            oldest_ms=min((m.first_sent_ms for m in mine if m.first_sent_ms), default=None),
        )
    )
    if outcome.replay:
        log.warning(
            "query %s batch %d was committed before; replayed its marker, dropped %d halves",
            query_id,
            batch_id,
            outcome.rolled_back,
        )


def _abort(
    opts: SinkOptions,
    messages: Sequence[WriterCommitMessage | None],
    query_id: str | None,
    batch_id: int,
) -> None:
    mine = [m for m in messages if isinstance(m, SinkCommitMessage)]
    halves = [h for m in mine for h in m.halves]
    if not opts.exactly_once or not halves:
        return
    c = _clients(opts)
    c.thread.run(
        protocol.abort_batch(
            c.tx,
            c.stores.default,
            query_id or mine[0].query_id,
            batch_id,
            halves,
            timeout_s=opts.commit_timeout_s,
        )
    )


class OrbitMQBatchWriter(DataSourceArrowWriter):
    """``df.write.format("orbitmq")``: plain batches (at-least-once), or one transaction for
    the whole job with ``deliveryGuarantee=exactlyOnce`` (all-or-nothing)."""

    def __init__(self, opts: SinkOptions, columns: tuple[str, ...]) -> None:
        self.opts = opts
        self.columns = columns
        # The batch writer is one instance, pickled to the tasks and to commit(): its job id
        # stands where a streaming query id would.
        self.job_id = f"job-{uuid.uuid4()}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        return _write(self.opts, self.columns, iterator, self.job_id)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _commit(self.opts, messages, self.job_id, 0)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _abort(self.opts, messages, self.job_id, 0)


class OrbitMQStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("orbitmq")``: exactly-once per micro-batch by default."""

    def __init__(self, opts: SinkOptions, columns: tuple[str, ...]) -> None:
        self.opts = opts
        self.columns = columns

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        return _write(self.opts, self.columns, iterator, None)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _commit(self.opts, messages, None, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _abort(self.opts, messages, None, batchId)


def batch_writer(
    options: Mapping[str, str], schema: StructType, overwrite: bool
) -> OrbitMQBatchWriter:
    """Called by the DataSource when a batch write is planned: options and columns are
    checked here, so mistakes fail before any task runs."""
    if overwrite:
        raise OptionError("save mode overwrite: a topic is append-only (use mode append)")
    opts = parse_sink_options(options, streaming=False)
    return OrbitMQBatchWriter(opts, check_columns(schema, opts))


def stream_writer(
    options: Mapping[str, str], schema: StructType, overwrite: bool
) -> OrbitMQStreamWriter:
    """Called for a streaming write (and again for each micro-batch's tasks and commit).
    ``overwrite`` (complete output mode) appends every row, as Kafka's sink does."""
    opts = parse_sink_options(options, streaming=True)
    return OrbitMQStreamWriter(opts, check_columns(schema, opts))

"""Arrow record batches to send bodies: the write-side twin of :mod:`orbitmq.spark.arrow`.

The sink's tasks get Spark rows as pyarrow RecordBatches; this module turns one into what the
producer sends, column-wise, with no Python object per row on the usual path:

- :class:`Prepared` checks the columns (no null or empty body, bodies and properties within
  the broker's limits) and encodes every row's properties (``k\\x01v\\x02...``, with a fresh
  unique id from :data:`IDS`) as one Arrow array;
- :meth:`Prepared.packed` lays a run of rows out as one send body (``encode_send_body``'s
  layout) with a take and a join;
- :class:`Converter` groups rows per target queue (``queue_id`` / ``broker`` columns, the CRC32C
  of ``key``, or runs of ``maxBatchMessages`` to the queues in turn) and cuts them under
  ``maxBatchMessages`` / ``maxBatchBytes``.

Nothing here talks to a broker: routes come in through a lookup callable, so the sink
(:mod:`orbitmq.spark.sink`) owns the connections and the sending.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from orbitmq.client.route import MessageQueue, TopicPublishInfo
from orbitmq.common.clock import SYSTEM_CLOCK
from orbitmq.common.errors import ClientError
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
from orbitmq.spark import marker
from orbitmq.spark.options import SinkOptions

__all__ = ["IDS", "RESERVED_PROPERTIES", "Converter", "Ids", "Prepared", "Run"]

RESERVED_PROPERTIES = frozenset(
    {
        PROPERTY_UNIQ_KEY,
        "TRAN_MSG",
        "PGROUP",
        "REAL_TOPIC",
        "REAL_QID",
        "TRAN_BATCH",
        marker.PROPERTY_QUERY,
        marker.PROPERTY_BATCH,
        marker.PROPERTY_ATTEMPT,
        marker.PROPERTY_MARKER_TOPIC,
    }
)


class Ids:
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
        now = SYSTEM_CLOCK.now_ms()
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


IDS = Ids()


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
class Run:
    """Rows of one record batch bound for one queue (``queue`` None: the producer picks)."""

    topic: str
    queue: MessageQueue | None
    rows: np.ndarray | range


class Prepared:
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
        self.ids = IDS.take(n)
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
                reserved = pc.is_in(keys, pa.array(sorted(RESERVED_PROPERTIES)))
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


class Converter:
    """Record batches -> (topic, queue, rows) sends: rows grouped per target queue and cut
    under maxBatchMessages / maxBatchBytes."""

    def __init__(
        self,
        opts: SinkOptions,
        columns: Sequence[str],
        routes: Callable[[str], TopicPublishInfo],
        next_queue: Iterator[int],
    ) -> None:
        self.opts = opts
        self.columns = frozenset(columns)
        self._lookup = routes
        """Blocking route lookup of a topic (the producer's route cache, on its loop)."""
        self._next_queue = next_queue
        """The process's round-robin counter, shared by every task it runs."""
        self._routes: dict[str, TopicPublishInfo] = {}

    def _route(self, topic: str) -> TopicPublishInfo:
        info = self._routes.get(topic)
        if info is None:
            info = self._routes[topic] = self._lookup(topic)
        return info

    def convert(self, rb: pa.RecordBatch) -> Iterator[tuple[Prepared, Run]]:
        if rb.num_rows == 0:
            return
        prep = Prepared(rb, self.opts.topic)
        for run in self._runs(prep):
            for part in self._split(prep, run.rows):
                yield prep, Run(run.topic, run.queue, part)

    def _runs(self, prep: Prepared) -> Iterator[Run]:
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
                yield Run(topic, None, rows)
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
                yield Run(topic, queues[int(part_q[0])], part_rows)

    def _spread(
        self, topic: str, queues: Sequence[MessageQueue], rows: np.ndarray | range
    ) -> Iterator[Run]:
        """Rows without a queue or key: runs of maxBatchMessages to the queues in turn."""
        step = self.opts.max_batch_messages
        for at in range(0, len(rows), step):
            q = queues[next(self._next_queue) % len(queues)]
            yield Run(topic, q, rows[at : at + step])

    def _split(self, prep: Prepared, rows: np.ndarray | range) -> Iterator[np.ndarray | range]:
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

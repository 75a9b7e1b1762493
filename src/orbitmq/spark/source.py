"""The readers: batch (``spark.read``) and streaming (``spark.readStream``).

Where each piece runs decides its shape (see the Python Data Source execution model):

- ``partitions()`` (batch, in a planner process) and every streaming method except ``read()``
  (in the query's one long-lived runner process) run on the driver side; they ask the brokers
  for queue bounds through the process's cached client.
- ``read(partition)`` runs on executors on a *different*, unpickled reader: it uses only the
  parsed options on ``self`` and the :class:`QueueRange` it is given.

Offsets are Kafka's JSON with RocketMQ's queue identity, ``{"topic": {"broker/queue": next}}``
(see :mod:`orbitmq.spark.options`). A range is end-exclusive. Replaying a range reads the same
records, since a queue is an append-only log: that and Spark's checkpoint make the streaming
read exactly-once.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from orbitmq.client.route import MessageQueue
from orbitmq.spark.arrow import records_to_batch
from orbitmq.spark.fetch import Connection, DataLossError, QueueBounds, connection
from orbitmq.spark.options import (
    EARLIEST,
    LATEST,
    OffsetSpec,
    OptionError,
    SourceOptions,
    parse_source_options,
    queue_key,
    split_queue_key,
)

log = logging.getLogger(__name__)

__all__ = ["OrbitMQBatchReader", "OrbitMQStreamReader", "QueueRange", "QueueRanges"]

Offsets = dict[str, dict[str, int]]

ROWS_PER_BATCH = 8192
"""Rows per RecordBatch handed to Spark: large enough that the per-batch fixed cost of the
conversion and of Spark's Arrow intake is small, small enough to keep a task's memory low."""
BYTES_PER_BATCH = 8 * 1024 * 1024
SMALL_BATCH_ROWS = 4096
"""Ranges adding up to at most this many records are read by one task: a tiny micro-batch
spread over one task per queue pays Spark's per-task cost several times for a few rows."""
BOUNDS_CACHE_S = 0.1
"""An idle query with a 0 s trigger asks for the latest offsets ~80 times a second; the broker
is asked at most once per this many seconds."""


@dataclass(frozen=True)
class QueueRange(InputPartition):
    """Records ``[start, end)`` of one queue: one Spark partition."""

    topic: str
    broker: str
    queue_id: int
    start: int
    end: int

    @property
    def mq(self) -> MessageQueue:
        return MessageQueue(self.topic, self.broker, self.queue_id)


@dataclass(frozen=True)
class QueueRanges(InputPartition):
    """Several small ranges read one after the other by one task (see SMALL_BATCH_ROWS)."""

    ranges: tuple[QueueRange, ...]


# ---------------------------------------------------------------------- shared helpers


def _topics(opts: SourceOptions, conn: Connection) -> list[str]:
    if opts.topic_pattern is None:
        return list(opts.topics)
    return [t for t in conn.list_topics() if opts.matches_topic(t)]


def _resolve(
    spec: OffsetSpec,
    bounds: Sequence[QueueBounds],
    conn: Connection,
    default: int,
    name: str,
) -> dict[tuple[str, str], int]:
    """Offsets per (topic, queue key) for a start or end spec; ``default`` (EARLIEST or
    LATEST) for queues a JSON spec leaves out."""

    def pick(b: QueueBounds, off: int) -> int:
        if off == EARLIEST:
            return b.min_offset
        if off == LATEST:
            return b.max_offset
        return off

    out: dict[tuple[str, str], int] = {}
    known = {(b.mq.topic, queue_key(b.mq.broker_name, b.mq.queue_id)) for b in bounds}
    for topic, per in (spec.offsets or spec.timestamps).items():
        for key in per:
            if (topic, key) not in known:
                raise OptionError(f"option {name}: queue {topic}/{key} does not exist")
    if spec.kind == "timestamp":
        mqs = [b.mq for b in bounds]
        stamps = []
        for b in bounds:
            key = queue_key(b.mq.broker_name, b.mq.queue_id)
            if spec.timestamp_ms is not None:
                stamps.append(spec.timestamp_ms)
            else:
                stamps.append(spec.timestamps.get(b.mq.topic, {}).get(key, -1))
        asked = [(mq, t) for mq, t in zip(mqs, stamps, strict=True) if t >= 0]
        found = conn.offsets_for_time([m for m, _ in asked], [t for _, t in asked])
        by_mq = {m: o for (m, _), o in zip(asked, found, strict=True)}
        for b in bounds:
            key = queue_key(b.mq.broker_name, b.mq.queue_id)
            off = by_mq.get(b.mq)
            out[(b.mq.topic, key)] = pick(b, default) if off is None else off
        return out
    for b in bounds:
        key = queue_key(b.mq.broker_name, b.mq.queue_id)
        if spec.kind == "earliest":
            off = b.min_offset
        elif spec.kind == "latest":
            off = b.max_offset
        else:
            off = pick(b, spec.offsets.get(b.mq.topic, {}).get(key, default))
        out[(b.mq.topic, key)] = off
    return out


def _split(ranges: list[QueueRange], opts: SourceOptions, conn: Connection) -> list[InputPartition]:
    """Ranges larger than ``maxBytesPerPartition`` (by a sampled record size) cut into equal
    parts, so one big queue does not become one long task; when nothing needed cutting and the
    ranges are small together (rows and bytes), they become one partition."""
    out: list[InputPartition] = []
    total_bytes = 0
    for r in ranges:
        count = r.end - r.start
        parts = 1
        if count > 16:
            size = conn.sample_record_size(r.mq, r.start)
            if size is not None:
                total_bytes += count * size
                parts = min(count, max(1, math.ceil(count * size / opts.max_bytes_per_partition)))
        if parts == 1:
            out.append(r)
            continue
        edges = np.linspace(r.start, r.end, parts + 1).astype(np.int64).tolist()
        out.extend(
            QueueRange(r.topic, r.broker, r.queue_id, a, b)
            for a, b in itertools.pairwise(edges)
            if b > a
        )
    if (
        1 < len(out) == len(ranges)
        and sum(r.end - r.start for r in ranges) <= SMALL_BATCH_ROWS
        and total_bytes <= opts.max_bytes_per_partition
    ):
        return [QueueRanges(tuple(ranges))]
    return out


def read_range(opts: SourceOptions, part: QueueRange) -> Iterator[pa.RecordBatch]:
    """The records of one range as RecordBatches of the source schema."""
    if part.end <= part.start:
        return
    conn = connection(opts.namesrv, opts.timeout_s, opts.access_key, opts.secret_key)
    expr: tuple[str, str] | None = None
    tag_set: pa.Array | None = None
    if opts.sql_filter is not None:
        expr = ("SQL92", opts.sql_filter)
    elif opts.filtered and opts.tag_expression is not None:
        expr = ("TAG", opts.tag_expression)
        from orbitmq.common.filter import compile_filter  # lark: only for filtered reads

        tags = compile_filter("TAG", opts.tag_expression).tags
        if tags is not None:  # the broker filters by tag hash: drop any collision here
            tag_set = pa.array(sorted(tags), pa.string())
    chunks: list[bytes] = []
    spans: list[tuple[int, int]] = []
    held = 0
    rows = 0

    def flush() -> pa.RecordBatch:
        batch = records_to_batch(chunks, part.topic, part.broker, part.end)
        if expr is None and batch.num_rows != rows:
            _short_read(opts, part, spans, batch)
        if tag_set is not None:
            batch = batch.filter(pc.is_in(batch.column("tags"), value_set=tag_set))
        return batch

    for chunk in conn.pull_range(
        part.mq,
        part.start,
        part.end,
        expr=expr,
        batch=opts.pull_batch_size,
        fail_on_data_loss=opts.fail_on_data_loss,
    ):
        if not chunk.data and expr is not None:
            continue  # unfiltered, an empty answer for offsets is a short read: counted below
        chunks.append(chunk.data)
        spans.append((chunk.offset, chunk.next_offset))
        held += len(chunk.data)
        rows += chunk.next_offset - chunk.offset
        if rows >= ROWS_PER_BATCH or held >= BYTES_PER_BATCH:
            yield flush()
            chunks, spans, held, rows = [], [], 0, 0
    if chunks:
        yield flush()


def _short_read(
    opts: SourceOptions, part: QueueRange, spans: list[tuple[int, int]], batch: pa.RecordBatch
) -> None:
    """The broker answered offsets ``spans`` (unfiltered, so one record each) with fewer
    records: it skipped some without reporting a gap (records failing their checks, or a
    replica serving another history). Ending the range short would lose them with no error:
    with failOnDataLoss this fails the task (Kafka's rule), else it is logged."""
    want = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in spans])
    got = batch.column("queue_offset").to_numpy(zero_copy_only=False)
    missing = np.setdiff1d(want, got)
    shown = ", ".join(str(int(o)) for o in missing[:10]) + (" ..." if len(missing) > 10 else "")
    msg = (
        f"[ORBITMQ_DATA_LOSS] topic {part.topic!r} queue {part.broker}/{part.queue_id}: the "
        f"broker answered offsets [{spans[0][0]}, {spans[-1][1]}) of the planned range "
        f"[{part.start}, {part.end}) with {batch.num_rows} records, not {len(want)} "
        f"({len(missing)} missing: {shown}); set failOnDataLoss=false to skip them"
    )
    if opts.fail_on_data_loss:
        raise DataLossError(msg)
    log.warning("%s; skipped", msg)


def read_partition(opts: SourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """A task's rows: one range, or several small ones in turn. Spark turns "no partitions"
    into one empty partition of its own type, which yields nothing."""
    if isinstance(partition, QueueRange):
        yield from read_range(opts, partition)
    elif isinstance(partition, QueueRanges):
        for part in partition.ranges:
            yield from read_range(opts, part)


# ---------------------------------------------------------------------- batch


class OrbitMQBatchReader(DataSourceReader):
    """``spark.read.format("orbitmq")``: one partition per queue range, split when large."""

    def __init__(self, options: Mapping[str, str], schema: Any = None) -> None:
        self.opts = parse_source_options(options, streaming=False)

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        conn = connection(opts.namesrv, opts.timeout_s, opts.access_key, opts.secret_key)
        bounds = conn.bounds(_topics(opts, conn))
        starts = _resolve(opts.starting, bounds, conn, EARLIEST, "startingOffsets")
        ends = _resolve(opts.ending, bounds, conn, LATEST, "endingOffsets")
        ranges = []
        for b in bounds:
            key = queue_key(b.mq.broker_name, b.mq.queue_id)
            s, e = starts[(b.mq.topic, key)], ends[(b.mq.topic, key)]
            if s > e and opts.ending.kind != "latest" and opts.starting.kind == "offsets":
                raise OptionError(
                    f"options startingOffsets/endingOffsets: queue {b.mq.topic}/{key} starts "
                    f"at {s}, after its end {e}"
                )
            if e > s:
                ranges.append(QueueRange(b.mq.topic, b.mq.broker_name, b.mq.queue_id, s, e))
        return _split(ranges, opts, conn)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_partition(self.opts, partition)


# ---------------------------------------------------------------------- streaming


def _to_json(offsets: Mapping[tuple[str, str], int]) -> Offsets:
    out: Offsets = {}
    for (topic, key), off in sorted(offsets.items()):
        out.setdefault(topic, {})[key] = int(off)
    return out


def _from_json(doc: Mapping[str, Mapping[str, Any]]) -> dict[tuple[str, str], int]:
    return {(t, str(k)): int(v) for t, per in doc.items() for k, v in per.items()}


def rate_limit(
    start: Mapping[tuple[str, str], int], latest: Mapping[tuple[str, str], int], max_rows: int
) -> dict[tuple[str, str], int]:
    """End offsets admitting at most ``max_rows`` more records, shared across queues in
    proportion to their lag (Kafka's rule), rounded so the shares add up exactly."""
    lag = {k: max(0, latest[k] - start.get(k, latest[k])) for k in latest}
    total = sum(lag.values())
    if total <= max_rows:
        return dict(latest)
    shares = {k: max_rows * v / total for k, v in lag.items()}
    take = {k: math.floor(s) for k, s in shares.items()}
    left = max_rows - sum(take.values())
    for k in sorted(shares, key=lambda k: (take[k] - shares[k], k))[:left]:
        take[k] += 1
    return {k: start.get(k, latest[k]) + take[k] for k in latest}


class OrbitMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("orbitmq")`` with admission control and AvailableNow."""

    def __init__(self, options: Mapping[str, str], schema: Any = None) -> None:
        self.opts = parse_source_options(options, streaming=True)
        self._initial: Offsets | None = None
        self._target: dict[tuple[str, str], int] | None = None
        self._bounds: list[QueueBounds] = []
        self._bounds_at = 0.0
        self._last_trigger = 0.0

    # -- driver side (the query's streaming runner process) --------------------

    def _conn(self) -> Connection:
        return connection(
            self.opts.namesrv, self.opts.timeout_s, self.opts.access_key, self.opts.secret_key
        )

    def _fresh_bounds(self) -> list[QueueBounds]:
        now = time.monotonic()
        if now - self._bounds_at > BOUNDS_CACHE_S:
            conn = self._conn()
            self._bounds = conn.bounds(_topics(self.opts, conn))
            self._bounds_at = now
        return self._bounds

    def _mins(self) -> dict[tuple[str, str], int]:
        return {
            (b.mq.topic, queue_key(b.mq.broker_name, b.mq.queue_id)): b.min_offset
            for b in self._fresh_bounds()
        }

    def _latest(self) -> dict[tuple[str, str], int]:
        return {
            (b.mq.topic, queue_key(b.mq.broker_name, b.mq.queue_id)): b.max_offset
            for b in self._fresh_bounds()
        }

    def initialOffset(self) -> Offsets:
        if self._initial is None:  # called more than once per start: answer the same
            bounds = self._fresh_bounds()
            start = _resolve(self.opts.starting, bounds, self._conn(), EARLIEST, "startingOffsets")
            self._initial = _to_json(start)
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._bounds_at = 0.0
        self._target = self._latest()

    def reportLatestOffset(self) -> Offsets:
        return _to_json(self._latest())

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        begin = _from_json(start)
        latest = self._latest()
        mins = self._mins()
        if self._target is not None:  # AvailableNow: never past what was there at its start
            latest = {k: min(v, self._target[k]) for k, v in latest.items() if k in self._target}
        # A queue new to the query (added to the topic, or a new topic matching the pattern)
        # starts at its earliest offset.
        eff = {k: begin.get(k, mins.get(k, 0)) for k in latest}
        for k, v in latest.items():
            if v < eff[k]:
                self._data_loss(k, eff[k], v)
                eff[k] = v  # failOnDataLoss=false: partitions() reads the queue from its start
        latest = {k: max(v, eff[k]) for k, v in latest.items()}
        end = dict(latest)
        if isinstance(limit, ReadMaxRows):
            end = rate_limit(eff, latest, int(limit.max_rows))
        now = time.monotonic()
        if not self._last_trigger:
            self._last_trigger = now
        min_rows = self.opts.min_offsets_per_trigger
        if min_rows is not None and self._target is None:
            new = sum(end[k] - eff[k] for k in end)
            waited_ms = (now - self._last_trigger) * 1000
            if new < min_rows and waited_ms < self.opts.max_trigger_delay_ms:
                end = dict(eff)
        for k, v in begin.items():  # queues gone from the route keep their place
            end.setdefault(k, v)
        if any(end[k] != begin.get(k) for k in end):
            self._last_trigger = now
        return _to_json(end)

    def _data_loss(self, key: tuple[str, str], expected: int, now: int) -> None:
        """A queue now ends before the query's position: it was reset or recreated."""
        msg = (
            f"[ORBITMQ_DATA_LOSS] topic {key[0]!r} queue {key[1]}: the query is at offset "
            f"{expected} but the queue now ends at {now} (reset or recreated?); set "
            "failOnDataLoss=false to read what it holds now"
        )
        if self.opts.fail_on_data_loss:
            raise DataLossError(msg)
        log.warning("%s; going on", msg)

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        begin = _from_json(start)
        stop = _from_json(end)
        mins: dict[tuple[str, str], int] | None = None
        ranges = []
        for (topic, key), e in sorted(stop.items()):
            s = begin.get((topic, key))
            if s is None or e < s:
                if mins is None:
                    mins = self._mins()
                s = mins.get((topic, key), 0)
            if e > s:
                broker, qid = split_queue_key(key)
                ranges.append(QueueRange(topic, broker, qid, s, e))
        return _split(ranges, self.opts, self._conn())

    def commit(self, end: Offsets) -> None:
        if not self.opts.commit_to_group or not self.opts.group_id:
            return
        offsets = {}
        for (topic, key), off in _from_json(end).items():
            broker, qid = split_queue_key(key)
            offsets[MessageQueue(topic, broker, qid)] = off
        try:
            self._conn().commit_group(self.opts.group_id, offsets)
        except Exception as exc:  # noqa: BLE001 - monitoring only: the checkpoint is the truth
            log.warning("could not commit progress to group %s: %s", self.opts.group_id, exc)

    def stop(self) -> None:
        """Nothing to release: the cached client is closed at process exit."""

    # -- executors ------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_partition(self.opts, partition)

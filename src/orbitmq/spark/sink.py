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

The options are parsed in :mod:`orbitmq.spark.options` (:class:`SinkOptions`); record batches
become send bodies in :mod:`orbitmq.spark.encode`; this module checks the columns, owns the
clients and runs the writers' ``write`` / ``commit`` / ``abort``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import logging
import os
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
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
from orbitmq.client.admin.config import AdminConfig
from orbitmq.client.producer.types import SendStatus
from orbitmq.client.transaction.producer import AsyncTransactionProducer
from orbitmq.client.transaction.types import HalfBatchResult, TransactionConfig
from orbitmq.common.clock import now_ms
from orbitmq.common.errors import ClientError, MQError
from orbitmq.spark import commit as protocol
from orbitmq.spark.commit import HalfRef, MarkerChecker, MarkerStoreFactory
from orbitmq.spark.encode import Converter, Prepared, Run
from orbitmq.spark.options import (
    AT_LEAST_ONCE,
    SINK_OPTIONS,
    OptionError,
    SinkOptions,
    parse_sink_options,
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

_MAX_IN_FLIGHT = 16
"""Sends a task keeps in flight while it converts the next rows."""

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
            access_key=opts.access_key,
            secret_key=opts.secret_key,
        ),
        topics=[opts.marker_topic],
    )
    admin = AsyncAdminClient(
        opts.namesrv, AdminConfig(access_key=opts.access_key, secret_key=opts.secret_key)
    )
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

    def submit(self, prep: Prepared, run: Run) -> None:
        while len(self.pending) >= _MAX_IN_FLIGHT:
            self._collect(self.pending.pop(0))
        tx = self.c.tx
        if self.first_sent_ms is None:
            self.first_sent_ms = float(now_ms())
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
            self.halves.append(result)  # rolled back by fail() if it is refused below
            if result.status is not SendStatus.SEND_OK:
                # FLUSH_SLAVE_TIMEOUT: on the master alone. A marker naming it could outlive
                # it (a failover), and every replay would then fail to commit it: fail the
                # task now, before any marker, and let its re-run send fresh halves.
                raise ClientError(
                    f"half batch {result.transaction_id} stored as {result.status.value} "
                    "(not on every in-sync replica); the task must run again"
                )

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
    converter = Converter(
        opts, columns, lambda topic: c.thread.run(c.tx.producer.routes.get(topic)), c.next_queue
    )
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

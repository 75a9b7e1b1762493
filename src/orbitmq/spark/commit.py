"""The streaming sink's two-phase commit: half batches, a durable marker, then COMMIT.

Why a marker: Spark may run micro-batch N more than once (a task retried, or the driver dying
after the tasks wrote, or after ``commit()`` but before it recorded ``commits/N``). Each run
writes its rows as *half batches* (stored, invisible to consumers). Exactly one set of halves
per (query id, batch id) may ever be committed, and the marker is what makes the choice
durable before any COMMIT goes out:

1. ``commit(messages, N)`` looks up the marker ``<queryId>:<N>``. If it exists, this is a replay
   after a crash: COMMIT the marker's halves again (idempotent at the broker) and ROLL BACK the
   halves of this run, none of which is in the marker.
2. Otherwise it writes the marker (the exact halves chosen), and only then COMMITs them.

A crash between 2's marker write and its COMMITs leaves halves that are chosen but undecided:
the broker checks them back, and any live process of the sink's producer group answers from
the marker (:class:`MarkerChecker`): in the marker, COMMIT; a marker exists but the half is not
in it, ROLLBACK; no marker yet, UNKNOWN (ask again later). Halves of a query that is never run
again stay UNKNOWN and the broker discards them after ``transaction_check_max`` check-backs.

Markers are messages of a dedicated topic (:mod:`orbitmq.spark.marker`: what they hold, how
they are found and written, and the check-back answers). A lookup that decides to write a
marker must have heard from every broker of the marker topic: a broker that did not answer
might hold the marker, and writing a second, different one would publish the batch twice.

Nothing here imports pyspark: the protocol works on plain data, and :mod:`orbitmq.spark.sink`
wires it to Spark's writer callbacks. The marker names are re-exported here, so this module
stays the one import of the protocol.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orbitmq.client.transaction.types import EndResult, LocalTransactionState
from orbitmq.common.clock import now_ms
from orbitmq.common.errors import (
    MQError,
    RemoteError,
    TransactionNotFoundError,
    TransactionStateConflictError,
    error_class,
)
from orbitmq.spark.marker import (
    DEFAULT_MARKER_TOPIC,
    PROPERTY_ATTEMPT,
    PROPERTY_BATCH,
    PROPERTY_MARKER_TOPIC,
    PROPERTY_QUERY,
    RETRY_PAUSE_S,
    HalfRef,
    Marker,
    MarkerChecker,
    MarkerStore,
    MarkerStoreFactory,
    SinkCommitError,
    attempt_id,
    marker_key,
)

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MARKER_TOPIC",
    "PROBE_AGE_MS",
    "PROPERTY_ATTEMPT",
    "PROPERTY_BATCH",
    "PROPERTY_MARKER_TOPIC",
    "PROPERTY_QUERY",
    "CommitOutcome",
    "HalfRef",
    "Marker",
    "MarkerChecker",
    "MarkerStore",
    "MarkerStoreFactory",
    "SinkCommitError",
    "abort_batch",
    "attempt_id",
    "commit_batch",
    "marker_key",
]


@dataclass(frozen=True, slots=True)
class CommitOutcome:
    marker: Marker
    replay: bool
    """True: a marker existed (this batch was committed before, at least partly)."""
    rolled_back: int
    """Halves of this run dropped because another run's were chosen."""


async def _find_retrying(
    store: MarkerStore, query_id: str, batch_id: int, deadline: float
) -> Marker | None:
    loop = asyncio.get_running_loop()
    while True:
        try:
            return await store.find(query_id, batch_id, strict=True)
        except MQError as exc:
            if loop.time() > deadline:
                raise SinkCommitError(
                    f"query {query_id} batch {batch_id}: cannot tell whether it was committed "
                    f"before: {exc}"
                ) from exc
            await asyncio.sleep(RETRY_PAUSE_S)


async def _decide(
    producer: Any,
    halves: Sequence[HalfRef],
    state: LocalTransactionState,
    deadline: float,
    *,
    what: str,
) -> None:
    """END_TRANSACTION for every half, retrying transport failures until ``deadline``.
    ``producer`` is an AsyncTransactionProducer. A COMMIT the broker refuses for good
    (rolled back, discarded, unknown) raises: those rows are lost and must be reported."""
    loop = asyncio.get_running_loop()
    todo = list(halves)
    while todo:
        results: list[EndResult] = await producer.end_many(
            [h.as_result() for h in todo], state, concurrency=64
        )
        retry: list[HalfRef] = []
        fatal: list[str] = []
        for half, res in zip(todo, results, strict=True):
            if res.ok:
                if state is LocalTransactionState.COMMIT and res.broker_state in (
                    "ROLLED_BACK",
                    "DISCARDED",
                ):
                    fatal.append(f"{half.transaction_id}: {res.broker_state}")
                continue
            err = res.error
            if _is_final(err, TransactionStateConflictError, TransactionNotFoundError):
                if state is LocalTransactionState.COMMIT:
                    fatal.append(f"{half.transaction_id}@{half.broker_name}:{half.offset}: {err}")
                # A ROLLBACK of something committed or gone: nothing to undo.
                continue
            retry.append(half)
        if fatal:
            raise SinkCommitError(
                f"{what}: {len(fatal)} half batches can no longer be committed "
                f"(data loss; first: {fatal[0]})"
            )
        if retry and loop.time() > deadline:
            raise SinkCommitError(f"{what}: {len(retry)} decisions not delivered in time")
        if retry:
            await asyncio.sleep(RETRY_PAUSE_S)
        todo = retry


def _is_final(err: MQError | None, *answers: type[MQError]) -> bool:
    """Whether the broker answered one of ``answers`` (a final answer: retrying cannot change it).
    Read through the code's class, so a bare RemoteError for the code counts as well."""
    return isinstance(err, RemoteError) and issubclass(error_class(err.code), answers)


PROBE_AGE_MS = 5_000
"""Halves younger than this were never checked back (the broker's first check-back comes
after ``transaction_timeout_ms``, 6 s by default), so they cannot have been discarded."""


async def _probe(producer: Any, halves: Sequence[HalfRef], deadline: float, *, what: str) -> None:
    """END_TRANSACTION UNKNOWN (changes nothing, answers the state) for every half: all must
    still be PENDING. Raises SinkCommitError otherwise, after rolling the rest back."""
    loop = asyncio.get_running_loop()
    todo = list(halves)
    while todo:
        results: list[EndResult] = await producer.end_many(
            [h.as_result() for h in todo], LocalTransactionState.UNKNOWN, concurrency=64
        )
        retry = []
        for half, res in zip(todo, results, strict=True):
            if res.ok and res.broker_state in ("PENDING", "COMMITTING", "COMMITTED"):
                continue
            if res.ok or _is_final(res.error, TransactionNotFoundError):
                state = res.broker_state or str(res.error)
                await _decide(producer, halves, LocalTransactionState.ROLLBACK, deadline, what=what)
                raise SinkCommitError(
                    f"{what}: half batch {half.transaction_id} is {state} before the commit "
                    "(the batch outlived the broker's check-backs); the batch must run again"
                )
            retry.append(half)
        if retry and loop.time() > deadline:
            raise SinkCommitError(f"{what}: cannot read the state of {len(retry)} half batches")
        if retry:
            await asyncio.sleep(RETRY_PAUSE_S)
        todo = retry


async def _commit_in_order(
    producer: Any, halves: Sequence[HalfRef], deadline: float, *, what: str
) -> None:
    """COMMIT in waves: the k-th half of every (writer, queue) in wave k. Halves of different
    queues or writers go in parallel, while one writer's halves for one queue become visible in
    the order it sent them, so rows of one key keep their order in its queue."""
    waves: list[list[HalfRef]] = []
    seen: dict[tuple[str, str, str, int], int] = {}
    for h in halves:
        key = (h.writer, h.topic, h.broker_name, h.queue_id)
        k = seen.get(key, 0)
        seen[key] = k + 1
        if k == len(waves):
            waves.append([])
        waves[k].append(h)
    for wave in waves:
        await _decide(producer, wave, LocalTransactionState.COMMIT, deadline, what=what)


async def commit_batch(
    producer: Any,
    store: MarkerStore,
    query_id: str,
    batch_id: int,
    halves: Sequence[HalfRef],
    *,
    attempts: Sequence[str] = (),
    rows: int = 0,
    timeout_s: float = 60.0,
    oldest_ms: float | None = None,
) -> CommitOutcome:
    """The driver side of a micro-batch (see the module docstring). ``producer`` is the sink's
    AsyncTransactionProducer. Raises SinkCommitError when it cannot be sure of the outcome;
    calling it again (Spark retries by replaying the batch) is always safe.

    ``oldest_ms``: when the first half was sent (epoch ms). Halves old enough to have been
    checked back may have been discarded by the broker (a batch slower than its
    ``transaction_check_max`` check-backs); they are probed first, so that such a batch fails
    *before* its marker exists and its re-run can choose fresh halves, instead of a marker
    naming halves that can never be committed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    what = f"query {query_id} batch {batch_id}"
    await store.ensure_topic()
    marker = await _find_retrying(store, query_id, batch_id, deadline)
    if marker is not None:
        stray = [h for h in halves if h.transaction_id not in marker.chosen]
        log.info("%s was committed before: replaying its marker, dropping %d", what, len(stray))
        await asyncio.gather(
            _decide(producer, marker.halves, LocalTransactionState.COMMIT, deadline, what=what),
            _decide(producer, stray, LocalTransactionState.ROLLBACK, deadline, what=what),
        )
        return CommitOutcome(marker, True, len(stray))
    if halves and (oldest_ms is None or now_ms() - oldest_ms >= PROBE_AGE_MS):
        await _probe(producer, halves, deadline, what=what)
    marker = Marker(query_id, batch_id, tuple(halves), tuple(attempts), rows)
    await store.write(marker, deadline)
    # The key index is fed asynchronously after the append: wait until a lookup sees the
    # marker, so no later commit() of this batch (a replay) can miss it and choose again.
    while await _find_retrying(store, query_id, batch_id, deadline) is None:
        if loop.time() > deadline:
            raise SinkCommitError(f"{what}: the marker written is not found by its key")
        await asyncio.sleep(0.01)
    await _commit_in_order(producer, halves, deadline, what=what)
    return CommitOutcome(marker, False, 0)


async def abort_batch(
    producer: Any,
    store: MarkerStore,
    query_id: str,
    batch_id: int,
    halves: Sequence[HalfRef],
    *,
    timeout_s: float = 30.0,
) -> int:
    """ROLLBACK this run's halves, except any a marker chose (a replay's abort must not undo an
    earlier run's commit). Best effort: what is not rolled back here is checked back. Returns
    the number of halves rolled back."""
    if not halves:
        return 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    try:
        marker = await store.find(query_id, batch_id, strict=False)
    except MQError as exc:
        log.warning("abort of query %s batch %s: marker lookup failed: %s", query_id, batch_id, exc)
        return 0  # cannot tell which are safe to drop: leave them to the check-backs
    chosen = marker.chosen if marker is not None else frozenset()
    drop = [h for h in halves if h.transaction_id not in chosen]
    try:
        await _decide(
            producer,
            drop,
            LocalTransactionState.ROLLBACK,
            deadline,
            what=f"abort of query {query_id} batch {batch_id}",
        )
    except SinkCommitError as exc:
        log.warning("%s", exc)
    return len(drop)

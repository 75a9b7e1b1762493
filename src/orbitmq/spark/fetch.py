"""Broker access for the source: queue metadata on the driver, raw pulls on the executors.

Spark pickles readers, so they hold no connection. Each Python process (the streaming runner,
a planner, a reused executor worker) opens one client per NameServer list on first use and
keeps it in a module-level cache, the way Kafka's connector caches consumers. The cache is keyed
by process id too: a forked worker never uses its parent's sockets or loop thread.

Pulls return the raw pull bodies (stored records back to back) so :mod:`orbitmq.spark.arrow`
can turn them into columns without decoding each record in Python. Without a filter a queue's
offsets are contiguous, so several pulls of the same range are kept in flight at once
(``PIPELINE`` of them): a range is bounded by round trips otherwise, not by bandwidth.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from orbitmq.client._loop_thread import LoopThread
from orbitmq.client.admin.client import AsyncAdminClient
from orbitmq.client.admin.config import AdminConfig
from orbitmq.client.offset_store import BrokerRequester, RemoteOffsetStore
from orbitmq.client.route import MessageQueue, TopicRouteNotFoundError, master_gone
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import ClientError, MQError, ServiceNotAvailableError
from orbitmq.protocol.requests import PullMessageRequest

log = logging.getLogger(__name__)

__all__ = ["Connection", "DataLossError", "PullChunk", "QueueBounds", "close_all", "connection"]

PIPELINE = 4
MAX_PULL_MESSAGES = 16384
"""The broker's limit for one pull without a filter (a filtered pull returns at most 1024)."""
PULL_MAX_BYTES = 8 * 1024 * 1024
FAILOVER_WAIT_S = 30.0
"""How long a pull waits for its group's new master (a failover takes 3-7 s: docs/ha.md)."""
FAILOVER_RETRY_S = 0.5
STALL_RETRIES = 10
STALL_PAUSE_S = 0.05
"""An unfiltered pull answered "none to serve" without moving on is asked again this many
times (pausing 0.05 s, 0.1 s, ...: under 3 s in all) before the offset counts as lost."""


class DataLossError(ClientError):
    """Offsets the query expected are gone (retention deleted them, or the queue was reset)."""


@dataclass(frozen=True, slots=True)
class PullChunk:
    """Raw records of one pull: ``data`` holds the records from ``offset`` up to (not including)
    ``next_offset`` (fewer of them when a filter dropped some)."""

    offset: int
    next_offset: int
    data: bytes


@dataclass(frozen=True, slots=True)
class QueueBounds:
    mq: MessageQueue
    min_offset: int
    max_offset: int


class Connection:
    """An :class:`AsyncAdminClient` on a private loop thread, shared by a process's readers."""

    def __init__(
        self,
        namesrv: str,
        timeout_s: float,
        access_key: str | None = None,
        secret_key: str | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.thread = LoopThread("orbitmq-spark")
        self.admin = AsyncAdminClient(
            namesrv,
            AdminConfig(timeout_s=timeout_s, access_key=access_key, secret_key=secret_key),
        )
        self.requester = BrokerRequester(
            self.admin.routes, self.admin.remoting, timeout_s=timeout_s
        )

    def run(self, coro: Any) -> Any:
        return self.thread.run(coro)

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing at exit: nothing to do about a failure
            self.thread.run(self.admin.close(), timeout=5)
        self.thread.stop()

    # ------------------------------------------------------------------ driver side

    def list_topics(self) -> list[str]:
        return list(self.run(self.admin.list_topics()))

    def bounds(self, topics: Sequence[str]) -> list[QueueBounds]:
        """Every readable queue of ``topics`` with its min and max offsets, asked concurrently.
        A topic no NameServer knows has no queues (a topic pattern may name it before it
        exists)."""

        async def one_topic(topic: str) -> list[QueueBounds]:
            try:
                mqs = await self.admin.queues(topic)
            except TopicRouteNotFoundError:
                return []
            los = asyncio.gather(*(self.admin.min_offset(mq) for mq in mqs))
            his = asyncio.gather(*(self.admin.max_offset(mq) for mq in mqs))
            lo, hi = await asyncio.gather(los, his)
            return [QueueBounds(mq, a, b) for mq, a, b in zip(mqs, lo, hi, strict=True)]

        async def all_topics() -> list[QueueBounds]:
            parts = await asyncio.gather(*(one_topic(t) for t in topics))
            return [b for part in parts for b in part]

        out: list[QueueBounds] = self.run(all_topics())
        return out

    def offsets_for_time(self, queues: Sequence[MessageQueue], ts_ms: Sequence[int]) -> list[int]:
        """The first offset stored at or after each time (the queue's end when none is)."""

        async def go() -> list[int]:
            return list(
                await asyncio.gather(
                    *(self.admin.search_offset(mq, t) for mq, t in zip(queues, ts_ms, strict=True))
                )
            )

        out: list[int] = self.run(go())
        return out

    def commit_group(self, group: str, offsets: dict[MessageQueue, int]) -> None:
        """Copy the query's progress to ``group`` (for ``orbitmq group describe``; the
        checkpoint stays the source of truth)."""
        store = RemoteOffsetStore(group, self.requester)
        for mq, off in offsets.items():
            store.update(mq, off)
        self.run(store.persist())

    def sample_record_size(self, mq: MessageQueue, offset: int) -> int | None:
        """Average stored size of a few records at ``offset`` (to split large ranges)."""

        async def go() -> int | None:
            resp = await self._pull(mq, offset, 16, None)
            if resp.code != ResponseCode.SUCCESS or not resp.body:
                return None
            got = int(resp.fields.get("next_begin_offset", offset)) - offset
            return max(1, len(resp.body) // max(1, got))

        out: int | None = self.run(go())
        return out

    # ------------------------------------------------------------------ executor side

    async def _pull(
        self, mq: MessageQueue, offset: int, count: int, expr: tuple[str, str] | None
    ) -> Any:
        expression_type, expression = expr if expr is not None else (None, None)
        pull = PullMessageRequest(
            topic=mq.topic,
            queue_id=mq.queue_id,
            queue_offset=offset,
            max_msg_nums=count,
            max_bytes=PULL_MAX_BYTES,
            expression_type=expression_type,
            expression=expression,
        )
        # A group between masters (issue #13): a pull that finds the master gone (refused,
        # fenced, or answered "is a slave") re-reads the route and tries the new master, for
        # up to FAILOVER_WAIT_S, rather than failing the task and with it the query.
        # A route naming no master for the group (between the old master's end and the new
        # one's registration) is waited out the same way, not a failed task.
        deadline = asyncio.get_running_loop().time() + FAILOVER_WAIT_S
        while True:
            try:
                addr = await self.requester.addr(mq.broker_name, mq.topic)
            except ClientError as exc:  # "no master address known": the route has none yet
                if asyncio.get_running_loop().time() > deadline:
                    raise
                log.info("pull of %s: %s; waiting for the group's master", mq, exc)
                await asyncio.sleep(FAILOVER_RETRY_S)
                continue
            try:
                return await self._pull_from(addr, pull)
            except MQError as exc:
                # SERVICE_NOT_AVAILABLE (the tier's object store unreachable or throttling:
                # docs/tiered-storage.md) is retried too, as a consumer does, within the bound.
                gone = master_gone(exc)
                unavailable = isinstance(exc, ServiceNotAvailableError)
                if not (gone or unavailable) or asyncio.get_running_loop().time() > deadline:
                    raise
                why = "waiting for the group's master" if gone else "retrying"
                log.info("pull of %s from %s: %s; %s", mq, addr, exc, why)
            await asyncio.sleep(FAILOVER_RETRY_S)
            with contextlib.suppress(MQError):
                await self.requester.routes.refresh(mq.topic)

    async def _pull_from(self, addr: str, pull: PullMessageRequest) -> Any:
        return await self.requester.call(
            addr,
            pull,
            ok=frozenset(
                {
                    ResponseCode.SUCCESS,
                    ResponseCode.PULL_NOT_FOUND,
                    ResponseCode.PULL_RETRY_IMMEDIATELY,
                    ResponseCode.PULL_OFFSET_MOVED,
                }
            ),
        )

    def pull_range(
        self,
        mq: MessageQueue,
        start: int,
        end: int,
        *,
        expr: tuple[str, str] | None,
        batch: int,
        fail_on_data_loss: bool,
    ) -> Iterator[PullChunk]:
        """The raw records of ``[start, end)``, in order, as pull bodies.

        Offsets that are gone raise DataLossError (naming topic, queue and offsets) or, with
        ``fail_on_data_loss`` false, are skipped with a warning. Without a filter, an answer
        of "none to serve" (PULL_RETRY_IMMEDIATELY) is such a gap too; a chunk holding fewer
        records than its offsets is caught by the reader (orbitmq.spark.source)."""
        batch = max(1, min(batch, MAX_PULL_MESSAGES))
        offset = start
        pending: list[tuple[int, int, Any]] = []  # (offset, count, future)
        next_ask = start
        pipelined = expr is None
        stalls = 0
        try:
            while offset < end:
                depth = PIPELINE if pipelined else 1
                while len(pending) < depth and next_ask < end:
                    count = min(batch, end - next_ask)
                    fut = self.thread.submit(self._pull(mq, next_ask, count, expr))
                    pending.append((next_ask, count, fut))
                    next_ask += count
                ask_at, count, fut = pending.pop(0)
                resp = fut.result(self.timeout_s * 2)
                assert ask_at == offset
                code = resp.code
                nxt = int(resp.fields.get("next_begin_offset", offset))
                if code == ResponseCode.SUCCESS:
                    data = bytes(resp.body)
                    if pipelined and nxt < ask_at + count:
                        # The broker stopped short (its byte limit): ask for the rest now,
                        # before the pulls already in flight further on.
                        yield PullChunk(offset, nxt, data)
                        offset = nxt
                        self._drain(pending)
                        pending = []
                        next_ask = offset
                        continue
                    yield PullChunk(offset, min(nxt, end), data)
                    offset = max(nxt, offset + 1) if not pipelined else ask_at + count
                    if not pipelined:
                        next_ask = offset
                    continue
                lo = int(resp.fields.get("min_offset", -1))
                hi = int(resp.fields.get("max_offset", -1))
                if code == ResponseCode.PULL_RETRY_IMMEDIATELY and expr is not None:
                    offset = max(nxt, offset + 1)  # nothing passed the filter
                    next_ask = offset
                    continue
                if code == ResponseCode.PULL_RETRY_IMMEDIATELY and nxt <= offset:
                    # Nothing served and no step forward: not a skip (the old code stepped over
                    # one record here, silently). Ask again, a bounded number of times.
                    stalls += 1
                    if stalls <= STALL_RETRIES:
                        self._drain(pending)
                        pending = []
                        next_ask = offset
                        time.sleep(STALL_PAUSE_S * stalls)
                        continue
                if code == ResponseCode.PULL_RETRY_IMMEDIATELY:
                    # Unfiltered, every offset holds a record: "none to serve" means the broker
                    # skipped [offset, nxt) (records failing their checks, or expired). Moving
                    # on silently would end the range short with no error: silent loss.
                    lost_to = min(max(nxt, offset + 1), end)
                elif code == ResponseCode.PULL_OFFSET_MOVED and offset < lo:
                    lost_to = min(lo, end)
                elif code == ResponseCode.PULL_NOT_FOUND and offset < end:
                    lost_to = end  # the queue ends before the range does: those offsets are gone
                else:
                    lost_to = end
                msg = (
                    f"[ORBITMQ_DATA_LOSS] topic {mq.topic!r} queue {mq.broker_name}/{mq.queue_id}: "
                    f"offsets [{offset}, {lost_to}) are no longer available (queue holds "
                    f"[{lo}, {hi})); set failOnDataLoss=false to skip them"
                )
                if fail_on_data_loss:
                    raise DataLossError(msg)
                log.warning("%s; skipped", msg)
                self._drain(pending)
                pending = []
                offset = next_ask = lost_to
        finally:
            self._drain(pending)

    @staticmethod
    def _drain(pending: list[tuple[int, int, Any]]) -> None:
        for _, _, fut in pending:
            fut.cancel()


_LOCK = threading.Lock()
_CACHE: dict[tuple[int, str, str | None], Connection] = {}


def connection(
    namesrv: str,
    timeout_s: float = 10.0,
    access_key: str | None = None,
    secret_key: str | None = None,
) -> Connection:
    """This process's client for ``namesrv`` as ``access_key`` (opened on first use, closed at
    exit)."""
    key = (os.getpid(), namesrv, access_key)
    with _LOCK:
        conn = _CACHE.get(key)
        if conn is None:
            conn = _CACHE[key] = Connection(namesrv, timeout_s, access_key, secret_key)
        return conn


@atexit.register
def _close_all() -> None:
    with _LOCK:
        mine = [c for (pid, _, _), c in _CACHE.items() if pid == os.getpid()]
        _CACHE.clear()
    for conn in mine:
        conn.close()


def close_all() -> None:
    """Close this process's cached clients (tests, benchmarks)."""
    _close_all()

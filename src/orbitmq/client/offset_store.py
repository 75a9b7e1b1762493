"""Where a consumer keeps its consumed offsets: on the brokers (clustering) or in a local file
(broadcasting).

Both stores keep the offsets in memory (:meth:`update` is a dict write, done after every
consumed batch) and make them durable in batches (:meth:`persist`, every
``auto_commit_interval_s`` and when a queue is handed over or the consumer closes):

- :class:`RemoteOffsetStore` sends one UPDATE_CONSUMER_OFFSET per broker with an
  :class:`OffsetsBody` holding every changed queue of that broker (the broker answers after the
  commit is on disk), and reads with QUERY_CONSUMER_OFFSET (None when the group never committed
  there: QUERY_NOT_FOUND);
- :class:`LocalOffsetStore` writes a JSON file per group with the temp-file, fsync, rename
  dance, so a crash leaves the old file or the new one.

An offset is "the next message to consume", as everywhere in RocketMQ.

:class:`BrokerRequester` is the small request helper every consumer piece shares: it finds the
master address of a queue's broker through the route cache and turns error answers into
:class:`RemoteError`; a failure that says the master is gone re-reads the route in the
background (``TopicRouteCache.master_failed``), so the next pull or commit reaches the group's
new master (docs/ha.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import msgspec

from orbitmq.client.route import MessageQueue, TopicRouteCache, TopicRouteNotFoundError
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import ClientError, MQError, ProtocolError, RemoteError, error_for
from orbitmq.common.files import write_atomically
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.bodies import encode_body
from orbitmq.protocol.consumer import OffsetsBody, QueueOffset
from orbitmq.protocol.frame import Buffer, Frame
from orbitmq.protocol.header import Header
from orbitmq.protocol.requests import (
    GetMaxOffsetRequest,
    GetMinOffsetRequest,
    QueryConsumerOffsetRequest,
    SearchOffsetRequest,
    UpdateConsumerOffsetRequest,
)

log = logging.getLogger(__name__)

__all__ = ["BrokerRequester", "LocalOffsetStore", "OffsetStore", "RemoteOffsetStore"]

_OK = frozenset({ResponseCode.SUCCESS})


class BrokerRequester:
    """Requests to the master of a named broker, found through the consumer's route cache."""

    def __init__(
        self, routes: TopicRouteCache, remoting: RemotingClient, *, timeout_s: float = 3.0
    ) -> None:
        self.routes = routes
        self.remoting = remoting
        self.timeout_s = timeout_s

    async def addr(self, broker_name: str, topic: str) -> str:
        """The master address of ``broker_name``; refreshes ``topic``'s route when unknown."""
        addr = self.routes.master_addr(broker_name)
        if addr:
            return addr
        try:
            info = await self.routes.refresh(topic)
        except TopicRouteNotFoundError:
            info = None
        addr = info.broker_addrs.get(broker_name) if info is not None else None
        if not addr:
            raise ClientError(f"no master address known for broker {broker_name!r}")
        return addr

    async def call(
        self,
        addr: str,
        header: Header,
        body: Buffer = b"",
        *,
        ok: frozenset[int] = _OK,
        timeout_s: float | None = None,
    ) -> Frame:
        """One request (``header``, a typed request header, and ``body``); RemoteError unless
        the answer's code is in ``ok``."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        try:
            resp = await self.remoting.invoke(addr, header.frame(body), timeout)
            if resp.code not in ok:
                raise error_for(resp.code, resp.remark)
        except MQError as exc:
            self.routes.master_failed(addr, exc)  # a lost master: find the group's next one
            raise
        return resp

    async def call_queue(
        self,
        mq: MessageQueue,
        header: Header,
        body: Buffer = b"",
        *,
        ok: frozenset[int] = _OK,
        timeout_s: float | None = None,
    ) -> Frame:
        """One request to the master of ``mq``'s broker."""
        addr = await self.addr(mq.broker_name, mq.topic)
        return await self.call(addr, header, body, ok=ok, timeout_s=timeout_s)

    async def min_offset(self, mq: MessageQueue) -> int:
        return await self._offset(mq, GetMinOffsetRequest(topic=mq.topic, queue_id=mq.queue_id))

    async def max_offset(self, mq: MessageQueue) -> int:
        return await self._offset(mq, GetMaxOffsetRequest(topic=mq.topic, queue_id=mq.queue_id))

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """The first offset of ``mq`` stored at or after ``timestamp_ms``."""
        header = SearchOffsetRequest(topic=mq.topic, queue_id=mq.queue_id, timestamp=timestamp_ms)
        return await self._offset(mq, header)

    async def _offset(self, mq: MessageQueue, header: Header) -> int:
        return int_field(await self.call_queue(mq, header), "offset")


def int_field(resp: Frame, name: str) -> int:
    value = resp.fields.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"response field {name!r} is not an integer: {value!r}")
    return value


class OffsetStore(Protocol):
    """What the consumers need from an offset store."""

    async def load(self) -> None: ...

    def update(self, mq: MessageQueue, offset: int, *, increase_only: bool = False) -> None:
        """Remember ``offset`` for ``mq`` in memory (made durable by :meth:`persist`)."""

    def read(self, mq: MessageQueue) -> int | None:
        """The offset in memory, if any."""

    async def query(self, mq: MessageQueue, *, stored_only: bool = False) -> int | None:
        """The durable offset (broker or file); None when there is none. A broker answers a
        new group's young queue with 0 (the first-consume rule, docs/consumer-groups.md) unless
        ``stored_only``, which asks for what was committed and nothing else."""

    async def fetch(self, mq: MessageQueue) -> int | None:
        """:meth:`query`, and remember the answer in memory."""

    async def persist(self, mqs: Iterable[MessageQueue] | None = None) -> None:
        """Make the in-memory offsets of ``mqs`` (None: all) durable. Raises on failure."""

    def remove(self, mq: MessageQueue) -> None:
        """Forget ``mq`` (after a last persist: it is handed over)."""


class _MemoryTable:
    """The in-memory part both stores share: offsets, and which changed since persisted."""

    def __init__(self) -> None:
        self.table: dict[MessageQueue, int] = {}
        self.persisted: dict[MessageQueue, int] = {}

    def update(self, mq: MessageQueue, offset: int, *, increase_only: bool = False) -> None:
        if offset < 0:
            return
        if increase_only:
            old = self.table.get(mq)
            if old is not None and old >= offset:
                return
        self.table[mq] = offset

    def read(self, mq: MessageQueue) -> int | None:
        return self.table.get(mq)

    def remove(self, mq: MessageQueue) -> None:
        self.table.pop(mq, None)
        self.persisted.pop(mq, None)

    def changed(self, mqs: Iterable[MessageQueue] | None) -> dict[MessageQueue, int]:
        keys = self.table.keys() if mqs is None else [m for m in mqs if m in self.table]
        return {mq: self.table[mq] for mq in keys if self.persisted.get(mq) != self.table[mq]}


class RemoteOffsetStore(_MemoryTable):
    """Clustering offsets, kept by the brokers."""

    def __init__(self, group: str, requester: BrokerRequester) -> None:
        super().__init__()
        self.group = group
        self.requester = requester

    async def load(self) -> None:
        """Nothing to load: offsets are fetched per queue when it is assigned."""

    async def fetch(self, mq: MessageQueue) -> int | None:
        offset = await self.query(mq)
        if offset is not None:
            self.table[mq] = offset
            self.persisted[mq] = offset
        return offset

    async def query(self, mq: MessageQueue, *, stored_only: bool = False) -> int | None:
        resp = await self.requester.call_queue(
            mq,
            QueryConsumerOffsetRequest(
                group=self.group,
                topic=mq.topic,
                queue_id=mq.queue_id,
                set_zero_if_not_found=not stored_only,
            ),
            ok=frozenset({ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND}),
        )
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            return None
        return int_field(resp, "offset")

    async def persist(self, mqs: Iterable[MessageQueue] | None = None) -> None:
        """One batched UPDATE_CONSUMER_OFFSET per broker, in parallel. Raises the first error
        after every broker was tried."""
        changed = self.changed(mqs)
        if not changed:
            return
        by_broker: dict[str, dict[MessageQueue, int]] = {}
        for mq, offset in changed.items():
            by_broker.setdefault(mq.broker_name, {})[mq] = offset
        results = await asyncio.gather(
            *(self._commit(name, offsets) for name, offsets in by_broker.items()),
            return_exceptions=True,
        )
        for res in results:
            if isinstance(res, BaseException):
                raise res

    async def _commit(self, broker_name: str, offsets: dict[MessageQueue, int]) -> None:
        topic = next(iter(offsets)).topic
        addr = await self.requester.addr(broker_name, topic)
        if len(offsets) == 1:
            await self._commit_one(addr, *next(iter(offsets.items())))
            return
        body = OffsetsBody(
            group=self.group,
            offsets=[
                QueueOffset(topic=mq.topic, queue_id=mq.queue_id, offset=o)
                for mq, o in offsets.items()
            ],
        )
        try:
            await self.requester.call(addr, UpdateConsumerOffsetRequest(), encode_body(body))
        except RemoteError as exc:
            if exc.code != ResponseCode.OFFSET_ILLEGAL:
                raise
            # One bad entry refuses the whole batch: commit one by one so the others land.
            errors: list[MQError] = []
            for mq, o in offsets.items():
                try:
                    await self._commit_one(addr, mq, o)
                except MQError as one:
                    errors.append(one)
            if errors:
                raise errors[0] from exc
            return
        for mq, o in offsets.items():
            self.persisted[mq] = o

    async def _commit_one(self, addr: str, mq: MessageQueue, offset: int) -> None:
        try:
            header = UpdateConsumerOffsetRequest(
                group=self.group, topic=mq.topic, queue_id=mq.queue_id, offset=offset
            )
            await self.requester.call(addr, header)
        except RemoteError as exc:
            if exc.code == ResponseCode.OFFSET_ILLEGAL:
                log.warning("broker refused offset %d of %s: %s", offset, mq, exc.remark)
                self.persisted[mq] = offset  # not worth retrying every interval
            raise
        self.persisted[mq] = offset


_SAFE = re.compile(r"[^A-Za-z0-9._%@+-]")


def _safe_name(name: str) -> str:
    safe = _SAFE.sub("_", name)
    return safe if safe not in ("", ".", "..") else "_" + safe  # never this or the parent dir


class _FileTable(msgspec.Struct):
    group: str
    offsets: dict[str, dict[str, dict[str, int]]]
    """topic -> broker name -> queue id -> offset."""


class LocalOffsetStore(_MemoryTable):
    """Broadcasting offsets, in ``<base_dir>/<instance>/<group>/offsets.json``.

    ``instance`` is the consumer's instance name (not its client id, whose random part would
    make every start a new consumer): two broadcasting consumers of one group on one machine
    need different instance names, or different directories."""

    def __init__(self, base_dir: Path, instance: str, group: str, *, fsync: bool = True) -> None:
        super().__init__()
        self.group = group
        self.path = Path(base_dir) / _safe_name(instance) / _safe_name(group) / "offsets.json"
        self.fsync = fsync
        self._file: dict[MessageQueue, int] = {}
        self._lock = asyncio.Lock()

    async def load(self) -> None:
        self._file = await asyncio.to_thread(self._read_file)

    def _read_file(self) -> dict[MessageQueue, int]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        try:
            data = msgspec.json.decode(raw, type=_FileTable)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            # Better to start again from consume_from_where than not to start at all.
            log.error("ignoring unreadable offsets file %s: %s", self.path, exc)
            return {}
        out: dict[MessageQueue, int] = {}
        for topic, brokers in data.offsets.items():
            for broker, queues in brokers.items():
                for qid, offset in queues.items():
                    if qid.isdigit() and offset >= 0:
                        out[MessageQueue(topic, broker, int(qid))] = offset
        return out

    async def query(self, mq: MessageQueue, *, stored_only: bool = False) -> int | None:
        return self._file.get(mq)

    async def fetch(self, mq: MessageQueue) -> int | None:
        offset = self._file.get(mq)
        if offset is not None:
            self.table[mq] = offset
            self.persisted[mq] = offset
        return offset

    async def persist(self, mqs: Iterable[MessageQueue] | None = None) -> None:
        """Write the whole file (offsets of queues no longer assigned are kept)."""
        changed = self.changed(mqs)
        if not changed:
            return
        async with self._lock:
            merged = {**self._file, **changed}
            table: dict[str, dict[str, dict[str, int]]] = {}
            for mq, o in sorted(merged.items()):
                table.setdefault(mq.topic, {}).setdefault(mq.broker_name, {})[str(mq.queue_id)] = o
            data = json.dumps({"group": self.group, "offsets": table}, indent=1).encode()
            await asyncio.to_thread(self._write_file, data)
            self._file = merged
            self.persisted.update(changed)

    def _write_file(self, data: bytes) -> None:
        write_atomically(self.path, data, fsync=self.fsync)

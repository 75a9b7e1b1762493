"""Committed consumer offsets of clustering groups, kept by the broker and persisted.

The state is a table ``group -> topic -> queue_id -> offset`` written as one JSON file
(``config/consumerOffset.json``, RocketMQ's name) with the usual atomic dance: write a temporary
file, fsync it, rename it over the old one, fsync the directory. A reader therefore sees either
the old table or the new one, never a torn one.

Commits are acknowledged only after a write that includes them has reached the file, so a broker
killed right after answering loses no committed offset. Writes are coalesced: while one write is
in progress, every commit arriving meanwhile waits for the next one, so a thousand consumers
committing at once cost two file writes, not a thousand. Clients commit every few seconds, so the
file is small and writes are rare; the broker also writes it every ``offset_persist_interval_s``
when the in-memory table changed without a durable commit (the offsets pulls piggy-back and Pop
go through :meth:`set`), and once more at a clean stop (:meth:`close`).

The broker fsyncs this file whatever the store's flush mode: it is a few KiB written every few
seconds at most, and "committed" should mean durable even on an ASYNC_FLUSH broker. (After a
power loss there, a committed offset may lie past the recovered end of a queue; the consumer's
next pull then answers PULL_OFFSET_MOVED and it resumes at the queue's end.)

Replication: every change is also handed to ``journal`` (the metadata log,
``orbitmq.broker.metadata``). :meth:`ConsumerOffsetManager.set` is logged coalesced within a
second; :meth:`ConsumerOffsetManager.commit` returns once its offsets are logged and, in sync
replication, on the in-sync slaves. A replica applies its master's records with
``journal=False``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterable
from pathlib import Path

from orbitmq.broker.metadata.records import Journal, OffsetsDelGroup
from orbitmq.common.clock import now_ms
from orbitmq.common.errors import ConfigError, StoreIOError
from orbitmq.common.files import write_atomically
from orbitmq.common.tasks import TaskSet
from orbitmq.store.supervise import ServiceHealth

log = logging.getLogger(__name__)


class ConsumerOffsetManager:
    def __init__(self, path: Path, *, fsync: bool = True) -> None:
        self.path = path
        self.fsync = fsync
        self._table: dict[str, dict[str, dict[int, int]]] = {}
        self._commit_time: dict[tuple[str, str, int], int] = {}
        self._version = 0
        self._written = 0
        self._tasks = TaskSet("consumer-offsets", logger=log)
        self.health = ServiceHealth("offset-writer")
        self._writing: asyncio.Task[StoreIOError | None] | None = None
        self.journal: Journal | None = None

    # ------------------------------------------------------------------ load and save

    def load(self) -> None:
        """Read the file written last (a missing file is an empty table; a damaged one is a
        ConfigError naming the file, rather than a broker that silently forgets its offsets)."""
        try:
            raw = json.loads(self.path.read_text("utf-8"))
            table = raw.get("offsets", {})
            self._table = {
                str(group): {
                    str(topic): {int(q): int(o) for q, o in queues.items()}
                    for topic, queues in topics.items()
                }
                for group, topics in table.items()
            }
        except FileNotFoundError:
            return
        except (ValueError, TypeError, AttributeError) as exc:
            raise ConfigError(f"{self.path} is damaged: {exc}") from exc

    def _snapshot(self) -> bytes:
        return json.dumps({"offsets": self._table}, sort_keys=True, indent=1).encode()

    def write_now(self) -> None:
        """Write the table synchronously (at shutdown, and from the writer task's thread)."""
        data = self._snapshot()
        version = self._version
        self._write_file(data)
        self._written = max(self._written, version)

    def _write_file(self, data: bytes) -> None:
        write_atomically(self.path, data, fsync=self.fsync)

    async def persist(self) -> None:
        """Return once a write including every change made before this call has finished."""
        wanted = self._version
        while self._written < wanted:
            if self._writing is None or self._writing.done():
                self._writing = self._tasks.spawn(self._write_once(), name="offsets-write")
            error = await asyncio.shield(self._writing)
            if error is not None:
                raise error

    async def _write_once(self) -> StoreIOError | None:
        """One write; a failure is returned (for every waiter to raise) rather than raised, so
        it is logged once per outage by ``health`` instead of once per try by the task set."""
        data = self._snapshot()
        version = self._version
        try:
            await asyncio.get_running_loop().run_in_executor(None, self._write_file, data)
        except OSError as exc:
            self.health.failed(exc)  # the next commit or periodic write tries again
            return StoreIOError(f"cannot write consumer offsets to {self.path}: {exc}")
        self.health.ok()
        self._written = max(self._written, version)
        return None

    async def persist_if_changed(self) -> None:
        """The periodic write: only when something changed since the last one."""
        if self._written < self._version:
            with contextlib.suppress(StoreIOError):
                await self.persist()

    async def close(self) -> None:
        """At shutdown: let a write in progress finish, then write what is left, synchronously
        (off the loop), so a clean stop loses nothing that was set in memory."""
        if self._writing is not None and not self._writing.done():
            await asyncio.shield(self._writing)
        if self._written < self._version:
            await asyncio.get_running_loop().run_in_executor(None, self.write_now)

    @property
    def dirty(self) -> bool:
        """Changed in memory since the last write."""
        return self._written < self._version

    # ------------------------------------------------------------------ table

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        return self._table.get(group, {}).get(topic, {}).get(queue_id)

    def set(
        self, group: str, topic: str, queue_id: int, offset: int, *, journal: bool = True
    ) -> None:
        """Change one offset in memory (durable with the next :meth:`persist`)."""
        queues = self._table.setdefault(group, {}).setdefault(topic, {})
        if queues.get(queue_id) != offset:
            queues[queue_id] = offset
            self._version += 1
            if journal and self.journal is not None:
                self.journal.record_offset(group, topic, queue_id, offset)
        self._commit_time[(group, topic, queue_id)] = now_ms()

    async def commit(self, group: str, entries: Iterable[tuple[str, int, int]]) -> None:
        """Set ``(topic, queue_id, offset)`` entries of a group and wait until they are durable
        (and logged: replicated as the mode asks)."""
        for topic, queue_id, offset in entries:
            self.set(group, topic, queue_id, offset)
        await self.persist()
        if self.journal is not None:
            await self.journal.sync()

    def replace_group(self, group: str, entries: Iterable[tuple[str, int, int]]) -> None:
        """A replica: the group's table becomes exactly ``entries`` (not journaled)."""
        table: dict[str, dict[int, int]] = {}
        for topic, queue_id, offset in entries:
            table.setdefault(topic, {})[queue_id] = offset
        if self._table.get(group) != table:
            self._table[group] = table
            self._version += 1

    def offsets(self, group: str) -> dict[str, dict[int, int]]:
        """topic -> queue_id -> offset for one group (a copy)."""
        return {t: dict(q) for t, q in self._table.get(group, {}).items()}

    def last_commit_ms(self, group: str, topic: str, queue_id: int) -> int:
        return self._commit_time.get((group, topic, queue_id), 0)

    def groups(self) -> list[str]:
        return sorted(self._table)

    def topics(self, group: str) -> list[str]:
        return sorted(self._table.get(group, {}))

    def groups_of_topic(self, topic: str) -> list[str]:
        return sorted(g for g, topics in self._table.items() if topic in topics)

    def delete_group(self, group: str, *, journal: bool = True) -> bool:
        if self._table.pop(group, None) is None:
            return False
        self._version += 1
        if journal and self.journal is not None:
            self.journal.record(OffsetsDelGroup(group=group))
        return True

    def delete_topic(self, topic: str) -> None:
        for topics in self._table.values():
            if topics.pop(topic, None) is not None:
                self._version += 1

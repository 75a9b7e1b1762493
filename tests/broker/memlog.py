"""An in-memory SystemLog: the Pop and transaction system topics (revive log, half and op
topics) of a broker, kept in this process instead of its store.

Records are encoded as the store encodes them, so replays decode them the same way, and get
CommitLog offsets of their own, from BASE_OFFSET on, far above any a test's store reaches: a
half message named by its offset is found here and never in the store. One instance outlives
a broker: a broker started again with it replays what the last one appended, as a restart
replays the disk.
"""

from __future__ import annotations

from orbitmq.common.clock import SYSTEM_CLOCK
from orbitmq.common.message import MessageBatch
from orbitmq.common.record import BatchHeader, encode_batch, pack_host, record_sizes
from orbitmq.store.commit_log import AppendResult
from orbitmq.store.message_store import GetResult, GetStatus

BASE_OFFSET = 1 << 40
_STORE_HOST = pack_host(("127.0.0.1", 10911))


class MemorySystemLog:
    """`orbitmq.broker.context.SystemLog` in memory: appends are durable at once."""

    def __init__(self) -> None:
        self.queues: dict[tuple[str, int], list[bytes]] = {}
        self.records: dict[int, bytes] = {}
        """Every record by its CommitLog offset."""
        self.end = BASE_OFFSET

    def topic_records(self, topic: str, queue_id: int = 0) -> list[bytes]:
        return list(self.queues.get((topic, queue_id), []))

    async def append(self, batch: MessageBatch) -> AppendResult:
        queue = self.queues.setdefault((batch.topic, batch.queue_id), [])
        topic = batch.topic.encode()
        now = SYSTEM_CLOCK.now_ms()
        head = BatchHeader(
            topic=topic,
            queue_id=batch.queue_id,
            first_queue_offset=len(queue),
            first_physical_offset=self.end,
            flag=batch.flag,
            sys_flag=batch.sys_flag,
            born_timestamp_ms=batch.born_timestamp_ms,
            born_host=pack_host(batch.born_host),
            store_timestamp_ms=now,
            store_host=_STORE_HOST,
            reconsume_times=batch.reconsume_times,
            prepared_transaction_offset=batch.prepared_transaction_offset,
        )
        bodies = [bytes(b) for b in batch.bodies]
        sizes = record_sizes(len(topic), bodies, batch.properties)
        buf = bytes(encode_batch(head, bodies, batch.properties))
        first_q, offsets = len(queue), []
        at = 0
        for size in sizes:
            record = buf[at : at + size]
            offsets.append(self.end + at)
            self.records[self.end + at] = record
            queue.append(record)
            at += size
        self.end += at
        return AppendResult(batch.topic, batch.queue_id, first_q, offsets, sizes, self.end, now)

    async def read(
        self, topic: str, queue_id: int, offset: int, max_count: int, max_bytes: int
    ) -> GetResult:
        queue = self.queues.get((topic, queue_id), [])
        if offset >= len(queue):
            return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, offset, 0, len(queue))
        parts: list[memoryview] = []
        used = 0
        pos = offset
        while pos < len(queue) and len(parts) < max_count:
            record = queue[pos]
            if parts and used + len(record) > max_bytes:
                break
            parts.append(memoryview(record))
            used += len(record)
            pos += 1
        return GetResult(
            GetStatus.FOUND,
            pos,
            0,
            len(queue),
            queue_offsets=list(range(offset, pos)),
            body_parts=parts,
            sizes=[len(p) for p in parts],
        )

    async def read_records(self, physical_offsets: list[int]) -> list[bytes | None]:
        return [self.records.get(p) for p in physical_offsets]

    def max_offset(self, topic: str, queue_id: int) -> int:
        return len(self.queues.get((topic, queue_id), []))

    def min_offset(self, topic: str, queue_id: int) -> int:
        return 0

    async def settle(self, timeout: float = 10.0) -> None:
        return None

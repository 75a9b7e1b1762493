"""Produce, Fetch and ListOffsets: Kafka's data plane on OrbitMQ queues.

Produce validates every batch (magic 2, CRC-32C, counts) before anything is stored, refuses
transactional batches (transactions are not served: TRANSACTIONAL_ID_AUTHORIZATION_FAILED, as
the brief recommends, so clients fail fast), applies the idempotent-producer rules, and stores
each batch's records as one SEND_BATCH_MESSAGE to the partition's queue (built in one pass by
orbitmq.kafka.mapping.batch_send_body, in C when built): the records get consecutive queue
offsets and the batch's base offset is the first. acks 1 and -1 both answer
after the broker's answer, which in a replicated `sync` group means every in-sync replica has
the bytes; acks 0 gets no response.

Fetch reads each partition from its fetch offset with PULL_MESSAGE and answers uncompressed v2
batches (one per run of consecutive offsets). With nothing to return it long-polls every
partition for up to max_wait_ms and answers as soon as one has data.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from orbitmq.client.admin.client import AsyncAdminClient
from orbitmq.client.admin.types import PullStatus
from orbitmq.client.producer.producer import AsyncProducer
from orbitmq.client.route import MessageQueue
from orbitmq.common.errors import MessageTooLargeError
from orbitmq.common.message import (
    PROPERTY_PRODUCER_COUNT,
    PROPERTY_PRODUCER_ID,
    PROPERTY_PRODUCER_SEQ,
)
from orbitmq.common.record import StoredMessage
from orbitmq.kafka import errors as E
from orbitmq.kafka.config import KafkaConfig
from orbitmq.kafka.fetch_encode import encode_pull
from orbitmq.kafka.mapping import batch_send_body, timestamp_of, with_first
from orbitmq.kafka.ordering import PartitionOrder, Ticket
from orbitmq.kafka.partitions import Partitions
from orbitmq.kafka.producer_state import (
    DUPLICATE,
    FENCED,
    OUT_OF_ORDER,
    PROP_COUNT,
    PROP_EPOCH,
    PROP_PID,
    PROP_SEQ,
    SEQ_SPAN,
    ProducerStates,
    broker_producer_id,
)
from orbitmq.protocol.kafka.primitives import KafkaCodecError
from orbitmq.protocol.kafka.records import Batch, read_batches

Body = dict[str, Any]
MAX_PULL = 512


class DataPlane:
    def __init__(
        self,
        config: KafkaConfig,
        admin: AsyncAdminClient,
        producer: AsyncProducer,
        partitions: Partitions,
        states: ProducerStates,
    ) -> None:
        self.config = config
        self.admin = admin
        self.producer = producer
        self.partitions = partitions
        self.states = states

    # -- Produce -----------------------------------------------------------------------------

    async def produce(self, body: Body, order: PartitionOrder | None = None) -> Body:
        """Answer one Produce request. `order` is the connection's (several requests of it may
        be in progress); its tickets are taken here, before anything is awaited, so a task
        started per request in arrival order takes them in that order."""
        order = order or PartitionOrder()
        jobs: list[tuple[str, int, Awaitable[tuple[int, int]]]] = [
            (t["name"], p["index"], self._produce_partition(
                t["name"], p["index"], p["records"], order.take(t["name"], p["index"])))
            for t in body["topic_data"]
            for p in t["partition_data"]
        ]  # fmt: skip
        results = await asyncio.gather(*(j[2] for j in jobs))
        topics: dict[str, list[Body]] = {}
        for (topic, index, _), (code, base) in zip(jobs, results, strict=True):
            topics.setdefault(topic, []).append({
                "index": index, "error_code": code, "base_offset": base,
                "log_append_time_ms": -1, "log_start_offset": -1, "record_errors": [],
                "error_message": None,
            })  # fmt: skip
        return {"responses": [{"name": n, "partition_responses": ps} for n, ps in topics.items()],
                "throttle_time_ms": 0}  # fmt: skip

    async def _produce_partition(
        self, topic: str, index: int, records: bytes | None, ticket: Ticket
    ) -> tuple[int, int]:
        try:
            return await self._produce_ordered(topic, index, records, ticket)
        finally:
            ticket.release()

    async def _produce_ordered(
        self, topic: str, index: int, records: bytes | None, ticket: Ticket
    ) -> tuple[int, int]:
        # what does not depend on the earlier batches runs before waiting for them
        if not records:
            return E.CORRUPT_MESSAGE, -1
        try:
            batches = [(b, batch_send_body(topic, b)) for b in read_batches(records)]
        except KafkaCodecError as e:
            return (
                E.UNSUPPORTED_FOR_MESSAGE_FORMAT if "magic" in str(e) else E.CORRUPT_MESSAGE
            ), -1
        except Exception as e:  # noqa: BLE001  # a bad compressed payload: a Kafka code
            return E.code_for(e), -1
        if any(b.transactional or b.control for b, _ in batches):
            return E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1
        mq = await self.partitions.queue(topic, index)
        if mq is None:
            return E.UNKNOWN_TOPIC_OR_PARTITION, -1
        await ticket.wait()
        first_base = -1
        for batch, body in batches:
            try:
                code, base = await self._store_batch(topic, index, mq, batch, body)
            except MessageTooLargeError:
                return E.MESSAGE_TOO_LARGE, -1
            except KafkaCodecError:
                return E.CORRUPT_MESSAGE, -1
            except Exception as e:  # noqa: BLE001  # each OrbitMQ failure maps to a Kafka code
                return E.code_for(e), -1
            if code != E.NONE:
                return code, -1
            if first_base < 0:
                first_base = base
        return E.NONE, first_base

    async def _store_batch(
        self, topic: str, index: int, mq: MessageQueue, batch: Batch, body: bytes
    ) -> tuple[int, int]:
        pid, epoch, seq = batch.producer_id, batch.producer_epoch, batch.base_sequence
        idempotent = pid >= 0
        last_seq = (seq + batch.last_offset_delta) & 0x7FFFFFFF
        if idempotent:
            if self.states.needs_rebuild(pid, topic, index):
                self.states.rebuild(pid, topic, index, await self._tail(mq))
            verdict, base = self.states.check(pid, epoch, topic, index, seq, last_seq)
            if verdict == DUPLICATE:
                return E.NONE, base
            if verdict == OUT_OF_ORDER:
                return E.OUT_OF_ORDER_SEQUENCE_NUMBER, -1
            if verdict == FENCED:
                return E.INVALID_PRODUCER_EPOCH, -1
        broker_seq = 0
        if idempotent:
            # the producer's numbers on the first message, for `rebuild`, and the broker's
            # (orbitmq.broker.idempotence): a copy of this batch forwarded again after a lost
            # answer is answered by the broker with this one's offset, not stored twice
            broker_seq = self.states.broker_sequence(pid, epoch, topic, index, seq)
            first = {PROP_PID: str(pid), PROP_EPOCH: str(epoch), PROP_SEQ: str(seq),
                     PROP_COUNT: str(batch.record_count),
                     PROPERTY_PRODUCER_ID: str(broker_producer_id(pid, epoch)),
                     PROPERTY_PRODUCER_SEQ: str(broker_seq),
                     PROPERTY_PRODUCER_COUNT: str(batch.record_count)}  # fmt: skip
            body = with_first(body, first)
        result = await self.producer.send_packed(topic, body, batch.record_count, queue=mq)
        if idempotent:
            self.states.record(pid, topic, index, epoch, seq, last_seq, result.queue_offset,
                               broker_seq // SEQ_SPAN)  # fmt: skip
        return E.NONE, result.queue_offset

    async def _tail(self, mq: MessageQueue) -> list[StoredMessage]:
        end = await self.admin.max_offset(mq)
        start = max(await self.admin.min_offset(mq), end - self.config.idempotence_scan)
        out: list[StoredMessage] = []
        offset = start
        while offset < end:
            res = await self.admin.pull(mq, offset, max_nums=min(64, end - offset))
            if res.status is not PullStatus.FOUND or not res.messages:
                break
            out += res.messages
            offset = res.next_begin_offset
        return out

    # -- Fetch -------------------------------------------------------------------------------

    async def fetch(self, body: Body) -> Body:
        wanted: list[tuple[str, Body]] = [
            (t["topic"], p) for t in body["topics"] for p in t["partitions"]
        ]
        budget = body.get("max_bytes") or 50 * 1024 * 1024
        answers = await asyncio.gather(*(self._fetch_one(t, p, 0) for t, p in wanted))
        wait_ms = int(body.get("max_wait_ms") or 0)
        if (
            wait_ms > 0
            and not any(a["records"] for a in answers)
            and all(a["error_code"] == E.NONE for a in answers)
        ):
            answers = await self._long_poll(wanted, answers, wait_ms)
        topics: dict[str, list[Body]] = {}
        for (topic, _), ans in zip(wanted, answers, strict=True):
            if ans["records"] and budget <= 0:
                ans = {**ans, "records": b""}  # over the request's max_bytes: next time
            budget -= len(ans["records"] or b"")
            topics.setdefault(topic, []).append(ans)
        return {"throttle_time_ms": 0, "error_code": E.NONE, "session_id": 0,
                "responses": [{"topic": t, "partitions": ps} for t, ps in topics.items()]}  # fmt: skip

    async def _long_poll(
        self, wanted: list[tuple[str, Body]], answers: list[Body], wait_ms: int
    ) -> list[Body]:
        tasks = [asyncio.ensure_future(self._fetch_one(t, p, wait_ms)) for t, p in wanted]
        try:
            pending: set[asyncio.Future[Body]] = set(tasks)
            deadline = asyncio.get_running_loop().time() + wait_ms / 1000
            while pending:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                done, pending = await asyncio.wait(
                    pending, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
                if any(
                    not d.cancelled() and d.exception() is None and d.result()["records"]
                    for d in done
                ):
                    break
        finally:
            for t in tasks:
                if not t.done():
                    t.cancel()
        out = []
        for task, old in zip(tasks, answers, strict=True):
            ok = task.done() and not task.cancelled() and task.exception() is None
            out.append(task.result() if ok else old)
        return out

    async def _fetch_one(self, topic: str, p: Body, wait_ms: int) -> Body:
        index, offset = p["partition"], p["fetch_offset"]
        answer: Body = {"partition_index": index, "error_code": E.NONE, "high_watermark": -1,
                        "last_stable_offset": -1, "log_start_offset": -1,
                        "aborted_transactions": [], "preferred_read_replica": -1, "records": b""}  # fmt: skip
        mq = await self.partitions.queue(topic, index)
        if mq is None:
            answer["error_code"] = E.UNKNOWN_TOPIC_OR_PARTITION
            return answer
        try:
            res = await self.admin.pull_raw(mq, offset, max_nums=MAX_PULL, max_bytes=max(1024, p["partition_max_bytes"]),
                                            suspend_timeout_ms=wait_ms)  # fmt: skip
        except Exception as e:  # noqa: BLE001  # mapped to a Kafka code
            answer["error_code"] = E.code_for(e)
            return answer
        answer["high_watermark"] = answer["last_stable_offset"] = res.max_offset
        answer["log_start_offset"] = res.min_offset
        if res.status is PullStatus.OFFSET_ILLEGAL or (
            res.status is not PullStatus.FOUND and not res.min_offset <= offset <= res.max_offset
        ):
            answer["error_code"] = E.OFFSET_OUT_OF_RANGE
            return answer
        if res.status is PullStatus.FOUND and res.body:
            try:
                answer["records"] = encode_pull(res.body, offset)
            except Exception as e:  # noqa: BLE001  # a bad stored record: mapped to a Kafka code
                answer["error_code"] = E.code_for(e)
        return answer

    # -- ListOffsets -------------------------------------------------------------------------

    async def list_offsets(self, body: Body) -> Body:
        out = []
        for t in body["topics"]:
            parts = [
                await self._list_one(t["name"], p["partition_index"], p["timestamp"])
                for p in t["partitions"]
            ]
            out.append({"name": t["name"], "partitions": parts})
        return {"throttle_time_ms": 0, "topics": out}

    async def _list_one(self, topic: str, index: int, ts: int) -> Body:
        ans: Body = {"partition_index": index, "error_code": E.NONE, "timestamp": -1, "offset": -1,
                     "leader_epoch": -1, "old_style_offsets": []}  # fmt: skip
        mq = await self.partitions.queue(topic, index)
        if mq is None:
            ans["error_code"] = E.UNKNOWN_TOPIC_OR_PARTITION
            return ans
        try:
            if ts == -2:
                ans["offset"] = await self.admin.min_offset(mq)
            elif ts == -1:
                ans["offset"] = await self.admin.max_offset(mq)
            elif ts == -3:
                end = await self.admin.max_offset(mq)
                ans["offset"] = end - 1 if end > 0 else -1
                if end > 0:
                    res = await self.admin.pull(mq, end - 1, max_nums=1)
                    if res.messages:
                        ans["timestamp"] = timestamp_of(res.messages[0])
            elif ts >= 0:
                found = await self.admin.search_offset(mq, ts)
                end = await self.admin.max_offset(mq)
                ans["offset"] = found if found < end else -1
                if found < end:
                    res = await self.admin.pull(mq, found, max_nums=1)
                    if res.messages:
                        ans["timestamp"] = timestamp_of(res.messages[0])
            else:
                ans["error_code"] = E.INVALID_REQUEST
        except Exception as e:  # noqa: BLE001  # mapped to a Kafka code
            ans["error_code"] = E.code_for(e)
        return ans

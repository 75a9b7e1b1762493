"""A batch the broker stored whose answer the gateway lost: the Kafka client's retry is
forwarded again (the gateway's own table never saw the batch stored) and the broker's
deduplication answers it with the original offset, storing nothing; the gateway's broker
sequence keeps growing across a Kafka sequence wrap."""

from __future__ import annotations

import asyncio
from typing import Any

from orbitmq.client.route import MessageQueue
from orbitmq.common.errors import RequestTimeoutError
from orbitmq.kafka.producer_state import SEQ_SPAN, ProducerStates, broker_producer_id
from orbitmq.protocol.kafka.records import Record, build_batch, read_batches
from tests.kafka.conftest import Stack
from tests.kafka.raw import RawClient
from tests.kafka.test_gateway import FETCH, INIT_PID, METADATA, _batch, _fetch_values, _produce


async def test_lost_answer_retry_is_deduplicated_by_the_broker(stack: Stack) -> None:
    data = stack.gateway.data
    real = data.producer
    stored: list[int] = []
    lose = [False]

    class LosingProducer:
        """The real producer, except that the first answer is lost after the broker stored
        the batch (as when the connection drops or the answer times out)."""

        async def send_packed(
            self, topic: str, body: bytes, count: int, *, queue: MessageQueue
        ) -> Any:
            result = await real.send_packed(topic, body, count, queue=queue)
            stored.append(result.queue_offset)
            if lose[0]:
                lose[0] = False
                raise RequestTimeoutError("answer lost after the append (test)")
            return result

    data.producer = LosingProducer()  # type: ignore[assignment]  # a stand-in for one test

    def run() -> None:
        c = RawClient(stack.bootstrap)
        try:
            c.call(METADATA, 8, {"topics": [{"name": "lost"}], "allow_auto_topic_creation": True,
                                 "include_cluster_authorized_operations": False,
                                 "include_topic_authorized_operations": False})  # fmt: skip
            p = c.call(INIT_PID, 1, {"transactional_id": None, "transaction_timeout_ms": 60000})
            pid = p["producer_id"]
            lead = _produce(c, "lost", _batch(-1, -1, -1, 2, "plain"))  # offsets 0-1
            assert (lead["error_code"], lead["base_offset"]) == (0, 0)
            lose[0] = True  # the next batch's answer is lost
            lost = _produce(c, "lost", _batch(pid, 0, 0, 3, "a"))
            assert lost["error_code"] == 7  # REQUEST_TIMED_OUT: the client retries
            retry = _produce(c, "lost", _batch(pid, 0, 0, 3, "a"))
            assert (retry["error_code"], retry["base_offset"]) == (0, 2)
            again = _produce(c, "lost", _batch(pid, 0, 0, 3, "a"))  # now the gateway's table
            assert (again["error_code"], again["base_offset"]) == (0, 2)
            nxt = _produce(c, "lost", _batch(pid, 0, 3, 1, "b"))
            assert (nxt["error_code"], nxt["base_offset"]) == (0, 5)
            values = _fetch_values(c, "lost", 6)
            assert values == [b"plain-0", b"plain-1", b"a-0", b"a-1", b"a-2", b"b-0"]
            # the producer numbers stay OrbitMQ's: no record reads them back as headers
            assert _fetch_headers(c, "lost") == [[]] * 6
            forged = _produce(c, "lost", build_batch(
                [Record(0, 0, None, b"f", [("PRODUCER_ID", b"1"), ("PRODUCER_SEQ", b"0")])],
                base_timestamp=1_700_000_000_000))  # fmt: skip
            assert (forged["error_code"], forged["base_offset"]) == (0, 6)
            assert _fetch_headers(c, "lost")[6] == [("PRODUCER_ID", b"1"), ("PRODUCER_SEQ", b"0")]
        finally:
            c.close()

    try:
        await asyncio.to_thread(run)
    finally:
        data.producer = real
    # the broker answered both forwarded copies of the batch with the first one's offset
    assert stored == [0, 2, 2, 5, 6]  # plain, the lost answer, its retry, the next, forged
    mq = await stack.gateway.partitions.queue("lost", 0)
    assert mq is not None
    assert await real_max_offset(stack, mq) == 7


def _fetch_headers(c: RawClient, topic: str) -> list[list[tuple[str, bytes | None]]]:
    body = {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1, "topics": [
                {"topic": topic, "partitions": [{"partition": 0, "current_leader_epoch": -1,
                 "fetch_offset": 0, "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
            "forgotten_topics_data": [], "rack_id": ""}  # fmt: skip
    part = c.call(FETCH, 11, body)["responses"][0]["partitions"][0]
    assert part["error_code"] == 0
    return [list(r.headers) for b in read_batches(part["records"] or b"") for r in b.records()]


async def real_max_offset(stack: Stack, mq: MessageQueue) -> int:
    assert stack.gateway.admin is not None
    return await stack.gateway.admin.max_offset(mq)


def test_broker_numbers_are_stable_and_grow_across_a_sequence_wrap() -> None:
    assert broker_producer_id(7, 0) == broker_producer_id(7, 0)
    assert broker_producer_id(7, 0) != broker_producer_id(7, 1)
    assert 0 <= broker_producer_id(7, 0) < 1 << 63
    states = ProducerStates()
    top = SEQ_SPAN - 2
    assert states.broker_sequence(7, 0, "t", 0, top) == top  # unknown producer: lap 0
    states.record(7, "t", 0, 0, top, (top + 3) % SEQ_SPAN, 10, 0)  # 4 records wrap at 2**31
    assert states.broker_sequence(7, 0, "t", 0, 2) == SEQ_SPAN + 2  # past the wrap: lap 1
    states.record(7, "t", 0, 0, 2, 2, 14, 1)
    assert states.broker_sequence(7, 0, "t", 0, 3) == SEQ_SPAN + 3
    assert states.broker_sequence(7, 1, "t", 0, 0) == 0  # a new epoch starts afresh

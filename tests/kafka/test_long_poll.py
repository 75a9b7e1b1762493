"""Fetch long poll, timed with exact requests (brief K7): a Fetch with ``max_wait_ms`` W and
``min_bytes`` 1 on an empty partition is answered after about W (not at once, which would make
consumers spin, and not much later, which would stall them), and a record produced while it
waits answers it early, well before W, with that record."""

from __future__ import annotations

import asyncio
import select
import time
from typing import Any

from orbitmq.protocol.kafka.records import Record, build_batch, read_batches
from tests.kafka.conftest import Stack
from tests.kafka.raw import RawClient

PRODUCE, FETCH, METADATA = 0, 1, 3
# Slack for a loaded 2-core machine: the gateway's timer is exact, the scheduling is not.
EARLY_S, LATE_S = 0.1, 1.5


def _create(c: RawClient, topic: str) -> None:
    out = c.call(METADATA, 8, {"topics": [{"name": topic}], "allow_auto_topic_creation": True,
                               "include_cluster_authorized_operations": False,
                               "include_topic_authorized_operations": False})  # fmt: skip
    assert out["topics"][0]["error_code"] == 0, out


def _fetch_body(topic: str, wait_ms: int) -> dict[str, Any]:
    return {"replica_id": -1, "max_wait_ms": wait_ms, "min_bytes": 1, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1, "topics": [
                {"topic": topic, "partitions": [{"partition": 0, "current_leader_epoch": -1,
                 "fetch_offset": 0, "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
            "forgotten_topics_data": [], "rack_id": ""}  # fmt: skip


def _values(part: dict[str, Any]) -> list[bytes]:
    return [r.value or b"" for b in read_batches(part["records"] or b"") for r in b.records()]


async def test_an_empty_fetch_waits_max_wait_ms(stack: Stack) -> None:
    wait_ms = 1000

    def run() -> None:
        c = RawClient(stack.bootstrap)
        try:
            _create(c, "lp-empty")
            at_once = c.call(FETCH, 11, _fetch_body("lp-empty", 0))  # max_wait_ms 0: no wait
            assert at_once["responses"][0]["partitions"][0]["error_code"] == 0, at_once
            for _ in range(2):  # twice: the second one on a warm connection and route
                start = time.monotonic()
                out = c.call(FETCH, 11, _fetch_body("lp-empty", wait_ms))
                took = time.monotonic() - start
                part = out["responses"][0]["partitions"][0]
                assert part["error_code"] == 0 and _values(part) == [], out
                assert wait_ms / 1000 - EARLY_S <= took <= wait_ms / 1000 + LATE_S, took
        finally:
            c.close()

    await asyncio.to_thread(run)


async def test_a_record_produced_meanwhile_answers_early(stack: Stack) -> None:
    wait_ms = 8000

    def run() -> None:
        c, p = RawClient(stack.bootstrap), RawClient(stack.bootstrap)
        try:
            _create(c, "lp-wake")
            start = time.monotonic()
            cid = c.send(FETCH, 11, _fetch_body("lp-wake", wait_ms))
            # Nothing comes back for 0.3 s: the fetch is parked, not answered empty.
            assert not select.select([c.sock], [], [], 0.3)[0]
            batch = build_batch([Record(0, 0, b"k", b"wake-up")], base_timestamp=1_700_000_000_000)
            produced = p.call(PRODUCE, 8, {"acks": 1, "timeout_ms": 5000, "topic_data": [
                {"name": "lp-wake", "partition_data": [{"index": 0, "records": batch}]}]})  # fmt: skip
            acked = time.monotonic()
            assert produced["responses"][0]["partition_responses"][0]["error_code"] == 0, produced
            got, out = c.receive(FETCH, 11)
            answered = time.monotonic()
            assert got == cid
            part = out["responses"][0]["partitions"][0]
            assert part["error_code"] == 0 and _values(part) == [b"wake-up"], out
            assert answered - acked <= LATE_S, answered - acked
            assert answered - start <= wait_ms / 1000 / 4, answered - start
        finally:
            c.close()
            p.close()

    await asyncio.to_thread(run)

"""The gateway's own rules, with exact requests: idempotent produce (replays answered with the
original offsets, also after a gateway restart; gaps and fenced epochs refused), validation of
produced batches, transactions refused, ListOffsets, and malformed frames that close one
connection while the gateway keeps serving."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from orbitmq.kafka.config import KafkaConfig
from orbitmq.kafka.server import KafkaGateway
from orbitmq.protocol.kafka.records import ATTR_TRANSACTIONAL, Record, build_batch
from tests.kafka.conftest import Stack
from tests.kafka.raw import RawClient

PRODUCE, FETCH, LIST_OFFSETS, METADATA, INIT_PID = 0, 1, 2, 3, 22


def _produce(c: RawClient, topic: str, batch: bytes, acks: int = -1) -> dict[str, Any]:
    body = {"acks": acks, "timeout_ms": 5000, "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": batch}]}]}  # fmt: skip
    return c.call(PRODUCE, 8, body)["responses"][0]["partition_responses"][0]


def _batch(pid: int, epoch: int, seq: int, n: int, tag: str) -> bytes:
    recs = [Record(i, i, None, f"{tag}-{i}".encode()) for i in range(n)]
    return build_batch(recs, base_timestamp=1_700_000_000_000, producer_id=pid,
                       producer_epoch=epoch, base_sequence=seq)  # fmt: skip


def _fetch_values(c: RawClient, topic: str, want: int, offset: int = 0) -> list[bytes]:
    """The values from ``offset`` on, once ``want`` of them are readable (a produce is answered
    before its ConsumeQueue entries are dispatched, as in RocketMQ: a fetch right after may
    see them a moment later)."""
    import time

    deadline = time.monotonic() + 10
    while True:
        values = _fetch_once(c, topic, offset)
        if len(values) >= want or time.monotonic() > deadline:
            return values
        time.sleep(0.02)


def _fetch_once(c: RawClient, topic: str, offset: int) -> list[bytes]:
    from orbitmq.protocol.kafka.records import read_batches

    body = {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1, "topics": [
                {"topic": topic, "partitions": [{"partition": 0, "current_leader_epoch": -1,
                 "fetch_offset": offset, "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
            "forgotten_topics_data": [], "rack_id": ""}  # fmt: skip
    part = c.call(FETCH, 11, body)["responses"][0]["partitions"][0]
    assert part["error_code"] == 0
    return [r.value or b"" for b in read_batches(part["records"] or b"") for r in b.records()]


async def test_idempotent_replays_and_restart(stack: Stack) -> None:
    def first_round() -> int:
        c = RawClient(stack.bootstrap)
        try:
            c.call(METADATA, 8, {"topics": [{"name": "idem"}], "allow_auto_topic_creation": True,
                                 "include_cluster_authorized_operations": False,
                                 "include_topic_authorized_operations": False})  # fmt: skip
            pid = c.call(INIT_PID, 1, {"transactional_id": None, "transaction_timeout_ms": 60000})
            assert pid["error_code"] == 0
            p = pid["producer_id"]
            a = _produce(c, "idem", _batch(p, 0, 0, 3, "a"))
            b = _produce(c, "idem", _batch(p, 0, 3, 2, "b"))
            assert (a["error_code"], a["base_offset"], b["error_code"], b["base_offset"]) == (
                0,
                0,
                0,
                3,
            )
            again = _produce(c, "idem", _batch(p, 0, 0, 3, "a"))  # a retry of the first batch
            assert (again["error_code"], again["base_offset"]) == (0, 0)
            gap = _produce(c, "idem", _batch(p, 0, 9, 1, "gap"))
            assert gap["error_code"] == 45  # OUT_OF_ORDER_SEQUENCE_NUMBER
            assert _fetch_values(c, "idem", 5) == [b"a-0", b"a-1", b"a-2", b"b-0", b"b-1"]
            return int(p)
        finally:
            c.close()

    pid = await asyncio.to_thread(first_round)
    # a new gateway (restart): the producer's last batches are rebuilt from the queue
    gw = KafkaGateway(KafkaConfig(namesrv_addrs=(stack.namesrv,), port=0))
    await gw.start()
    try:

        def second_round() -> None:
            c = RawClient(f"127.0.0.1:{gw.port}")
            try:
                replay = _produce(c, "idem", _batch(pid, 0, 3, 2, "b"))
                assert (replay["error_code"], replay["base_offset"]) == (0, 3)
                old_epoch_gap = _produce(c, "idem", _batch(pid, 0, 7, 1, "x"))
                assert old_epoch_gap["error_code"] == 45
                bumped = _produce(c, "idem", _batch(pid, 1, 0, 1, "c"))
                assert (bumped["error_code"], bumped["base_offset"]) == (0, 5)
                fenced = _produce(c, "idem", _batch(pid, 0, 5, 1, "z"))
                assert fenced["error_code"] == 47  # INVALID_PRODUCER_EPOCH
                assert _fetch_values(c, "idem", 6) == [
                    b"a-0",
                    b"a-1",
                    b"a-2",
                    b"b-0",
                    b"b-1",
                    b"c-0",
                ]
            finally:
                c.close()

        await asyncio.to_thread(second_round)
    finally:
        await gw.stop()


async def test_bad_batches_transactions_and_acks0(stack: Stack) -> None:
    def run() -> None:
        c = RawClient(stack.bootstrap)
        try:
            c.call(METADATA, 8, {"topics": [{"name": "checks"}], "allow_auto_topic_creation": True,
                                 "include_cluster_authorized_operations": False,
                                 "include_topic_authorized_operations": False})  # fmt: skip
            good = _batch(-1, -1, -1, 2, "g")
            corrupt = bytearray(good)
            corrupt[-1] ^= 1
            assert _produce(c, "checks", bytes(corrupt))["error_code"] == 2  # CORRUPT_MESSAGE
            old = bytearray(good)
            old[16] = 1
            assert _produce(c, "checks", bytes(old))["error_code"] == 43
            txn = build_batch([Record(0, 0, None, b"t")], attributes=ATTR_TRANSACTIONAL,
                              producer_id=5, producer_epoch=0, base_sequence=0)  # fmt: skip
            assert _produce(c, "checks", txn)["error_code"] == 53
            tx_pid = c.call(
                INIT_PID, 1, {"transactional_id": "tx-1", "transaction_timeout_ms": 60000}
            )
            assert tx_pid["error_code"] == 53  # transactions: a clear refusal, at once
            assert _produce(c, "checks", good)["base_offset"] == 0
            assert _fetch_values(c, "checks", 2) == [b"g-0", b"g-1"]  # nothing of the refused ones
            body = {"replica_id": -1, "isolation_level": 0, "topics": [{"name": "checks", "partitions": [
                {"partition_index": 0, "current_leader_epoch": -1, "timestamp": t}
                for t in (-2, -1, 1_700_000_000_000)]}]}  # fmt: skip
            parts = c.call(LIST_OFFSETS, 5, body)["topics"][0]["partitions"]
            assert [p["offset"] for p in parts] == [0, 2, 0]
        finally:
            c.close()

    await asyncio.to_thread(run)


async def test_malformed_frames_close_one_connection_only(stack: Stack) -> None:
    def run() -> None:
        host, port = stack.bootstrap.rsplit(":", 1)
        for junk in (b"\x7f\xff\xff\xff", b"\x00\x00\x00\x0a" + b"\x00\x12\x00\x63" + b"\xff" * 6,
                     b"\x00\x00\x00\x08\x00\x03\x00\x0c\x00\x00\x00\x01", b"GET / HTTP/1.1\r\n\r\n"):  # fmt: skip
            s = socket.create_connection((host, int(port)), timeout=10)
            s.sendall(junk)
            s.settimeout(10)
            try:
                while s.recv(4096):  # a reply (ApiVersions ranges) or nothing, then close
                    pass
            except (ConnectionResetError, TimeoutError):
                pass
            s.close()
        c = RawClient(stack.bootstrap)
        try:
            versions = c.call(18, 3, {"client_software_name": "t", "client_software_version": "1"})
            assert versions["error_code"] == 0 and any(
                k["api_key"] == 0 for k in versions["api_keys"]
            )
        finally:
            c.close()

    await asyncio.to_thread(run)


async def test_metadata_by_topic_id_is_an_unknown_id(stack: Stack) -> None:
    """Metadata v10+ may name a topic by id only (name null): this gateway has no topic ids, so
    the answer is UNKNOWN_TOPIC_ID (100) and the connection keeps serving (found by fuzzing:
    the null name raised in the handler and closed the connection)."""

    def run() -> None:
        c = RawClient(stack.bootstrap)
        try:
            for version, name in ((12, None), (10, "")):
                out = c.call(
                    METADATA, version, {"topics": [{"name": None, "topic_id": b"\x01" * 16}]}
                )
                (topic,) = out["topics"]
                assert (topic["error_code"], topic["name"]) == (100, name), out
            ok = c.call(
                METADATA, 12, {"topics": [{"name": "by-name"}], "allow_auto_topic_creation": True}
            )
            assert ok["topics"][0]["error_code"] == 0, ok
        finally:
            c.close()

    await asyncio.to_thread(run)

"""Random and mutated Kafka request frames against a live Kafka listener: the gateway answers or
closes each bad connection and keeps serving everyone else.

The gateway runs as its own process (`orbitmq kafka`, so a crash in the C record paths would
show as a dead process, not a dead test run) in front of a NameServer and a broker in this
test's loop. Frames come from tests/fuzz/kafka_frames.py: every served API at its lowest and
highest version, mutated, mostly behind a length that fits, sometimes pipelined beside a valid
request. After each batch of connections: the process is alive and a well-formed client still
works end to end (Metadata, Produce with acks=all, Fetch of what it wrote). At the end the
gateway's log holds no traceback: a handler that raised would have closed the connection
(allowed) but is a bug all the same.

ORBITMQ_FUZZ_KAFKA_FRAMES sets the count (default 300; the long run uses more); the seed is
printed and ORBITMQ_SEED replays the same frames (the connections of a batch run at once, so a
failure that depends on their timing may need a few runs; each bug found has its own
deterministic test beside the code).
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from orbitmq.protocol.kafka.connection import encode_request
from orbitmq.protocol.kafka.records import Record, build_batch, read_batches
from orbitmq.testing import run_broker, run_namesrv, small_broker_config
from tests.fuzz.kafka_frames import mutate_frame
from tests.harness import ServerProcess
from tests.kafka.raw import RawClient

FRAMES = int(os.environ.get("ORBITMQ_FUZZ_KAFKA_FRAMES", "300"))
BATCH = 50  # connections at once, then a probe
PROBE = "fz-probe"  # a topic no seed names, so fuzzed requests do not touch it by design

pytestmark = pytest.mark.timeout(120 + FRAMES // 10)


async def _abuse(port: int, payload: bytes) -> None:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return
    try:
        writer.write(payload)
        await writer.drain()
        writer.write_eof()  # no more requests: a well-behaved gateway answers what it has, closes
        async with asyncio.timeout(0.3):  # a long poll or a rebalance may hold it longer
            while await reader.read(65536):
                pass
    except (OSError, TimeoutError):
        pass
    finally:
        writer.close()


def _probe(bootstrap: str, n: int) -> None:
    """Metadata, Produce (acks=all) and a Fetch that sees the value just written."""
    c = RawClient(bootstrap)
    try:
        meta = c.call(3, 9, {"topics": [{"name": PROBE}], "allow_auto_topic_creation": False})
        (topic,) = meta["topics"]
        assert topic["error_code"] == 0 and topic["partitions"], meta
        value = f"probe-{n}".encode()
        batch = build_batch([Record(0, 0, b"k", value, [("n", str(n).encode())])],
                            base_timestamp=1_700_000_000_000)  # fmt: skip
        part = c.call(0, 8, {"acks": -1, "timeout_ms": 5000, "topic_data": [
            {"name": PROBE, "partition_data": [{"index": 0, "records": batch}]}]})  # fmt: skip
        answer = part["responses"][0]["partition_responses"][0]
        assert answer["error_code"] == 0, answer
        offset = answer["base_offset"]
        deadline = time.monotonic() + 10  # dispatch to the ConsumeQueue follows the append
        while True:
            fetch = c.call(1, 11, _fetch_body(offset))
            fp = fetch["responses"][0]["partitions"][0]
            assert fp["error_code"] == 0, fp
            got = [
                (r.key, r.value) for b in read_batches(fp["records"] or b"") for r in b.records()
            ]
            if got:
                assert got[0] == (b"k", value), got
                return
            assert time.monotonic() < deadline, f"probe {n}: offset {offset} never readable"
            time.sleep(0.02)
    finally:
        c.close()


def _fetch_body(offset: int) -> dict[str, Any]:
    return {"replica_id": -1, "max_wait_ms": 100, "min_bytes": 1, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1, "topics": [
                {"topic": PROBE, "partitions": [{"partition": 0, "current_leader_epoch": -1,
                 "fetch_offset": offset, "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
            "forgotten_topics_data": [], "rack_id": ""}  # fmt: skip


def _create_probe_topic(bootstrap: str) -> None:
    c = RawClient(bootstrap)
    try:
        out = c.call(19, 5, {"topics": [{"name": PROBE, "num_partitions": 1, "replication_factor": 1,
                                         "assignments": [], "configs": []}], "timeout_ms": 5000})  # fmt: skip
        assert out["topics"][0]["error_code"] in (0, 36), out  # 36: it exists already
    finally:
        c.close()


async def test_fuzzed_frames_leave_the_kafka_listener_serving(tmp_path: Path) -> None:
    seed = int(os.environ.get("ORBITMQ_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (ORBITMQ_SEED={seed} replays it), {FRAMES} frames")
    rng = random.Random(seed)
    async with run_namesrv() as ns:
        addr = f"127.0.0.1:{ns.port}"
        async with run_broker(small_broker_config(tmp_path / "store", namesrv_addrs=(addr,))):
            gateway = ServerProcess("kafka", ["kafka", "--namesrv", addr, "--host", "127.0.0.1",
                                              "--port", "0"], tmp_path / "kafka.log")  # fmt: skip
            await asyncio.to_thread(gateway.start, 60)
            parked: socket.socket | None = None
            try:
                port = int(gateway.address.rpartition(":")[2])
                await asyncio.to_thread(_create_probe_topic, gateway.address)
                await asyncio.to_thread(_probe, gateway.address, -1)
                sent = 0
                while sent < FRAMES:
                    frames = [mutate_frame(rng) for _ in range(min(BATCH, FRAMES - sent))]
                    await asyncio.gather(*(_abuse(port, f) for f in frames))
                    sent += len(frames)
                    assert gateway.running, (
                        f"gateway died (seed {seed}, frames {sent})\n" + gateway.log()[-4000:]
                    )
                    await asyncio.to_thread(_probe, gateway.address, sent)
                # a JoinGroup parked in its rebalance when the gateway is stopped ends quietly:
                # a first member joins (v0: rebalance timeout = session timeout, 6 s), a second
                # join then waits for it to rejoin
                # (a group of its own: the fuzzed joins may have left members in theirs)
                join = encode_request(11, 0, 1, "fz", {"group_id": "fz-parked", "session_timeout_ms": 6000,
                                                       "member_id": "", "protocol_type": "consumer",
                                                       "protocols": [{"name": "range", "metadata": b""}]})  # fmt: skip
                first = socket.create_connection(("127.0.0.1", port), timeout=10)
                try:
                    first.sendall(join)
                    assert await asyncio.to_thread(first.recv, 4), "the first join got no answer"
                finally:
                    first.close()
                parked = socket.create_connection(("127.0.0.1", port), timeout=5)
                parked.sendall(join)
                await asyncio.sleep(0.3)
            finally:
                await asyncio.to_thread(gateway.stop)
                if parked is not None:
                    parked.close()
            log = gateway.log()
            assert "Traceback" not in log, f"a handler raised (seed {seed}):\n{log[-6000:]}"

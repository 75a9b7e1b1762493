"""SIGKILL a real ``orbitmq up`` process under an idempotent Kafka producer, restart it, replay.

The producer is this test, speaking raw Kafka requests built with ``orbitmq.protocol.kafka``
(InitProducerId, then Produce v8 with acks=-1 and v2 batches carrying producer id, epoch and
base sequence), pipelining up to five requests on one connection as librdkafka does with
idempotence. Each cycle SIGKILLs the process (by PID) at a random moment, restarts it on the
same data folder and then behaves as a Kafka client whose connection broke:

- it replays, in order, the last batches (at most five) of the current epoch of every
  partition: one acknowledged before the kill must get its original base offset back and
  store nothing; one never acknowledged is either found (stored before the kill: its original
  offset) or appended now, in both cases exactly where it belongs (the partition's next
  offset in send order);
- the next new sequence is accepted; a sequence gap gets OUT_OF_ORDER_SEQUENCE_NUMBER (45);
- the epoch is bumped with InitProducerId (producer id and epoch given, KIP-360), the new
  epoch starts at sequence 0, and a batch of the old epoch is then INVALID_PRODUCER_EPOCH (47),
  as docs/kafka.md documents.

At the end every partition is read back with Fetch from offset 0: exactly the acknowledged
batches, each once, in send order (nothing lost, no duplicate, none of the refused probes).

The seed (kill moments, batch sizes, partitions, pipelining depth) is printed; ORBITMQ_SEED
replays it. Kill cycles: ORBITMQ_KAFKA_KILL_CYCLES, default 2 (about 2-3 s each).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orbitmq.protocol.kafka.records import Record, build_batch, read_batches
from tests.crash.conftest import REPO_ROOT
from tests.kafka.raw import RawClient

PRODUCE, FETCH, LIST_OFFSETS, CREATE_TOPICS, INIT_PID = 0, 1, 2, 19, 22
TOPIC = "kafka-kill"
PARTITIONS = 3
RETRIABLE = {3, 6, 7}  # UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER, REQUEST_TIMED_OUT: retry as-is
OUT_OF_ORDER, INVALID_EPOCH = 45, 47
RETAINED = 5  # Kafka keeps (and a client retries) at most the last five batches per partition
MAX_KILL_DELAY_S = 0.6
PRODUCE_BOUND_S = 15.0  # a cycle's production phase, should the kill never cut it off
WAIT_S = 30.0


# The server reads ORBITMQ_<TABLE>_<FIELD> as settings and refuses unknown ones ([kafka] has
# no kill_cycles): this test's own variables stay out of its environment.
CHILD_ENV = {
    k: v for k, v in os.environ.items() if k not in ("ORBITMQ_KAFKA_KILL_CYCLES", "ORBITMQ_SEED")
}


def cycles() -> int:
    n = int(os.environ.get("ORBITMQ_KAFKA_KILL_CYCLES", "2"))
    if n < 1:
        raise ValueError("ORBITMQ_KAFKA_KILL_CYCLES must be at least 1")
    return n


pytestmark = [pytest.mark.crash, pytest.mark.timeout(90 + 20 * cycles())]


@dataclass(slots=True)
class Sent:
    """One produced batch and what the gateway answered (base -1 until acknowledged)."""

    partition: int
    epoch: int
    seq: int
    values: list[bytes]
    base: int = -1
    acked_before_kill: bool = False


class Server:
    """One ``orbitmq up`` process; stdout and stderr go to files (no pipe to fill)."""

    def __init__(self, folder: Path, run: int) -> None:
        self.out = folder / f"up-{run}.out"
        self.err = folder / f"up-{run}.err"
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "orbitmq", "up", "--data-dir", str(folder / "data"),
                 "--host", "127.0.0.1", "--namesrv-port", "0", "--broker-port", "0",
                 "--kafka-port", "0", "--proxy-port", "-1", "--console-port", "-1",
                 "--log-level", "WARNING"],
                cwd=REPO_ROOT, env=CHILD_ENV, stdout=out, stderr=err,
            )  # fmt: skip
        self.killed = False
        self.bootstrap = self._ready()

    def _ready(self) -> str:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and self.proc.poll() is None:
            for word in self.out.read_text(errors="replace").split():
                if word.startswith("kafka="):
                    return word.removeprefix("kafka=")
            time.sleep(0.05)
        raise AssertionError(f"orbitmq up gave no Kafka listener: {self.tail()}")

    def tail(self) -> str:
        return self.err.read_text(errors="replace")[-3000:]

    def kill(self) -> None:
        """SIGKILL by PID (from the timer thread too: Popen.kill only signals)."""
        self.killed = True
        if self.proc.poll() is None:
            self.proc.kill()

    def reap(self) -> None:
        self.kill()
        self.proc.wait(timeout=WAIT_S)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.reap()


class Producer:
    """The producer's side: sequences per (epoch, partition), every batch sent, in order."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.pid = -1
        self.epoch = -1
        self.next_seq = [0] * PARTITIONS
        self.next_offset = [0] * PARTITIONS
        self.sent: list[list[Sent]] = [[] for _ in range(PARTITIONS)]
        self.replayed = self.found_stored = self.appended_late = 0

    def new_batch(self, partition: int, n: int) -> Sent:
        seq = self.next_seq[partition]
        self.next_seq[partition] = seq + n
        values = [f"{partition}:{self.epoch}:{seq + i}".encode() for i in range(n)]
        batch = Sent(partition, self.epoch, seq, values)
        self.sent[partition].append(batch)
        return batch

    def acked(self, batch: Sent, answer: dict[str, Any]) -> None:
        """A new batch sits at its partition's next offset in send order; a replay where it was."""
        assert answer["error_code"] == 0, (batch, answer)
        if batch.base >= 0:  # a replay of an acknowledged batch: its offset, nothing stored
            assert answer["base_offset"] == batch.base, f"replay got a new offset: {batch}"
            return
        want = self.next_offset[batch.partition]
        assert answer["base_offset"] == want, (f"batch {batch} answered at "
                                               f"{answer['base_offset']}, expected {want}")  # fmt: skip
        batch.base = want
        self.next_offset[batch.partition] = want + len(batch.values)


def encode(producer: Producer, batch: Sent, *, epoch: int | None = None) -> dict[str, Any]:
    records = [Record(i, i, None, v) for i, v in enumerate(batch.values)]
    raw = build_batch(records, base_timestamp=1_700_000_000_000, producer_id=producer.pid,
                      producer_epoch=batch.epoch if epoch is None else epoch,
                      base_sequence=batch.seq)  # fmt: skip
    return {"transactional_id": None, "acks": -1, "timeout_ms": 10000, "topic_data": [
        {"name": TOPIC, "partition_data": [{"index": batch.partition, "records": raw}]}]}  # fmt: skip


def partition_answer(response: dict[str, Any]) -> dict[str, Any]:
    answer: dict[str, Any] = response["responses"][0]["partition_responses"][0]
    return answer


def produce(c: RawClient, body: dict[str, Any]) -> dict[str, Any]:
    """One Produce, retried as a Kafka client retries (same bytes) while the answer is
    retriable: right after a restart the route may not be registered yet."""
    deadline = time.monotonic() + WAIT_S
    while True:
        answer = partition_answer(c.call(PRODUCE, 8, body))
        if answer["error_code"] not in RETRIABLE or time.monotonic() > deadline:
            return answer
        time.sleep(0.05)


def connect(bootstrap: str) -> RawClient:
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            return RawClient(bootstrap)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def init_producer(c: RawClient, producer: Producer) -> None:
    """A new producer id, or (KIP-360) the same id with the next epoch."""
    answer = c.call(INIT_PID, 4, {"transactional_id": None, "transaction_timeout_ms": 60000,
                                  "producer_id": producer.pid,
                                  "producer_epoch": producer.epoch})  # fmt: skip
    assert answer["error_code"] == 0, answer
    if producer.pid >= 0:
        assert (answer["producer_id"], answer["producer_epoch"]) == (
            producer.pid,
            producer.epoch + 1,
        )
    producer.pid, producer.epoch = answer["producer_id"], answer["producer_epoch"]
    producer.next_seq = [0] * PARTITIONS


def produce_until_killed(c: RawClient, server: Server, producer: Producer) -> int:
    """Pipelined Produce requests until the timer SIGKILLs the server; how many were acked."""
    rng = producer.rng
    window = rng.randint(1, RETAINED)  # requests in flight on the connection
    timer = threading.Timer(rng.uniform(0.0, MAX_KILL_DELAY_S), server.kill)
    pending: deque[tuple[int, Sent]] = deque()
    acked = 0
    began = time.monotonic()
    timer.start()
    try:
        while time.monotonic() - began < PRODUCE_BOUND_S:
            while len(pending) < window:
                batch = producer.new_batch(rng.randrange(PARTITIONS), rng.randint(1, 8))
                pending.append((c.send(PRODUCE, 8, encode(producer, batch)), batch))
            cid, response = c.receive(PRODUCE, 8)
            want, batch = pending.popleft()
            assert cid == want
            producer.acked(batch, partition_answer(response))
            batch.acked_before_kill = True
            acked += 1
    except OSError:  # ConnectionError included: the kill cut the connection
        timer.join()
        assert server.killed, "the connection broke while the server ran"
        return acked
    finally:
        timer.cancel()
        c.close()
    raise AssertionError(f"no kill within {PRODUCE_BOUND_S} s")


def high_watermark(c: RawClient, partition: int) -> int:
    body = {"replica_id": -1, "isolation_level": 0, "topics": [{"name": TOPIC, "partitions": [
        {"partition_index": partition, "current_leader_epoch": -1, "timestamp": -1}]}]}  # fmt: skip
    part = c.call(LIST_OFFSETS, 5, body)["topics"][0]["partitions"][0]
    assert part["error_code"] == 0, part
    return int(part["offset"])


def replay_and_probe(c: RawClient, producer: Producer) -> None:
    """What a Kafka client does after a broken connection, then the refusals Kafka defines."""
    rng = producer.rng
    for p in range(PARTITIONS):
        end = high_watermark(c, p)  # stored before the replay: the kill's survivors
        current = [b for b in producer.sent[p] if b.epoch == producer.epoch]
        unacked = [b for b in current if b.base < 0]
        assert len(unacked) <= RETAINED
        for batch in current[-RETAINED:]:
            was_unacked = batch.base < 0
            producer.acked(batch, produce(c, encode(producer, batch)))
            producer.replayed += 1
            if was_unacked:
                if batch.base < end:
                    producer.found_stored += 1
                else:
                    producer.appended_late += 1
        assert producer.next_offset[p] == high_watermark(c, p), f"partition {p}: extra records"
        producer.acked(batch := producer.new_batch(p, rng.randint(1, 4)),
                       produce(c, encode(producer, batch)))  # the next sequence  # fmt: skip
    p = rng.randrange(PARTITIONS)
    gap = Sent(p, producer.epoch, producer.next_seq[p] + rng.randint(1, 9), [b"gap"])
    assert produce(c, encode(producer, gap))["error_code"] == OUT_OF_ORDER
    old = producer.epoch
    init_producer(c, producer)  # bump the epoch: sequences restart at 0
    for q in range(PARTITIONS):
        producer.acked(batch := producer.new_batch(q, 1), produce(c, encode(producer, batch)))
    fenced = Sent(p, old, 7, [b"fenced"])
    assert produce(c, encode(producer, fenced, epoch=old))["error_code"] == INVALID_EPOCH


def read_partition(c: RawClient, partition: int) -> list[bytes]:
    end = high_watermark(c, partition)
    values: list[bytes] = []
    offset = 0
    deadline = time.monotonic() + WAIT_S
    while offset < end and time.monotonic() < deadline:
        body = {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20,
                "isolation_level": 0, "session_id": 0, "session_epoch": -1, "topics": [
                    {"topic": TOPIC, "partitions": [{"partition": partition,
                     "current_leader_epoch": -1, "fetch_offset": offset, "log_start_offset": -1,
                     "partition_max_bytes": 1 << 20}]}],
                "forgotten_topics_data": [], "rack_id": ""}  # fmt: skip
        part = c.call(FETCH, 11, body)["responses"][0]["partitions"][0]
        assert part["error_code"] == 0, part
        for batch in read_batches(part["records"] or b""):
            for r in batch.records():
                at = batch.base_offset + r.offset_delta
                if at >= offset:
                    assert at == offset, f"partition {partition}: offset {offset} skipped"
                    values.append(r.value or b"")
                    offset += 1
    assert offset == end, f"partition {partition}: read {offset} of {end} records"
    return values


def test_idempotent_replays_across_sigkill(tmp_path: Path, crash_seed: int) -> None:
    rng = random.Random(crash_seed)
    n_cycles = cycles()
    producer = Producer(rng)
    began = time.monotonic()
    servers: list[Server] = []
    try:
        servers.append(Server(tmp_path, 0))
        c = connect(servers[-1].bootstrap)
        created = c.call(CREATE_TOPICS, 4, {"topics": [{"name": TOPIC, "num_partitions": PARTITIONS,
                         "replication_factor": -1, "assignments": [], "configs": []}],
                         "timeout_ms": 10000, "validate_only": False})  # fmt: skip
        assert created["topics"][0]["error_code"] == 0, created
        init_producer(c, producer)
        acked = 0
        for cycle in range(n_cycles):
            acked += produce_until_killed(c, servers[-1], producer)
            servers[-1].reap()
            servers.append(Server(tmp_path, cycle + 1))
            c = connect(servers[-1].bootstrap)
            try:
                replay_and_probe(c, producer)
            except AssertionError:
                print(f"cycle {cycle}, server stderr:\n{servers[-1].tail()}")
                raise
        batches = [b for part in producer.sent for b in part]
        for p in range(PARTITIONS):
            got = read_partition(c, p)
            want = [v for b in producer.sent[p] for v in b.values]
            lost = set(want) - set(got)
            dups = len(got) - len(set(got))
            assert not lost and not dups, f"partition {p}: lost {len(lost)}, duplicates {dups}"
            assert got == want, f"partition {p}: not the acknowledged batches in send order"
        c.close()
        print(
            f"kafka idempotence SIGKILL: {n_cycles} cycles, {len(batches)} batches "
            f"({sum(len(b.values) for b in batches)} records, {acked} acked before a kill), "
            f"replayed {producer.replayed} (unacked: {producer.found_stored} found stored, "
            f"{producer.appended_late} appended on replay), lost 0, duplicates 0, "
            f"seed {crash_seed}, {time.monotonic() - began:.1f} s"
        )
    finally:
        for server in servers:
            server.stop()

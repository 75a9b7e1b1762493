"""Idempotent producers (KIP-98): per (producer id, partition) the epoch and the last 5 batches.

A batch with a producer id carries its epoch and first sequence; the gateway accepts it when
its first sequence follows the last one stored (or is 0 for a new epoch), answers a replay of
one of the last five batches with that batch's original base offset and stores nothing, and
refuses a gap (OUT_OF_ORDER_SEQUENCE_NUMBER, 45) or an older epoch (INVALID_PRODUCER_EPOCH, 47).
The first message of every stored batch carries ``KAFKA_PID``/``KAFKA_EPOCH``/``KAFKA_SEQ``/
``KAFKA_COUNT``, so after a restart the table is rebuilt from the end of the queue (`rebuild`)
before the first batch of that producer is judged: a retry across a gateway restart is still
answered, not stored twice. Ids come from the wall clock (ms << 20 | a counter), unique across
restarts of a gateway while the clock does not go back.

The broker deduplicates too (orbitmq.broker.idempotence), which closes what this table cannot
see: a batch the broker stored whose answer the gateway lost (connection dropped, timeout,
broker killed after the append) is not in this table, so the client's retry passes the checks
here and is forwarded again. Every forwarded batch therefore also carries the broker's
``PRODUCER_ID``/``PRODUCER_SEQ``/``PRODUCER_COUNT``: a broker producer id hashed from the
Kafka (producer id, epoch) (`broker_producer_id`; the partition is the queue, already part of
the broker's key) and a broker sequence ``lap << 31 | base sequence`` (`broker_sequence`),
where ``lap`` counts how often the Kafka sequence wrapped at 2**31, so the broker sequence
keeps growing (the broker refuses a sequence below its window). The same batch forwarded
twice carries the same numbers and the broker answers the second copy with the first one's
offset, storing nothing. The lap is rebuilt from ``PRODUCER_SEQ`` with the rest.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from orbitmq.common.message import PROPERTY_PRODUCER_SEQ
from orbitmq.common.record import StoredMessage

PROP_PID = "KAFKA_PID"
PROP_EPOCH = "KAFKA_EPOCH"
PROP_SEQ = "KAFKA_SEQ"
PROP_COUNT = "KAFKA_COUNT"
RETAINED = 5
SEQ_SPAN = 1 << 31
"""Kafka sequences are int32 and wrap to 0 after 2**31 - 1."""

OK, DUPLICATE, OUT_OF_ORDER, FENCED = "ok", "duplicate", "out_of_order", "fenced"


@dataclass(slots=True)
class _Entry:
    epoch: int
    batches: deque[tuple[int, int, int]] = field(default_factory=lambda: deque(maxlen=RETAINED))
    """(first sequence, last sequence, base offset) of the last batches, oldest first."""
    lap: int = 0
    """How often the sequence had wrapped at the last batch's first sequence."""


def broker_producer_id(pid: int, epoch: int) -> int:
    """The broker-side producer id of a Kafka (producer id, epoch): stable across gateways and
    restarts, 63 bits like the SDK's random ids (a clash with one is as unlikely as two
    random ids clashing); a new epoch gets a fresh broker window, as its sequences restart."""
    digest = hashlib.blake2b(f"kafka:{pid}:{epoch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & ((1 << 63) - 1)


class ProducerStates:
    def __init__(self) -> None:
        self._entries: dict[tuple[int, str, int], _Entry] = {}
        self._counter = itertools.count()
        self._loaded: set[tuple[int, str, int]] = set()

    def new_producer_id(self) -> int:
        return (int(time.time() * 1000) << 20 | next(self._counter) % (1 << 20)) & ((1 << 63) - 1)

    def needs_rebuild(self, pid: int, topic: str, partition: int) -> bool:
        return (pid, topic, partition) not in self._loaded

    def rebuild(self, pid: int, topic: str, partition: int, tail: Iterable[StoredMessage]) -> None:
        """Load what the queue's last messages say about `pid` (oldest first)."""
        key = (pid, topic, partition)
        self._loaded.add(key)
        for msg in tail:
            p = msg.properties
            if p.get(PROP_PID) != str(pid):
                continue
            try:
                epoch, seq, count = int(p[PROP_EPOCH]), int(p[PROP_SEQ]), int(p[PROP_COUNT])
                lap = int(p.get(PROPERTY_PRODUCER_SEQ, "0")) // SEQ_SPAN
            except (KeyError, ValueError):
                continue
            last = (seq + count - 1) % SEQ_SPAN
            self.record(pid, topic, partition, epoch, seq, last, msg.queue_offset, lap)

    def check(
        self, pid: int, epoch: int, topic: str, partition: int, first_seq: int, last_seq: int
    ) -> tuple[str, int]:
        """(verdict, base offset of the original batch for DUPLICATE)."""
        entry = self._entries.get((pid, topic, partition))
        if entry is None:
            return OK, -1
        if epoch < entry.epoch:
            return FENCED, -1
        if epoch > entry.epoch:
            return (OK, -1) if first_seq == 0 else (OUT_OF_ORDER, -1)
        for first, last, base in entry.batches:
            if first == first_seq and last == last_seq:
                return DUPLICATE, base
        if entry.batches:
            expected = (entry.batches[-1][1] + 1) & 0x7FFFFFFF
            if first_seq != expected:
                return OUT_OF_ORDER, -1
        return OK, -1

    def broker_sequence(self, pid: int, epoch: int, topic: str, partition: int, first: int) -> int:
        """The broker sequence of a batch `check` passed (the next one, or the first of an
        epoch or of a producer this table does not know): ``lap << 31 | first``."""
        entry = self._entries.get((pid, topic, partition))
        if entry is None or entry.epoch != epoch or not entry.batches:
            return first
        lap = entry.lap + (1 if first < entry.batches[-1][0] else 0)  # wrapped since
        return lap * SEQ_SPAN + first

    def record(
        self,
        pid: int,
        topic: str,
        partition: int,
        epoch: int,
        first: int,
        last: int,
        base: int,
        lap: int = 0,
    ) -> None:
        key = (pid, topic, partition)
        entry = self._entries.get(key)
        if entry is None or epoch > entry.epoch:
            entry = self._entries[key] = _Entry(epoch)
        entry.batches.append((first, last, base))
        entry.lap = lap

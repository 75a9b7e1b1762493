"""Helpers for the replication-storage tests: a store with several queues, keys and a timer
copy, and what each queue should hold."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orbitmq.common.message import Message, MessageBatch
from orbitmq.common.record import decode
from orbitmq.store.config import StoreConfig
from orbitmq.store.message_store import MessageStore
from orbitmq.store.timer_index import PROPERTY_TIMER_OUT_MS, TIMER_QUEUE_ID, TIMER_TOPIC
from tests.store.conftest import small_config

QUEUES = [("alpha", 0), ("alpha", 1), ("beta", 0), (TIMER_TOPIC, TIMER_QUEUE_ID)]


def ha_config(path: Path, **overrides: Any) -> StoreConfig:
    """Small segments (several rolls in a test) and ConsumeQueue files."""
    opts: dict[str, Any] = {
        "mapped_file_size_commit_log": 96 * 1024,
        "max_message_size": 8 * 1024,
        "consume_queue_entries_per_file": 32,
    }
    return small_config(path, **{**opts, **overrides})


@dataclass(slots=True)
class Sent:
    topic: str
    qid: int
    qoff: int
    phy: int
    end: int
    body: bytes
    key: str


@dataclass
class Writer:
    """Appends random batches and remembers, per queue, what was appended where."""

    rng: random.Random
    sent: list[Sent] = field(default_factory=list)
    n: int = 0

    def append(self, store: MessageStore, count: int | None = None) -> list[Sent]:
        topic, qid = self.rng.choice(QUEUES)
        k = count or self.rng.randint(1, 20)
        msgs = []
        for _ in range(k):
            self.n += 1
            body = f"{topic}/{qid}#{self.n}".encode().ljust(self.rng.randint(20, 1500), b".")
            props = {PROPERTY_TIMER_OUT_MS: str(10**12 + self.n)} if topic == TIMER_TOPIC else {}
            msgs.append(Message(topic, body, tags=f"t{self.n % 3}", keys=[f"k{self.n}"],
                                properties=props))  # fmt: skip
        r = store.append(MessageBatch.of(topic, qid, msgs))
        out = [
            Sent(
                topic,
                qid,
                r.first_queue_offset + i,
                phy,
                phy + size,
                m.body,
                f"k{self.n - k + 1 + i}",
            )
            for i, (m, phy, size) in enumerate(zip(msgs, r.physical_offsets, r.sizes, strict=True))
        ]
        self.sent += out
        return out

    def expected(self, below: int | None = None) -> dict[tuple[str, int], list[tuple[int, bytes]]]:
        want: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
        for s in self.sent:
            if below is None or s.end <= below:
                want.setdefault((s.topic, s.qid), []).append((s.qoff, s.body))
        return want

    def cut(self, offset: int) -> None:
        self.sent = [s for s in self.sent if s.end <= offset]


def read_all(store: MessageStore) -> dict[tuple[str, int], list[tuple[int, bytes]]]:
    """Every message of every queue of ``QUEUES``, as (queue offset, body)."""
    got: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
    for topic, qid in QUEUES:
        offset = store.min_offset(topic, qid)
        while True:
            r = store.get_messages(topic, qid, offset, max_count=64, max_bytes=1 << 24)
            if not r.count:
                break
            for raw in r.messages:
                m = decode(raw)
                got.setdefault((topic, qid), []).append((m.queue_offset, m.body))
            offset = r.next_begin_offset
    return got

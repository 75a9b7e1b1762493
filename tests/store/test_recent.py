"""Reads at the tail answered from the dispatch round (store/recent.py) must be what
``get_messages`` answers: the same records, bytes, offsets and bounds; and None wherever the
round cannot say the same."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

from orbitmq.common.message import Message, MessageBatch, encode_properties
from orbitmq.store.message_store import MessageStore
from orbitmq.store.reader import GetResult
from tests.store.test_encryption import key_file


def _batch(rng: random.Random, topic: str, queue_id: int) -> MessageBatch:
    n = rng.choice([1, 2, 5, 17, 40])
    msgs = [
        Message(topic, rng.randbytes(rng.randint(1, 2000)), tags=rng.choice([None, "a"]))
        for _ in range(n)
    ]
    return MessageBatch(
        topic,
        queue_id,
        [m.body for m in msgs],
        [encode_properties(m.system_properties()) for m in msgs],
    )


def _same(told: GetResult, read: GetResult) -> None:
    assert told.status is read.status
    assert told.next_begin_offset == read.next_begin_offset
    assert (told.min_offset, told.max_offset) == (read.min_offset, read.max_offset)
    assert told.queue_offsets == read.queue_offsets
    assert told.sizes == read.sizes
    assert b"".join(told.body_parts) == b"".join(read.body_parts)
    assert [bytes(m) for m in told.messages] == [bytes(m) for m in read.messages]


def test_told_reads_are_the_reads(make_store: Callable[..., MessageStore]) -> None:
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    store = make_store()
    compared = 0

    def listener(topic: str, queue_id: int, max_offset: int) -> None:
        nonlocal compared
        for _ in range(4):
            offset = max_offset - rng.randint(1, 45)
            count = rng.choice([1, 3, 32, 1000])
            nbytes = rng.choice([1, 1500, 10_000, 4 << 20])
            told = store.read_told(topic, queue_id, offset, count, nbytes)
            read = store.get_messages(topic, queue_id, offset, count, nbytes)
            if told is not None:
                _same(told, read)
                compared += 1

    store.add_arrival_listener(listener)
    for _ in range(300):
        batches = [
            _batch(rng, rng.choice(["A", "B"]), rng.randint(0, 1))
            for _ in range(rng.choice([1, 1, 3]))
        ]
        if store.append_many(batches) is None:
            for b in batches:
                store.append(b, wake_dispatcher=False)
        store.dispatch_ready() or store.wait_for_dispatch()
    assert compared > 100  # most rounds ran here and were told
    assert store.dispatcher.recent.served == compared


def test_no_answer_outside_its_round(make_store: Callable[..., MessageStore]) -> None:
    store = make_store()
    seen: list[Any] = []

    def listener(topic: str, queue_id: int, max_offset: int) -> None:
        other: list[Any] = []
        t = threading.Thread(target=lambda: other.append(store.read_told(topic, 0, 0, 32, 1 << 20)))
        t.start()
        t.join(10)
        seen.append(("other thread", other[0]))
        # Older than what this round was told: read it.
        seen.append(
            ("before the round", store.read_told(topic, queue_id, max_offset - 3, 32, 1 << 20))
        )
        seen.append(("here", store.read_told(topic, queue_id, max_offset - 1, 32, 1 << 20)))

    store.append(_one("T"), wake_dispatcher=False)
    store.append(_one("T"), wake_dispatcher=False)
    store.add_arrival_listener(listener)
    store.dispatcher.fast = False  # decoded: nothing told
    store.dispatch_ready() or store.wait_for_dispatch()
    assert seen.pop() == ("here", None)
    store.dispatcher.fast = True
    store.append(_one("T"), wake_dispatcher=False)
    store.dispatch_ready() or store.wait_for_dispatch()
    assert seen[-3:-1] == [("other thread", None), ("before the round", None)]
    assert seen[-1][1] is not None and seen[-1][1].queue_offsets == [2]
    assert store.read_told("T", 0, 2, 32, 1 << 20) is None  # the round is over


def test_no_answer_from_an_encrypted_store(
    make_store: Callable[..., MessageStore], tmp_path: Any
) -> None:
    store = make_store(encrypt_at_rest=True, encryption_key_file=key_file(tmp_path))
    got: list[Any] = []
    store.add_arrival_listener(
        lambda t, q, m: got.append(store.read_told(t, q, m - 1, 32, 1 << 20))
    )
    store.append(_one("T"), wake_dispatcher=False)
    store.dispatch_ready() or store.wait_for_dispatch()
    assert got == [None]


def _one(topic: str) -> MessageBatch:
    return MessageBatch(topic, 0, [b"x" * 100], [encode_properties({"TAGS": "t"})])

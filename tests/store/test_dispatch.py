"""The dispatcher's two decoders (numpy for big blocks, record by record for small ones) must
build byte-identical ConsumeQueues and IndexFiles from the same CommitLog."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from orbitmq.common.message import Message, MessageBatch, encode_properties
from orbitmq.store import dispatch as dispatch_mod
from orbitmq.store.commit_log import CommitLog
from orbitmq.store.consume_queue import ConsumeQueueTable
from orbitmq.store.dispatch import Dispatcher
from orbitmq.store.index_service import IndexService
from orbitmq.store.segment import FileOps


def _fill(log: CommitLog, rng: random.Random) -> None:
    for _ in range(60):
        topic = rng.choice(["A", "B", "Tópico"])
        n = rng.choice([1, 3, 20, 40])
        bodies, props = [], []
        for _ in range(n):
            msg = Message(
                topic,
                rng.randbytes(rng.randint(1, 300)) + b"TAGS\x01decoy\x02",
                tags=rng.choice([None, "", "x", "y y"]),
                keys=rng.choice([(), ("k1",), ("k1", "k2", "k1"), ("",)]),
                properties=rng.choice(
                    [{}, {"UNIQ_CLIENT_MESSAGE_ID_KEYIDX": f"id{rng.random()}"}, {"XTAGS": "no"}]
                ),
            )
            bodies.append(msg.body)
            props.append(encode_properties(msg.system_properties()))
        log.append(MessageBatch(topic, rng.randint(0, 2), bodies, props))


def _build(
    tmp: Path, log: CommitLog, small: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[dict[str, bytes], dict[str, bytes]]:
    monkeypatch.setattr(dispatch_mod, "SMALL_BLOCK", small)
    queues = ConsumeQueueTable(tmp / "cq", 64, FileOps())
    queues.load()
    index = IndexService(tmp / "ix", 97, 5000, clock=lambda: 1_700_000_000_000)
    index.load()
    d = Dispatcher(log, queues, index)
    d.dispatch_until(log.max_offset)
    queues.flush()
    index.flush()
    cq_files = {
        str(p.relative_to(tmp / "cq")): p.read_bytes()
        for p in (tmp / "cq").rglob("*")
        if p.is_file()
    }
    ix_files = {p.name: p.read_bytes() for p in (tmp / "ix").iterdir()}
    queues.close()
    index.close()
    return cq_files, ix_files


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_small_and_vector_decoders_agree(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = CommitLog(tmp_path / "log", 128 * 1024, FileOps(), clock=lambda: 1_700_000_000_000)
    log.segments.load()
    _fill(log, random.Random(seed))
    vec = _build(tmp_path / "vec", log, 0, monkeypatch)
    small = _build(tmp_path / "small", log, 10**9, monkeypatch)
    assert vec[0] == small[0]
    assert vec[1] == small[1]
    assert vec[0] and vec[1]
    log.close()

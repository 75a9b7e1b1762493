"""The confirm offset (Kafka's high watermark): nothing past it is read, dispatched or announced."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

from orbitmq.common.errors import StoreError
from orbitmq.store.message_store import MessageStore
from tests.store.hastore import QUEUES, Writer, ha_config, read_all


def test_single_broker_follows_the_max_offset(tmp_path: Path) -> None:
    store = MessageStore(ha_config(tmp_path / "store"))
    store.open()
    w = Writer(random.Random(1))
    for _ in range(10):
        w.append(store)
        assert store.confirm_offset == store.commit_log.max_offset
    assert store.wait_for_dispatch()
    assert read_all(store) == w.expected()
    store.close()


def test_reads_and_arrivals_stop_at_the_confirm_offset(tmp_path: Path) -> None:
    store = MessageStore(ha_config(tmp_path / "store"))
    store.open()
    w = Writer(random.Random(4))
    arrivals: list[tuple[str, int, int]] = []
    lock = threading.Lock()

    def listener(topic: str, qid: int, max_offset: int) -> None:
        with lock:
            arrivals.append((topic, qid, max_offset))

    store.add_arrival_listener(listener)
    for _ in range(10):
        w.append(store)
    store.set_confirm_offset(store.commit_log.max_offset)  # a master whose slaves have it all
    assert store.wait_for_dispatch()
    confirmed = store.confirm_offset
    for _ in range(30):
        w.append(store)  # not acknowledged by any slave yet
    steps = sorted({s.end for s in w.sent if s.end > confirmed})
    rng = random.Random(0)
    for target in [confirmed, *sorted(rng.sample(steps, 5)), steps[-1]]:
        store.set_confirm_offset(target)
        assert store.confirm_offset == target
        assert store.wait_for_dispatch()
        assert read_all(store) == w.expected(below=target)
        visible = w.expected(below=target)
        for topic, qid in QUEUES:
            assert store.max_offset(topic, qid) == len(visible.get((topic, qid), []))
        for s in w.sent:
            found = store.get_message(s.phy)
            assert (found is not None) == (s.end <= target), (s, target)
        with lock:
            for topic, qid, max_offset in arrivals:
                assert max_offset <= len(visible.get((topic, qid), [])), (topic, qid, target)
            announced = {(t, q): m for t, q, m in arrivals}
        for key, msgs in visible.items():
            assert announced.get(key) == len(msgs), key
    with pytest.raises(StoreError, match="not the start of a record"):
        store.set_confirm_offset(w.sent[3].phy + 1)
    store.set_confirm_offset(None)
    assert store.confirm_offset == store.commit_log.max_offset
    store.close()


def test_slave_confirm_and_truncation(tmp_path: Path) -> None:
    """A slave serves only what the master confirmed; a cut below the confirm offset lowers it."""
    master = MessageStore(ha_config(tmp_path / "master"))
    slave = MessageStore(ha_config(tmp_path / "slave"))
    master.open()
    slave.open()
    w = Writer(random.Random(8))
    for _ in range(20):
        w.append(master)
    half = w.sent[len(w.sent) // 2].end
    slave.set_confirm_offset(0)
    while slave.commit_log.max_offset < master.commit_log.max_offset:
        at = slave.commit_log.max_offset
        end = slave.append_replicated(at, bytes(master.read_replication(at, 4096)))
        slave.set_confirm_offset(min(half, end))  # min(master's confirm, own end)
    assert slave.wait_for_dispatch()
    assert read_all(slave) == w.expected(below=half)
    cut = w.sent[len(w.sent) // 4].end
    slave.truncate_to(cut)
    assert slave.confirm_offset == cut
    assert slave.wait_for_dispatch()
    assert read_all(slave) == w.expected(below=cut)
    master.close()
    slave.close()

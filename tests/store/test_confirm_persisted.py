"""The confirm offset survives a restart (store/confirm.py): a replica that restarts, cleanly or
after a crash, serves and dispatches nothing above the confirm offset it last saved, continues
every queue after the records it holds above it, and serves them once replication confirms
them; a truncation lowers the saved offset before any new byte arrives."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from orbitmq.store.message_store import MessageStore
from tests.store.hastore import Writer, ha_config, read_all


def _filled(path: Path, seed: int) -> tuple[MessageStore, Writer, int]:
    store = MessageStore(ha_config(path))
    store.open()
    w = Writer(random.Random(seed))
    for _ in range(8):
        w.append(store)
    store.set_confirm_offset(store.commit_log.max_offset)
    assert store.wait_for_dispatch()
    confirmed = store.confirm_offset
    for _ in range(8):
        w.append(store)  # above the confirm offset: not acknowledged by the group
    return store, w, confirmed


@pytest.mark.parametrize("crash", [False, True], ids=["clean", "crash"])
def test_a_restarted_replica_serves_nothing_above_its_confirm_offset(
    tmp_path: Path, crash: bool
) -> None:
    store, w, confirmed = _filled(tmp_path / "s", 7)
    store.checkpoint()  # what the checkpointer does every second
    if crash:
        store.crash_for_test()
    else:
        store.close()
    again = MessageStore(ha_config(tmp_path / "s"))
    again.open()
    try:
        assert again.confirm_offset == confirmed < again.commit_log.max_offset
        assert again.wait_for_dispatch()
        assert read_all(again) == w.expected(below=confirmed)
        for s in w.sent:
            assert (again.get_message(s.phy) is not None) == (s.end <= confirmed)
        # the queues continue after the records above the confirm offset (a promotion appends)
        last = {(s.topic, s.qid): s.qoff for s in w.sent}
        for key, qoff in last.items():
            assert again.commit_log.queue_offsets[key] == qoff + 1
        again.set_confirm_offset(None)  # taking office as master, or the master confirms all
        assert again.wait_for_dispatch()
        assert read_all(again) == w.expected()
        w.append(again)
        assert again.wait_for_dispatch()
        assert read_all(again) == w.expected()
    finally:
        again.close()
    third = MessageStore(ha_config(tmp_path / "s"))
    third.open()  # no confirm offset saved any more: everything, as a single broker
    try:
        assert third.confirm_offset == third.commit_log.max_offset
        assert read_all(third) == w.expected()
    finally:
        third.close()


def test_truncation_lowers_the_saved_confirm_offset(tmp_path: Path) -> None:
    store, w, confirmed = _filled(tmp_path / "s", 8)
    store.set_confirm_offset(store.commit_log.max_offset)
    store.checkpoint()
    cut = next(s.phy for s in w.sent if s.phy >= confirmed)
    store.truncate_to(cut)
    w.cut(cut)
    store.crash_for_test()  # before any checkpoint after the cut
    again = MessageStore(ha_config(tmp_path / "s"))
    again.open()
    try:
        assert again.confirm_offset <= cut
        w.append(again)  # new bytes from a new master, not confirmed yet
        assert again.wait_for_dispatch()
        assert read_all(again) == w.expected(below=cut)
    finally:
        again.close()

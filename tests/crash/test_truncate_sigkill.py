"""SIGKILL a real process inside MessageStore.truncate_to, and after it, then check the store.

The child (``tests.crash.truncator``) kills itself at each step of the truncation, so every
point is hit exactly; a kill keeps the page cache, so once the cut's zeros were written the
restarted store must end exactly at the cut. A kill before that leaves the old log whole.
After a completed truncation the child appends and is killed: every acknowledged batch is
there, at queue offsets continuing right after the kept entries.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from orbitmq.store.message_store import MessageStore
from orbitmq.store.truncate import STEPS
from tests.crash.conftest import REPO_ROOT
from tests.store.hastore import Sent, Writer, ha_config, read_all


def _prepare(root: Path, seed: int) -> tuple[Writer, int]:
    store = MessageStore(ha_config(root))
    store.open()
    w = Writer(random.Random(seed))
    store.epochs.append(1, 0)
    while store.commit_log.max_offset < 4 * store.commit_log.segment_size:
        w.append(store)
    store.epochs.append(2, store.commit_log.max_offset)
    for _ in range(10):
        w.append(store)
    store.close()
    seg = store.commit_log.segment_size
    cut = w.rng.choice([s.phy for s in w.sent if s.phy < 2 * seg and s.phy % seg])
    return w, cut


def _child(root: Path, cut: int, at: str, appends: int = 0) -> list[Sent]:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.crash.truncator", "--store", str(root), "--cut", str(cut),
         "--at", at, "--appends", str(appends)],
        cwd=REPO_ROOT, capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    acked = []
    for line in proc.stdout.decode().splitlines():
        if line.startswith("ACK "):
            topic, qid, qoff, phy, end, body, key = json.loads(line[4:])
            acked.append(Sent(topic, qid, qoff, phy, end, body.encode(), key))
    return acked


def _check(store: MessageStore, sent: list[Sent], where: str) -> None:
    assert store.wait_for_dispatch(), where
    want: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
    for s in sent:
        want.setdefault((s.topic, s.qid), []).append((s.qoff, s.body))
    assert read_all(store) == want, where
    for msgs in want.values():
        assert [q for q, _b in msgs] == list(range(len(msgs))), where


@pytest.mark.parametrize("at", [*STEPS, "after"])
def test_sigkill_inside_and_after_truncation(tmp_path: Path, at: str) -> None:
    root = tmp_path / "store"
    w, cut = _prepare(root, seed=STEPS.index(at) if at in STEPS else 99)
    old_end = w.sent[-1].end
    acked = _child(root, cut, at, appends=8 if at == "after" else 0)
    store = MessageStore(ha_config(root))
    report = store.open()
    end = store.commit_log.max_offset
    where = f"killed at {at}: cut {cut}, end {end}, {report}"
    if at == "checkpoint":
        assert end == old_end, where
        kept = w.sent
    else:
        assert end >= cut, where
        kept = [s for s in w.sent if s.end <= cut]
        assert end == (acked[-1].end if acked else cut), where
        assert store.epochs.entries == ((1, 0),), where
    _check(store, kept + acked, where)
    # The store goes on: new appends continue every queue, and a clean reopen stays clean.
    w.sent = kept + acked
    for _ in range(5):
        w.append(store)
    _check(store, w.sent, where + " (appended)")
    store.close()
    store = MessageStore(ha_config(root))
    assert store.open().clean
    _check(store, w.sent, where + " (reopened)")
    store.close()

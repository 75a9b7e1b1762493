"""The timer index (numpy runs, due order) and the timer topic's ConsumeQueue tags."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from orbitmq.common.message import MessageBatch, encode_properties
from orbitmq.store.message_store import MessageStore
from orbitmq.store.timer_index import (
    TIMER_DTYPE,
    TIMER_TOPIC,
    TimerIndex,
    fired_mask,
    read_entries,
    timer_tag,
)


def timers(due: list[int] | np.ndarray, first_qoff: int = 0) -> np.ndarray:
    out = np.empty(len(due), TIMER_DTYPE)
    out["due"] = due
    out["qoff"] = np.arange(first_qoff, first_qoff + len(due))
    out["phy"] = out["qoff"] * 100
    out["size"] = 100
    return out


def test_million_timers_numpy_fast_small_and_in_order() -> None:
    rng = np.random.default_rng(5)
    n, chunk = 1_000_000, 20_000
    base = 1_700_000_000_000
    dues = base + rng.integers(0, 40 * 86_400_000, n)
    index = TimerIndex()
    tracemalloc.start()
    began = time.perf_counter()
    for at in range(0, n, chunk):
        index.add(timers(dues[at : at + chunk], at))
    insert_s = time.perf_counter() - began
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"1M timers: insert {insert_s:.2f}s, {index.nbytes / 1e6:.0f} MB, peak {peak / 1e6:.0f} MB,"
          f" {index.runs} runs")  # fmt: skip
    assert len(index) == n
    assert index.nbytes <= 30 * n  # 28 B a timer
    assert peak < 120e6
    assert insert_s < 10
    assert index.next_due() == int(dues.min())
    assert index.min_qoff() == 0
    # Pop everything, in steps of time: strictly (due, qoff) ascending, each exactly once.
    began = time.perf_counter()
    popped = []
    now = base
    while len(index):
        now += 86_400_000
        while True:
            got = index.pop_due(now, 100_000)
            if not len(got):
                break
            assert int(got["due"].max()) <= now
            popped.append(got)
    pop_s = time.perf_counter() - began
    allp = np.concatenate(popped)
    key = allp["due"] * 0 + allp["due"]
    assert len(allp) == n
    assert np.all((np.diff(key) > 0) | ((np.diff(key) == 0) & (np.diff(allp["qoff"]) > 0)))
    assert np.array_equal(np.sort(allp["qoff"]), np.arange(n))
    print(f"popped 1M in {pop_s:.2f}s")


def test_pop_limit_takes_the_global_prefix() -> None:
    index = TimerIndex()
    index.add(timers([50, 10, 30], 0))
    index.add(timers([10, 20, 40], 3))
    got = index.pop_due(35, 3)
    assert list(zip(got["due"].tolist(), got["qoff"].tolist(), strict=True)) == [
        (10, 1), (10, 3), (20, 4)
    ]  # fmt: skip
    assert index.next_due() == 30
    got = index.pop_due(35, 10)
    assert got["qoff"].tolist() == [2]
    assert len(index) == 2 and index.next_due() == 40
    assert not len(index.pop_due(39, 10))


def test_remove_and_find() -> None:
    index = TimerIndex()
    index.add(timers([5, 5, 7, 9], 0))
    assert index.find(5, 1) and not index.find(6, 1) and not index.find(5, 9)
    assert index.remove(5, 1)
    assert not index.remove(5, 1)
    assert len(index) == 3
    assert index.remove_many(np.array([3, 42])) == 1
    assert len(index) == 2
    got = index.pop_due(100, 10)
    assert got["qoff"].tolist() == [0, 2]
    assert len(index) == 0 and index.next_due() is None and index.min_qoff() is None


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.lists(st.integers(0, 200), min_size=1, max_size=30)),
            st.tuples(st.just("pop"), st.integers(0, 220), st.integers(1, 20)),
            st.tuples(st.just("remove"), st.integers(0, 400)),
        ),
        max_size=40,
    )
)
def test_matches_a_sorted_list_model(ops: list[tuple[object, ...]]) -> None:
    index = TimerIndex()
    model: list[tuple[int, int]] = []
    next_q = 0
    for op in ops:
        if op[0] == "add":
            dues = op[1]
            assert isinstance(dues, list)
            index.add(timers(dues, next_q))
            model += [(d, next_q + i) for i, d in enumerate(dues)]
            next_q += len(dues)
        elif op[0] == "pop":
            now, limit = op[1], op[2]
            assert isinstance(now, int) and isinstance(limit, int)
            model.sort()
            want = [x for x in model if x[0] <= now][:limit]
            got = index.pop_due(now, limit)
            assert list(zip(got["due"].tolist(), got["qoff"].tolist(), strict=True)) == want
            model = [x for x in model if x not in want]
        else:
            q = op[1]
            hit = [x for x in model if x[1] == q]
            assert isinstance(q, int)
            assert index.remove(hit[0][0] if hit else 0, q) == bool(hit)
            model = [x for x in model if x[1] != q]
        assert len(index) == len(model)
        assert index.next_due() == (min(model)[0] if model else None)


def test_fired_mask() -> None:
    t = timers([10, 20, 20, 30, 5], 0)
    assert fired_mask(t, 4, 20, 1).tolist() == [True, True, False, False, False]
    assert fired_mask(t, 5, 20, 2).tolist() == [True, True, True, False, True]
    assert not fired_mask(t, 0, 99, 99).any()


def test_timer_tag_values() -> None:
    assert timer_tag(b"a\x01b\x02TIMER_OUT_MS\x01123\x02") == 123
    assert timer_tag(b"TIMER_OUT_MS\x01123") == 123
    assert timer_tag(b"TIMER_CANCEL_QOFF\x017\x02") == -8
    assert timer_tag(b"XTIMER_OUT_MS\x01123\x02") == 0  # not a property name
    assert timer_tag(b"TIMER_OUT_MS\x01abc\x02") == 0
    assert timer_tag(b"TIMER_OUT_MS\x01-5\x02") == 0
    assert timer_tag(b"") == 0


def _timer_props(due: int) -> bytes:
    return encode_properties({"REAL_TOPIC": "T", "REAL_QID": "0", "TIMER_OUT_MS": str(due),
                              "TAGS": "tag"})  # fmt: skip


def test_consume_queue_tag_holds_due_time(make_store: Callable[..., MessageStore]) -> None:
    """Both dispatch paths (one by one for a few records, numpy for a block) write the due time
    as the timer topic's tag; other topics keep the tag hash; read_entries rebuilds from it."""
    store = make_store()
    small = [1_000 + i for i in range(3)]
    store.append(MessageBatch(TIMER_TOPIC, 0, [b"x"] * 3, [_timer_props(d) for d in small]))
    store.wait_for_dispatch()
    block = [5_000 - i for i in range(40)]
    store.append(MessageBatch(TIMER_TOPIC, 0, [b"y"] * 40, [_timer_props(d) for d in block]))
    store.append(MessageBatch(TIMER_TOPIC, 0, [b"c"], [b"TIMER_CANCEL_QOFF\x014\x02"]))
    store.append(MessageBatch("T", 0, [b"z"] * 20, [encode_properties({"TAGS": "tag"})] * 20))
    assert store.wait_for_dispatch()
    cq = store.queues.get(TIMER_TOPIC, 0)
    got = read_entries(cq, 0, 1_000)
    assert got.end == 44
    assert got.timers["due"].tolist() == small + block
    assert got.timers["qoff"].tolist() == list(range(43))
    assert got.cancelled.tolist() == [4]
    phys = got.timers["phy"].tolist()
    assert store.get_message(phys[5]) is not None
    assert store.get_message(phys[5]).properties["TIMER_OUT_MS"] == str(block[2])  # type: ignore[union-attr]
    other = store.queues.get("T", 0)
    assert other is not None and other.entry(0) is not None
    assert other.entry(0)[2] == other.entry(19)[2] != 0  # type: ignore[index]
    assert read_entries(cq, 40, 42).timers["qoff"].tolist() == [40, 41]
    assert len(read_entries(None, 0, 10).timers) == 0

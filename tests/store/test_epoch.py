"""The epoch file: order rules, damage detection, crash-safe rewrites, and the KIP-279 search."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orbitmq.store.epoch import (
    EpochFile,
    EpochFileError,
    NoCommonEpochError,
    divergence_offset,
    divergence_offset_by_query,
    end_offset_for,
)
from orbitmq.store.segment import FileOps
from tests.store.powercut import PowerCut


def test_append_load_and_order(tmp_path: Path) -> None:
    ef = EpochFile(tmp_path / "epoch")
    assert ef.load() == [] and ef.last_epoch == -1
    ef.append(1, 0)
    ef.append(3, 100)
    ef.append(4, 100)  # a master that wrote nothing in epoch 3 after all
    with pytest.raises(EpochFileError, match="not above"):
        ef.append(4, 200)
    with pytest.raises(EpochFileError, match="not above"):
        ef.append(2, 200)
    with pytest.raises(EpochFileError, match="before epoch"):
        ef.append(5, 50)
    again = EpochFile(tmp_path / "epoch")
    assert again.load() == [(1, 0), (3, 100), (4, 100)]
    assert again.last_epoch == 4


def test_truncate(tmp_path: Path) -> None:
    ef = EpochFile(tmp_path / "epoch")
    for e, s in ((1, 0), (2, 100), (3, 200), (4, 300)):
        ef.append(e, s)
    assert ef.truncate_after(300) == 0  # epoch 4 starts at the end: it stays
    assert ef.truncate_from(300) == 1
    assert ef.truncate_after(150) == 1
    assert ef.entries == ((1, 0), (2, 100))
    assert EpochFile(tmp_path / "epoch").load() == [(1, 0), (2, 100)]
    assert ef.truncate_from(0) == 2
    assert EpochFile(tmp_path / "epoch").load() == []


def test_end_offset_for() -> None:
    entries = [(1, 0), (3, 100), (5, 250)]
    assert end_offset_for(entries, 0, 400) == (-1, -1)
    assert end_offset_for(entries, 1, 400) == (1, 100)
    assert end_offset_for(entries, 2, 400) == (1, 100)
    assert end_offset_for(entries, 3, 400) == (3, 250)
    assert end_offset_for(entries, 9, 400) == (5, 400)


def test_damage_is_detected(tmp_path: Path) -> None:
    ef = EpochFile(tmp_path / "epoch")
    ef.append(1, 0)
    ef.append(2, 4096)
    good = (tmp_path / "epoch").read_bytes()
    for i in range(len(good)):
        bad = bytearray(good)
        bad[i] ^= 0x40
        (tmp_path / "epoch").write_bytes(bytes(bad))
        with pytest.raises(EpochFileError):
            EpochFile(tmp_path / "epoch").load()
    for n in range(len(good)):
        (tmp_path / "epoch").write_bytes(good[:n])
        with pytest.raises(EpochFileError):
            EpochFile(tmp_path / "epoch").load()


class _FailingOps(FileOps):
    def fdatasync(self, fd: int) -> None:
        raise OSError(5, "Input/output error")


def test_failed_write_keeps_the_old_list(tmp_path: Path) -> None:
    ef = EpochFile(tmp_path / "epoch")
    ef.append(1, 0)
    ef.fs = _FailingOps()
    with pytest.raises(OSError):
        ef.append(2, 10)
    assert ef.entries == ((1, 0),)
    assert EpochFile(tmp_path / "epoch").load() == [(1, 0)]


class _FreezeAfterSync(FileOps):
    def __init__(self, pc: PowerCut) -> None:
        self.pc = pc

    def fdatasync(self, fd: int) -> None:
        super().fdatasync(fd)
        self.pc.freeze()


@pytest.mark.parametrize("seed", range(12))
def test_power_cut_mid_write_keeps_old_or_new(tmp_path: Path, seed: int) -> None:
    root = tmp_path / "store"
    root.mkdir()
    rng = random.Random(seed)
    ef = EpochFile(root / "epoch")
    lists = [ef.load()]
    with PowerCut(root, random.Random(seed), torn=True) as pc:
        pc.all_durable()
        stop = rng.randrange(1, 8)
        for i in range(1, 8):
            if i == stop:
                # The power goes somewhere inside this rewrite: before or after its fsyncs.
                pc_stop_after = rng.randrange(3)
                if pc_stop_after == 0:
                    pc.freeze()
                elif pc_stop_after == 2:
                    ef.fs = _FreezeAfterSync(pc)  # the temp file is durable, the rename is not
                ef.append(i, i * 100)
                if pc_stop_after == 1:
                    pc.freeze()
                break
            ef.append(i, i * 100)
            lists.append(list(ef.entries))
        lists.append(list(ef.entries))
        pc.cut(None)
    got = EpochFile(root / "epoch").load()
    assert got in lists[-2:], (got, lists[-2:])


@given(
    st.lists(st.integers(0, 6), min_size=1, max_size=20),
    st.lists(st.integers(0, 6), min_size=1, max_size=20),
    st.integers(0, 20),
)
def test_divergence_search_agrees_both_ways(a: list[int], b: list[int], fork: int) -> None:
    """Two logs with a shared prefix of epochs, then their own: both searches cut at the same
    place, and the cut is inside the shared prefix."""
    # A "log" is a list of (epoch per record, one byte each); epochs never go down.
    shared = sorted(a)[: fork % (len(a) + 1)]
    top = shared[-1] if shared else 0
    mine = shared + [top + 1 + x for x in sorted(b)]
    theirs = shared + [top + 10 + x for x in sorted(a)]

    def epochs_of(log: list[int]) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for i, e in enumerate(log):
            if not out or out[-1][0] != e:
                out.append((e, i))
        return out

    lm, lt = epochs_of(mine), epochs_of(theirs)
    try:
        cut = divergence_offset(lm, len(mine), lt, len(theirs))
    except NoCommonEpochError:
        assert not shared
        with pytest.raises(NoCommonEpochError):
            divergence_offset_by_query(lm, len(mine), lambda e: end_offset_for(lt, e, len(theirs)))
        return
    assert cut == len(shared)
    assert mine[:cut] == theirs[:cut]
    assert cut == divergence_offset_by_query(
        lm, len(mine), lambda e: end_offset_for(lt, e, len(theirs))
    )


def test_divergence_cases() -> None:
    # The slave is behind in the master's epoch: no cut.
    assert divergence_offset([(1, 0), (2, 50)], 80, [(1, 0), (2, 50)], 100) == 80
    # A former master wrote past what the new master has of its epoch (KIP-101 case 2).
    assert divergence_offset([(1, 0), (2, 50)], 120, [(1, 0), (2, 50), (3, 100)], 150) == 100
    # Double failover (KIP-279): the local epoch 3 never reached the leader.
    local = [(1, 0), (3, 100)]
    leader = [(1, 0), (2, 80), (4, 90)]
    assert divergence_offset(local, 130, leader, 200) == 80
    assert divergence_offset_by_query(local, 130, lambda e: end_offset_for(leader, e, 200)) == 80
    # Same epoch number, another start: not common.
    assert divergence_offset([(1, 0), (2, 60)], 90, [(1, 0), (2, 50)], 100) == 50
    assert divergence_offset([], 0, [(4, 1000)], 2000) == 0
    with pytest.raises(NoCommonEpochError):
        divergence_offset([(3, 0)], 10, [(4, 0)], 20)
    with pytest.raises(NoCommonEpochError):
        divergence_offset([], 10, [(4, 0)], 20)

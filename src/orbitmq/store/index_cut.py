"""Cutting an IndexFile back to the entries below a CommitLog offset, safe against torn pages.

:meth:`orbitmq.store.index_file.IndexFile.truncate_from` (used by recovery and by
``MessageStore.truncate_to``, through ``IndexService.truncate_from``) is built from these
functions; they work on the file's mapping and know only the layout of
:mod:`orbitmq.store.index_format`.

Why from the bottom: entries are written in dispatch order, so those that survive a cut at
``cut`` are a prefix. A power cut in the middle of a cut (or of appends) leaves the entries
above that prefix as a mix, page by page, of old entries (``phy >= cut``), zeros, and entries
that straddle a 4 KiB page boundary and came back half old, half zero. Such a torn entry can
look valid (its ``phy_offset`` lost its low bytes and fell below ``cut``); popping from the top
stopped there and kept the stale entries below it. So the survivors are found from the
bottom, as the longest prefix of entries that each look written (not blank, ``key_hash >= 0``,
``time_diff >= 0``, ``0 <= prev_index <`` its own number) and have non-decreasing
``phy_offset`` in ``[0, cut)``: a stale entry is past the cut, a zeroed one is blank, and a
torn one that looks in range can only be the last survivor (the entries after it are stale
or blank).

Such a last survivor may still carry a torn ``prev_index`` (0) that would hide the older
entries of its slot. So the chains and slots are not trusted either: they are recomputed
from the survivors' key hashes (each entry links to the previous survivor of its slot, each
slot names its newest survivor) and only the values that differ are written, which for an
undamaged file are just the slots of the dropped entries. A torn survivor therefore costs at
most one wrong hint, which the caller's record check rejects, never a lost key.

The full pass is skipped when the top two entries are intact survivors and every slot points
below the entry count: a cut that removed entries from a file, or a torn tail, always leaves
one of the top two stale or blank (two adjacent entries cannot both straddle a page boundary).
"""

from __future__ import annotations

import mmap
from typing import Any, Final

import numpy as np

from orbitmq.store.index_format import ENTRY, ENTRY_DTYPE, ENTRY_SIZE, HEADER_SIZE

__all__ = ["entry_phy_and_diff", "needs_cut", "relink", "surviving_count"]

_CHUNK: Final = 1 << 16
"""Entries checked per numpy pass while looking for the end of the survivors."""
_PREV_AT: Final = 16
"""Offset of ``prev_index`` inside an entry."""


def _survivor_mask(chunk: np.ndarray[Any, Any], first: int, prev_phy: int, cut: int) -> Any:
    """Per entry of ``chunk`` (entries ``first``.. in order): does it look like a survivor?"""
    hashes = chunk["key_hash"].astype(np.int64)
    phys = chunk["phy_offset"].astype(np.int64)
    prevs = chunk["prev_index"].astype(np.int64)
    numbers = np.arange(first, first + len(chunk), dtype=np.int64)
    before = np.empty_like(phys)
    before[0] = prev_phy
    before[1:] = phys[:-1]
    return (
        ((hashes != 0) | (phys != 0))
        & (hashes >= 0)
        & (chunk["time_diff"] >= 0)
        & (before <= phys)
        & (phys < cut)
        & (prevs >= 0)
        & (prevs < numbers)
    )


def surviving_count(mm: mmap.mmap, entries_at: int, count: int, cut: int) -> int:
    """The entry count after a cut at ``cut``: 1 + the length of the surviving prefix."""
    i, prev_phy = 1, 0
    while i < count:
        m = min(_CHUNK, count - i)
        chunk = np.frombuffer(mm, ENTRY_DTYPE, m, entries_at + ENTRY_SIZE * i).copy()
        ok = _survivor_mask(chunk, i, prev_phy, cut)
        if not ok.all():
            return i + int(np.argmin(ok))
        prev_phy = int(chunk["phy_offset"][-1])
        i += m
    return count


def needs_cut(mm: mmap.mmap, entries_at: int, slot_num: int, count: int, cut: int) -> bool:
    """False when a cut at ``cut`` has nothing to drop or repair (see the module docstring)."""
    if count > 1:
        first = max(1, count - 2)
        top = np.frombuffer(mm, ENTRY_DTYPE, count - first, entries_at + ENTRY_SIZE * first).copy()
        if not _survivor_mask(top, first, 0, cut).all():
            return True
    slots: np.ndarray[Any, Any] = np.frombuffer(mm, ">i4", slot_num, HEADER_SIZE)
    try:
        return bool(((slots < 0) | (slots >= count)).any())
    finally:
        del slots


def relink(mm: mmap.mmap, entries_at: int, slot_num: int, count: int) -> tuple[int, int]:
    """Make the chains and slots of entries ``1..count-1`` what their key hashes say.

    Each entry's ``prev_index`` becomes the previous entry of its slot (0 for the first), each
    slot its newest entry (0 when none). Only differing values are written. Returns (slots in
    use, chain links rewritten). The entries must all have ``key_hash >= 0``.
    """
    m = count - 1
    newest = np.zeros(slot_num, dtype=np.int64)
    repaired = 0
    if m > 0:
        view = np.frombuffer(mm, ENTRY_DTYPE, m, entries_at + ENTRY_SIZE)
        try:
            hashes = view["key_hash"].astype(np.int64)
            stored = view["prev_index"].astype(np.int64)
        finally:
            del view
        # A stable sort by slot, as in IndexFile.put_hashes: (slot << bits) | position.
        bits = m.bit_length()
        keyed = np.sort(((hashes % slot_num) << bits) | np.arange(m, dtype=np.int64))
        del hashes
        by_slot = keyed >> bits
        numbers = (keyed & ((1 << bits) - 1)) + 1  # entry numbers, in slot order
        same = by_slot[1:] == by_slot[:-1]
        expected_sorted = np.zeros(m, dtype=np.int64)
        expected_sorted[1:] = np.where(same, numbers[:-1], 0)
        expected = np.empty(m, dtype=np.int64)
        expected[numbers - 1] = expected_sorted
        wrong = np.flatnonzero(expected != stored)
        for j in wrong.tolist():
            at = entries_at + ENTRY_SIZE * (j + 1) + _PREV_AT
            mm[at : at + 4] = int(expected[j]).to_bytes(4, "big", signed=True)
        repaired = len(wrong)
        last = np.ones(m, dtype=bool)
        last[:-1] = ~same
        newest[by_slot[last]] = numbers[last]
    slots: np.ndarray[Any, Any] = np.frombuffer(mm, ">i4", slot_num, HEADER_SIZE)
    try:
        differ = np.flatnonzero(slots != newest)
        slots[differ] = newest[differ]
    finally:
        del slots
    return int(np.count_nonzero(newest)), repaired


def entry_phy_and_diff(mm: mmap.mmap, entries_at: int, number: int) -> tuple[int, int]:
    """``phy_offset`` and ``time_diff`` of entry ``number``."""
    _h, phy, diff, _p = ENTRY.unpack_from(mm, entries_at + ENTRY_SIZE * number)
    return phy, diff

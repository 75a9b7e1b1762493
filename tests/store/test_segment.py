"""A segment deleted by retention while a reader holds it: the reader's view keeps working."""

from __future__ import annotations

from pathlib import Path

import pytest

from orbitmq.store.segment import FileOps, OpenFiles, Segment, SparseSegment


@pytest.mark.parametrize("sparse", [False, True])
def test_a_reader_of_a_destroyed_segment_still_reads(tmp_path: Path, sparse: bool) -> None:
    path = tmp_path / "00000000000000000000"
    fs = FileOps()
    seg: Segment
    if sparse:
        seg = SparseSegment(path, 0, 4096, fs, OpenFiles(8), create=True)
    else:
        seg = Segment(path, 0, 4096, fs, create=True)
    seg.write(0, b"held")
    found = seg  # what a reader got from SegmentQueue.find just before retention ran
    early = found.view if sparse else None  # a sparse segment maps only when read
    seg.destroy()
    assert not path.exists() and seg.closed
    view = early if early is not None else found.view
    assert bytes(view[0:4]) == b"held"
    seg.flush()  # a flush after the delete is a no-op, not an error

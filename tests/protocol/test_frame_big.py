"""Frames with a large body are gathered in pieces (FrameDecoder's BIG_BODY path) and come out
exactly as when fed whole, however the stream is cut, with small frames before, between and
after them (issue #15: the pull client's copies)."""

from __future__ import annotations

import random

import pytest

from orbitmq.common.errors import ProtocolError
from orbitmq.protocol.frame import BIG_BODY, Frame, FrameDecoder, encode_bytes


def _stream(rng: random.Random) -> tuple[bytes, list[Frame]]:
    frames = []
    for i in range(6):
        size = rng.choice([0, 5, BIG_BODY - 1, BIG_BODY, BIG_BODY + rng.randrange(100_000)])
        body = rng.randbytes(size)
        frames.append(Frame(10 + i, i, 1, {"n": i, "s": "x" * rng.randrange(50)}, body))
    return b"".join(encode_bytes(f) for f in frames), frames


@pytest.mark.parametrize("seed", range(6))
def test_any_cut_gives_the_same_frames(seed: int) -> None:
    rng = random.Random(seed)
    print("seed", seed)
    data, want = _stream(rng)
    dec = FrameDecoder()
    got: list[Frame] = []
    sizes = [len(encode_bytes(f)) for f in want]
    pos = 0
    while pos < len(data):
        step = rng.choice([1, 7, 4096, 65536, 300_000])
        piece = data[pos : pos + step]
        got += dec.feed(piece if rng.random() < 0.5 else memoryview(piece))
        pos += step
        fed = min(pos, len(data))
        assert dec.buffered == fed - sum(sizes[: len(got)])  # all but the frames returned
    assert dec.buffered == 0
    assert [(f.code, f.opaque, f.fields, bytes(f.body)) for f in got] == [
        (f.code, f.opaque, f.fields, bytes(f.body)) for f in want
    ]
    assert all(isinstance(f.body, bytes) for f in got)


def test_buffered_counts_a_big_frame_in_progress() -> None:
    data = encode_bytes(Frame(1, 1, 0, {}, b"z" * (BIG_BODY + 10)))
    dec = FrameDecoder()
    assert dec.feed(data[:100_000]) == []
    assert dec.feed(data[100_000:200_000]) == []
    assert dec.buffered > 0
    (frame,) = dec.feed(data[200_000:])
    assert frame.body == b"z" * (BIG_BODY + 10)
    assert dec.buffered == 0


def test_bad_header_of_a_big_frame_is_a_protocol_error() -> None:
    good = encode_bytes(Frame(1, 1, 0, {"a": 1}, b"z" * (BIG_BODY + 10)))
    bad = good[:16] + b"\xc1" + good[17:]  # 0xc1 is never valid msgpack
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(bad[:100_000])

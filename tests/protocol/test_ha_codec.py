"""The HA link codec: round trips, any split of the stream, garbage -> ProtocolError only."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orbitmq.common.errors import ProtocolError
from orbitmq.protocol import ha
from orbitmq.protocol.ha import (
    Ack,
    HaDecoder,
    HaError,
    Handshake,
    Heartbeat,
    SegmentKey,
    Transfer,
)

offsets = st.integers(0, 2**63 - 1)
epochs32 = st.integers(0, 2**32 - 1)


@st.composite
def epoch_lists(draw: st.DrawFn) -> tuple[tuple[int, int], ...]:
    ep = sorted(set(draw(st.lists(st.integers(0, 1000), max_size=6))))
    starts = sorted(draw(st.lists(st.integers(0, 10**12), min_size=len(ep), max_size=len(ep))))
    return tuple(zip(ep, starts, strict=True))


@st.composite
def transfers(draw: st.DrawFn) -> Transfer:
    master = draw(st.integers(0, 1000))
    epoch = draw(st.integers(0, master))
    start = draw(st.integers(0, 10**12))
    offset = start + draw(st.integers(0, 10**9))
    return Transfer(master, offset, epoch, start, draw(offsets), draw(st.binary(max_size=300)))


frames = st.one_of(
    st.builds(
        Handshake, epochs32, st.integers(0, 2**64 - 1), st.text(max_size=30), epoch_lists(), offsets
    ),
    transfers(),
    st.builds(Ack, epochs32, offsets, offsets),
    st.builds(Heartbeat, epochs32, offsets, offsets),
    st.builds(HaError, epochs32, st.integers(0, 65535), st.text(max_size=40)),
    st.builds(SegmentKey, epochs32, offsets, st.binary(min_size=1, max_size=ha.MAX_WRAPPED)),
)


@given(st.lists(frames, max_size=6), st.lists(st.integers(1, 60), max_size=20))
def test_any_split_of_the_stream(sent: list[ha.HaFrame], cuts: list[int]) -> None:
    stream = b"".join(ha.encode(f) for f in sent)
    decoder = HaDecoder()
    got: list[ha.HaFrame] = []
    pos = 0
    for cut in cuts:
        got += decoder.feed(stream[pos : pos + cut])
        pos += cut
    got += decoder.feed(stream[pos:])
    assert got == sent
    assert decoder.buffered == 0


@given(st.binary(max_size=400))
def test_garbage_raises_only_protocol_error(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        HaDecoder(max_payload=1 << 16).feed(data)


@given(frames, st.integers(0, 200), st.integers(0, 255))
def test_corrupted_frames_raise_only_protocol_error(frame: ha.HaFrame, at: int, byte: int) -> None:
    raw = bytearray(ha.encode(frame))
    raw[at % len(raw)] = byte
    with contextlib.suppress(ProtocolError):
        HaDecoder(max_payload=1 << 16).feed(bytes(raw))


def test_transfer_payload_is_not_copied_on_encode() -> None:
    payload = memoryview(bytearray(b"x" * 100))
    parts = ha.encode_parts(Transfer(3, 100, 2, 50, 90, payload))
    assert parts[1] is payload


def test_limits() -> None:
    big = Transfer(1, 0, 1, 0, 0, bytes(1025))
    with pytest.raises(ProtocolError, match="over"):
        ha.encode(big, max_payload=1024)
    with pytest.raises(ProtocolError, match="payload"):
        HaDecoder(max_payload=1024).feed(ha.encode(big))
    with pytest.raises(ProtocolError, match="before its epoch"):
        ha.encode(Transfer(1, 10, 1, 11, 0))
    with pytest.raises(ProtocolError, match="above the master epoch"):
        ha.encode(Transfer(1, 10, 2, 0, 0))
    with pytest.raises(ProtocolError, match="increase"):
        ha.encode(Handshake(1, 1, "b", ((2, 0), (1, 5)), 0))
    with pytest.raises(ProtocolError, match="version"):
        HaDecoder().feed(b"\0\0\0\x16\x02\x03" + bytes(20))
    with pytest.raises(ProtocolError, match="type"):
        HaDecoder().feed(b"\0\0\0\x16\x01\x09" + bytes(20))
    with pytest.raises(ProtocolError, match="name"):
        ha.encode(Handshake(1, 1, "n" * 256, (), 0))


def test_every_frame_carries_the_master_epoch() -> None:
    for frame in (
        Handshake(7, 1, "b", ((1, 0), (7, 100)), 120),
        Transfer(7, 100, 7, 100, 90, b"abc"),
        Ack(7, 103, 100),
        Heartbeat(7, 103, 103),
        HaError(7, ha.ERR_FENCED, "epoch 6 < 7"),
        SegmentKey(7, 1 << 30, bytes(84)),
    ):
        (decoded,) = HaDecoder().feed(ha.encode(frame))
        assert decoded == frame
        assert decoded.master_epoch == 7


def test_segment_key_limits() -> None:
    for bad in (b"", bytes(ha.MAX_WRAPPED + 1)):
        with pytest.raises(ProtocolError):
            ha.encode(SegmentKey(1, 0, bad))

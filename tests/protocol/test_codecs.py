"""Sans-IO codecs: round trips, any split of the stream, and garbage."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orbitmq.common.errors import ProtocolError
from orbitmq.protocol.frame import Frame, FrameDecoder, encode_bytes
from orbitmq.protocol.messages import decode_records, decode_send_body, encode_send_body

field_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
frames = st.builds(
    Frame,
    code=st.integers(0, 65535),
    opaque=st.integers(0, 2**32 - 1),
    flags=st.integers(0, 3),
    fields=st.dictionaries(st.text(max_size=10), field_values, max_size=5),
    body=st.binary(max_size=300),
)


@given(st.lists(frames, max_size=6), st.lists(st.integers(1, 50), max_size=20))
def test_frames_survive_any_split(sent: list[Frame], cuts: list[int]) -> None:
    stream = b"".join(encode_bytes(f) for f in sent)
    decoder = FrameDecoder()
    got: list[Frame] = []
    pos = 0
    for cut in cuts:
        got += decoder.feed(stream[pos : pos + cut])
        pos += cut
    got += decoder.feed(stream[pos:])
    assert [(f.code, f.opaque, f.flags, f.fields, f.body) for f in got] == [
        (f.code, f.opaque, f.flags, f.fields, f.body) for f in sent
    ]
    assert decoder.buffered == 0


@given(st.binary(max_size=400))
def test_garbage_raises_only_protocol_error(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        FrameDecoder(max_frame_size=1 << 16).feed(data)


def test_limits() -> None:
    with pytest.raises(ProtocolError, match="outside"):
        FrameDecoder(max_frame_size=100).feed(struct.pack(">IBBHII", 101, 1, 0, 1, 1, 0))
    with pytest.raises(ProtocolError, match="outside"):
        FrameDecoder().feed(struct.pack(">IBBHII", 3, 1, 0, 1, 1, 0))
    with pytest.raises(ProtocolError, match="header length"):
        FrameDecoder().feed(struct.pack(">IBBHII", 12, 1, 0, 1, 1, 5))


@given(st.lists(st.tuples(st.binary(max_size=50), st.binary(max_size=20)), max_size=30))
def test_send_body_round_trip(messages: list[tuple[bytes, bytes]]) -> None:
    bodies = [b for b, _ in messages]
    props = [p for _, p in messages]
    decoded = decode_send_body(encode_send_body(bodies, props))
    assert [bytes(b) for b in decoded.bodies] == bodies
    assert decoded.properties == props
    assert decoded.properties_block == b"".join(props)
    assert decoded.properties_starts.tolist() == [
        sum(map(len, props[:i])) for i in range(len(props))
    ]


@given(st.binary(max_size=200))
def test_send_body_garbage(data: bytes) -> None:
    try:
        decoded = decode_send_body(data)
    except ProtocolError:
        return
    # Whatever decodes must tile the input exactly.
    assert 4 + 6 * len(decoded.bodies) + sum(map(len, decoded.bodies)) + len(
        decoded.properties_block
    ) == len(data)


def test_header_with_invalid_utf8_is_a_protocol_error() -> None:
    header = b"\x81\xa1\x80\x01"  # {"\x80": 1}: a key that is not UTF-8
    raw = struct.pack(">IBBHII", 12 + len(header), 1, 0, 30, 1, len(header)) + header
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(raw)


def test_a_code_outside_the_field_is_a_protocol_error() -> None:
    from orbitmq.common.errors import ProtocolError
    from orbitmq.protocol.frame import Frame, encode

    with pytest.raises(ProtocolError, match="cannot be encoded"):
        encode(Frame(200050))


@given(st.binary(max_size=400))
def test_pull_body_garbage_raises_only_protocol_error(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        decode_records(data)


def test_pull_body_with_a_bad_record_names_its_position() -> None:
    from orbitmq.common.record import BatchHeader, encode_batch, pack_host

    head = BatchHeader(b"T", 0, 0, 0, 0, 0, 1, pack_host(("127.0.0.1", 1)), 2,
                       pack_host(("127.0.0.1", 2)), 0, 0)  # fmt: skip
    body = encode_batch(head, [b"a", b"b"], [b"", b""])
    assert [m.body for m in decode_records(bytes(body))] == [b"a", b"b"]
    body[88] ^= 1  # the first record's body
    with pytest.raises(ProtocolError, match="pull body: record at 0: CRC mismatch"):
        decode_records(bytes(body))

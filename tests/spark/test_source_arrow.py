"""Pull bodies to Arrow: equal to the reference decoder on any valid records, and a clear
RecordError (never another exception) on damaged ones."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pyarrow")

import contextlib

from orbitmq.common.message import encode_properties
from orbitmq.common.record import (
    BatchHeader,
    RecordError,
    decode_batch,
    encode_batch,
    pack_host,
)
from orbitmq.spark.arrow import records_to_batch

_text = st.text(
    st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), max_size=12
)
_props = st.dictionaries(_text, _text, max_size=4)


def _encode(bodies: list[bytes], props: list[dict[str, str]], first: int = 7) -> bytes:
    head = BatchHeader(
        b"topic", 2, first, 0, 0, 0, 1_700_000_000_000, pack_host(("127.0.0.1", 1)),
        1_700_000_000_500, pack_host(("127.0.0.1", 2)), 1, 0,
    )  # fmt: skip
    return bytes(encode_batch(head, bodies, [encode_properties(p) for p in props]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=40), _props), min_size=1, max_size=30))
def test_equals_reference_decoder(records: list[tuple[bytes, dict[str, str]]]) -> None:
    data = _encode([b for b, _ in records], [p for _, p in records])
    batch = records_to_batch([data], "topic", "broker-a")
    ref = decode_batch(data)
    assert batch.column("value").to_pylist() == [m.body for m in ref]
    assert [dict(p) for p in batch.column("properties").to_pylist()] == [m.properties for m in ref]
    assert batch.column("tags").to_pylist() == [m.properties.get("TAGS") for m in ref]
    assert batch.column("queue_offset").to_pylist() == [m.queue_offset for m in ref]
    assert batch.column("reconsume_times").to_pylist() == [1] * len(ref)


def test_end_offset_drops_records_past_the_range() -> None:
    data = _encode([b"a", b"b", b"c"], [{}, {}, {}], first=10)
    batch = records_to_batch([data], "topic", "broker-a", end=12)
    assert batch.column("queue_offset").to_pylist() == [10, 11]


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_damaged_input_is_a_record_error(data: st.DataObject) -> None:
    good = _encode([b"x" * 30, b"ORB1 in a body", b""], [{"TAGS": "t"}, {}, {"k": "v"}])
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    print("seed", seed)
    raw = bytearray(good)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    with contextlib.suppress(RecordError):
        records_to_batch([bytes(raw)], "topic", "broker-a")


def test_a_body_flagged_compressed_that_does_not_inflate_is_a_record_error() -> None:
    """Found by the test above (byte 39, the low byte of SYS_FLAG, set to 1): structurally a
    record, but its body is not zlib data."""
    raw = bytearray(_encode([b"x" * 30, b"ORB1 in a body", b""], [{"TAGS": "t"}, {}, {"k": "v"}]))
    raw[39] = 1
    with pytest.raises(RecordError, match="does not decompress"):
        records_to_batch([bytes(raw)], "topic", "broker-a")


@given(st.binary(max_size=300))
@settings(max_examples=100, deadline=None)
def test_random_bytes_never_crash(raw: bytes) -> None:
    with contextlib.suppress(RecordError):
        records_to_batch([raw], "topic", "broker-a")

"""The conversion's shortcuts (records of one size, properties split with numpy, the picked
names found in one pass) give what the reference decoder gives, and fall back when their
proof fails."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pyarrow")

import itertools

import numpy as np

from orbitmq.common.message import (
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    encode_properties,
)
from orbitmq.common.record import MAGIC, BatchHeader, decode_batch, encode_batch, pack_host
from orbitmq.spark.arrow import records_to_batch, split_records

_NAMES = st.sampled_from([PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_UNIQ_KEY, "a", "é", ""])
_VALUES = st.text(
    st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), max_size=8
)


def _encode(bodies: list[bytes], props: list[bytes], first: int = 3) -> bytes:
    head = BatchHeader(
        b"topic", 1, first, 0, 0, 0, 1_700_000_000_000, pack_host(("127.0.0.1", 1)),
        1_700_000_000_500, pack_host(("127.0.0.1", 2)), 0, 0,
    )  # fmt: skip
    return bytes(encode_batch(head, bodies, props))


def _check(data: bytes, chunks: list[bytes] | None = None) -> None:
    batch = records_to_batch(chunks or [data], "topic", "b")
    ref = decode_batch(data)
    assert batch.column("value").to_pylist() == [m.body for m in ref]
    assert [dict(p) for p in batch.column("properties").to_pylist()] == [m.properties for m in ref]
    for column, name in (("tags", PROPERTY_TAGS), ("msg_id", PROPERTY_UNIQ_KEY)):
        assert batch.column(column).to_pylist() == [m.properties.get(name) for m in ref]
    keys = [m.properties.get(PROPERTY_KEYS) for m in ref]
    assert batch.column("key").to_pylist() == [None if k is None else k.encode() for k in keys]
    assert batch.column("queue_offset").to_pylist() == [m.queue_offset for m in ref]


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.binary(max_size=20), st.lists(st.tuples(_NAMES, _VALUES), max_size=4)),
        min_size=1,
        max_size=20,
    ),
    st.integers(1, 3),
)
def test_picked_names_equal_reference(
    records: list[tuple[bytes, list[tuple[str, str]]]], parts: int
) -> None:
    """Repeated names (the last wins), names in some rows only, non-ASCII text."""
    props = [b"".join(f"{k}\x01{v}\x02".encode() for k, v in pairs) for _, pairs in records]
    data = _encode([b for b, _ in records], props)
    starts = [*split_records(data).tolist(), len(data)]
    cut = sorted({starts[len(starts) * i // (parts + 1)] for i in range(1, parts + 1)})
    edges = [0, *cut, len(data)]
    _check(data, [data[a:b] for a, b in itertools.pairwise(edges) if b > a])


def test_every_row_with_one_message_id() -> None:
    """The usual producer's records: one size, each with its own id (the slice shortcut)."""
    ids = [f"{i:032X}" for i in range(50)]
    data = _encode([b"x" * 20] * 50, [encode_properties({PROPERTY_UNIQ_KEY: u}) for u in ids])
    assert len({len(r) for r in _sizes(data)}) == 1
    _check(data)


def test_invalid_utf8_properties_are_replaced_like_the_decoder() -> None:
    data = _encode([b"a", b"b"], [b"TAGS\x01\xff\xfe\x02", b"KEYS\x01k\x02"])
    _check(data)


def test_same_size_guess_falls_back_when_sizes_differ() -> None:
    """The first record's size divides the length, but the next records are half that size:
    the guess (a record at every multiple) fails its check and the walk finds them."""
    base = len(_encode([b""], [b""]))
    first = _encode([b"x" * (base + 20)], [b""])
    halves = _encode([b"y" * 10] * 2, [b""] * 2)
    assert len(halves) == len(first)
    _check(first + halves)
    _check(_encode([b"x" * 30, b"y", b"z"], [b"", b"", b""]))


def test_same_size_guess_with_the_magic_in_a_body() -> None:
    magic = MAGIC.to_bytes(4, "big")
    data = _encode([b"ab" + magic + b"cd"] * 5, [b""] * 5)
    _check(data)


def _sizes(data: bytes) -> list[bytes]:
    starts = [*split_records(data).tolist(), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(starts)]


def test_split_records_same_size_matches_walk() -> None:
    data = _encode([b"x" * 7] * 9, [b"k\x01v\x02"] * 9)
    starts = split_records(data)
    step = len(data) // 9
    assert np.array_equal(starts, np.arange(0, len(data), step))


def test_short_values_at_the_very_end_of_a_chunk() -> None:
    """A chunk is used in place (no padding): a value of up to 12 bytes ending at the last
    byte is read through a padded copy of the tail."""
    for last in (b"", b"a\x01b\x02", b"TAGS\x01tg\x02", b"k\x01" + b"v" * 9 + b"\x02"):
        data = _encode([b"body", b"x"], [b"KEYS\x01k1\x02", last])
        _check(data)
        _check(data, [data])


def test_control_bytes_and_empty_pieces_in_properties() -> None:
    """The fast split drops only the \\x01/\\x02 separators: a \\x00 or \\x03 inside a value, an
    empty name or an empty value keep their place."""
    props = [b"a\x01x\x00y\x02\x01\x02TAGS\x01t\x03\x02", b"KEYS\x01\x02b\x01\x00\x02", b""]
    _check(_encode([b"1", b"2", b"3"], props))

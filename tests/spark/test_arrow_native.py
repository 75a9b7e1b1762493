"""The C conversion of pull bodies (orbitmq._native.record_columns, wrapped by
orbitmq.spark.arrow_native) gives the very RecordBatch the Python conversion gives, and hands
back to it every body it must not convert itself (issue #15). Skipped where the extension was
not built; the Python path is tested everywhere by test_arrow_fast_paths and test_source_arrow."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pyarrow")

import pyarrow as pa

import orbitmq.spark.arrow_native as arrow_native
from orbitmq.common.message import PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY
from orbitmq.common.record import BatchHeader, RecordError, encode_batch, pack_host
from orbitmq.spark.arrow import RecordColumns, _schema, records_to_batch

try:
    from orbitmq import _native
except ImportError:  # not built here (no compiler at install)
    _native = None  # type: ignore[assignment]  # the tests below then skip

pytestmark = pytest.mark.skipif(
    _native is None or not hasattr(_native, "record_columns"), reason="orbitmq._native not built"
)

_NAMES = st.sampled_from([PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_UNIQ_KEY, "TAG", "a", "é", ""])
_TEXT = st.text(
    st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), max_size=14
)
_RAW_PROPS = st.binary(max_size=12).map(lambda b: b + b"\x02")  # often malformed, often not UTF-8


@pytest.fixture(autouse=True)
def _native_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """On for this module whatever ORBITMQ_NATIVE says (the extension is built here)."""
    monkeypatch.setattr(arrow_native, "NATIVE", _native)


def _encode(bodies: list[bytes], props: list[bytes], sys_flag: int = 0, first: int = 7) -> bytes:
    head = BatchHeader(
        b"topic", 2, first, 0, 0, sys_flag, 1_700_000_000_123, pack_host(("127.0.0.1", 1)),
        1_700_000_000_456, pack_host(("127.0.0.1", 2)), 3, 0,
    )  # fmt: skip
    return bytes(encode_batch(head, bodies, props))


def _same(data: bytes, end: int | None = None) -> None:
    """records_to_batch through C equals the Python conversion, bit for bit in values."""
    got = records_to_batch([data], "topic", "b", end)
    got.validate(full=True)
    cols = RecordColumns(data, "topic", "b")
    keep = None
    if end is not None and cols.n and int(cols.queue_offset[-1]) >= end:
        keep = cols.queue_offset < end
    want = cols.batch(keep)
    assert got.schema == want.schema
    assert got.equals(want), (got.to_pylist()[:3], want.to_pylist()[:3])


@settings(max_examples=120, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.binary(max_size=40),
            st.one_of(
                st.lists(st.tuples(_NAMES, _TEXT), max_size=4).map(
                    lambda pairs: b"".join(f"{k}\x01{v}\x02".encode() for k, v in pairs)
                ),
                _RAW_PROPS,
            ),
        ),
        min_size=1,
        max_size=30,
    ),
    st.integers(0, 40),
)
def test_same_batch_as_the_python_conversion(records: list[tuple[bytes, bytes]], cut: int) -> None:
    """Random bodies and properties (well formed pairs with the picked names repeated or
    missing, non-ASCII text, and raw bytes the C code must hand back), cut at a random end."""
    data = _encode([b for b, _ in records], [p for _, p in records])
    _same(data)
    _same(data, end=7 + cut)


def test_usual_batch_is_converted_in_c() -> None:
    """A producer's records (an id each, some tags and keys) do take the C path."""
    props = [
        f"TAGS\x01t{i % 3}\x02KEYS\x01k{i}\x02{PROPERTY_UNIQ_KEY}\x01{i:032X}\x02".encode()
        for i in range(100)
    ]
    data = _encode([bytes([i]) * i for i in range(100)], props)
    fast = arrow_native.native_batch(data, "topic", "b", _schema())
    assert fast is not None
    batch, offsets, _flags = fast
    assert np.array_equal(offsets, np.arange(7, 107))
    assert batch.column("tags").to_pylist() == [f"t{i % 3}" for i in range(100)]
    assert batch.column("key").to_pylist() == [f"k{i}".encode() for i in range(100)]
    _same(data)
    _same(data, end=50)


@pytest.mark.parametrize(
    "props",
    [
        b"a\x01b",
        b"ab\x02",
        b"a\x01b\x01c\x02",
        b"TAGS\x01\xff\x02",
        b"a\x01\xed\xa0\x80\x02",
        b"\xc0\x80\x01x\x02",
    ],
)
def test_bodies_left_to_python(props: bytes) -> None:
    """Malformed pairs and invalid UTF-8 (surrogates, overlongs) go the general path."""
    data = _encode([b"x", b"y"], [b"KEYS\x01k\x02", props])
    assert arrow_native.native_batch(data, "topic", "b", _schema()) is None
    _same(data)


def test_valid_multibyte_utf8_stays_in_c() -> None:
    props = ["TAGS\x01é€😀\x02".encode(), "ü\x01".encode() + "ß".encode() * 9 + b"\x02"]
    data = _encode([b"x", b"y"], props)
    assert arrow_native.native_batch(data, "topic", "b", _schema()) is not None
    _same(data)


def test_damaged_records_raise_the_python_error() -> None:
    data = _encode([b"abc"] * 3, [b""] * 3)
    for bad in (data[:-1], data[:4] + b"XXXX" + data[8:], data + b"\x00" * 10):
        assert arrow_native.native_batch(bad, "topic", "b", _schema()) is None
        with pytest.raises(RecordError):
            records_to_batch([bad], "topic", "b")


def test_compressed_bodies_are_inflated() -> None:
    from orbitmq.common.message import SYSFLAG_COMPRESSED

    raw = [b"hello " * 50, b"world " * 40]
    data = _encode([zlib.compress(b) for b in raw], [b"", b""], sys_flag=SYSFLAG_COMPRESSED)
    _same(data)
    assert records_to_batch([data], "topic", "b").column("value").to_pylist() == raw


def test_empty_and_many_chunks() -> None:
    a = _encode([b"1", b"2"], [b"TAGS\x01x\x02"] * 2)
    b = _encode([b"3"], [b""], first=9)
    assert records_to_batch([a, b"", b], "topic", "b").equals(
        RecordColumns(a + b, "topic", "b").batch()
    )
    assert records_to_batch([], "topic", "b").num_rows == 0


def test_large_body_releases_the_gil_and_matches() -> None:
    """Over 64 KiB the passes run without the GIL: same output."""
    n = 600
    props = [f"{PROPERTY_UNIQ_KEY}\x01{i:032X}\x02".encode() for i in range(n)]
    data = _encode([b"v" * 200] * n, props)
    assert len(data) > 65536
    _same(data, end=500)
    assert isinstance(pa.py_buffer(data), pa.Buffer)

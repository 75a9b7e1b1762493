"""The stored record codec: round trips, framing checks, and what bad bytes do; every test with
the Python codec and again with the C extension (when built: it is the default then)."""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import os
import pickle
from collections.abc import Iterator
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

import orbitmq.common.record as record_module
from orbitmq.common.message import decode_properties, encode_properties
from orbitmq.common.record import (
    BLANK_MAGIC,
    HEADER_SIZE,
    BatchHeader,
    RecordError,
    StoredMessage,
    check_record,
    decode,
    decode_batch,
    encode_batch,
    encode_blank,
    pack_host,
    record_sizes,
    unpack_host,
)

_native: ModuleType | None
try:
    from orbitmq import _native
except ImportError:  # not built here (no compiler at install)
    _native = None


@pytest.fixture(autouse=True, scope="module", params=["python", "native"])
def codec(request: pytest.FixtureRequest) -> Iterator[str]:
    """The record codec's dispatch, for the whole module (hypothesis tests may not take
    function-scoped fixtures)."""
    if request.param == "native" and _native is None:
        pytest.skip("orbitmq._native not built here")
    saved = record_module.NATIVE
    record_module.NATIVE = _native if request.param == "native" else None
    yield request.param
    record_module.NATIVE = saved


def _head(n_first: int = 0, phy: int = 1000, topic: bytes = b"T") -> BatchHeader:
    return BatchHeader(
        topic, 3, n_first, phy, 7, 0, 111, pack_host(("10.0.0.1", 5)), 222,
        pack_host(("10.0.0.2", 10911)), 1, 0,
    )  # fmt: skip


def _walk(buf: bytes | bytearray) -> list[int]:
    view = memoryview(buf)
    at, sizes = 0, []
    while at < len(view):
        n = check_record(view, at, len(view))
        sizes.append(n)
        at += n
    return sizes


@pytest.mark.parametrize("n", [1, 5, 11, 12, 64, 300])
def test_small_and_vector_encoders_agree_and_decode(n: int) -> None:
    bodies = [os.urandom(1 + i % 50) for i in range(n)]
    props = [encode_properties({"TAGS": f"t{i % 3}", "KEYS": f"k{i}"}) for i in range(n)]
    buf = encode_batch(_head(10), bodies, props)
    assert _walk(buf) == record_sizes(1, bodies, props)
    at = 0
    for i, size in enumerate(record_sizes(1, bodies, props)):
        msg = decode(bytes(buf[at : at + size]))
        assert msg.body == bodies[i]
        assert msg.queue_offset == 10 + i
        assert msg.physical_offset == 1000 + at
        assert msg.topic == "T"
        assert msg.tags == f"t{i % 3}"
        assert msg.keys == [f"k{i}"]
        assert msg.born_host == ("10.0.0.1", 5)
        assert msg.store_timestamp_ms == 222
        assert msg.flag == 7
        at += size


@given(
    bodies=st.lists(st.binary(min_size=1, max_size=300), min_size=1, max_size=40),
    flip=st.integers(min_value=0),
    bit=st.integers(min_value=0, max_value=7),
)
def test_any_single_bit_flip_is_caught(bodies: list[bytes], flip: int, bit: int) -> None:
    props = [b""] * len(bodies)
    buf = encode_batch(_head(), bodies, props)
    where = flip % len(buf)
    buf[where] ^= 1 << bit
    with pytest.raises(RecordError):
        _walk(buf)


@given(data=st.binary(max_size=400), limit=st.integers(min_value=0, max_value=400))
def test_garbage_never_raises_anything_but_record_error(data: bytes, limit: int) -> None:
    view = memoryview(data)
    with contextlib.suppress(RecordError):
        check_record(view, 0, min(limit, len(view)))


def test_blank_filler_must_end_the_segment() -> None:
    blank = encode_blank(64)
    assert check_record(memoryview(blank), 0, 64) == -64
    with pytest.raises(RecordError):
        check_record(memoryview(blank + b"\0" * 8), 0, 72)
    assert int.from_bytes(blank[4:8], "big") == BLANK_MAGIC


def test_zero_bytes_read_as_end_of_data() -> None:
    with pytest.raises(RecordError, match="zero bytes"):
        check_record(memoryview(bytes(HEADER_SIZE * 2)), 0, HEADER_SIZE * 2)


@given(st.dictionaries(st.text(alphabet="abcXYZ_", min_size=1), st.text(alphabet="xyz 0-9")))
def test_properties_round_trip(props: dict[str, str]) -> None:
    assert decode_properties(encode_properties(props)) == props


@given(st.binary(max_size=300), st.binary(min_size=1, max_size=6))
def test_find_all_matches_bytes_find(block: bytes, needle: bytes) -> None:
    from orbitmq.common.message import find_all

    expected = [
        i for i in range(len(block) - len(needle) + 1) if block[i : i + len(needle)] == needle
    ]
    assert find_all(block, needle).tolist() == expected


# ---------------------------------------------------------------------- batch decoding


def _batch(
    bodies: list[bytes], props: list[dict[str, str]], topic: bytes = b"T"
) -> tuple[bytearray, list[int]]:
    encoded = [encode_properties(p) for p in props]
    return encode_batch(_head(5, topic=topic), bodies, encoded), record_sizes(
        len(topic), bodies, encoded
    )


@given(
    bodies=st.lists(st.binary(max_size=200), min_size=1, max_size=40),
    tag=st.sampled_from(["", "a", "é"]),
    host=st.tuples(st.ip_addresses(v=4).map(str), st.integers(-(2**31), 2**31 - 1)),
)
def test_decode_batch_matches_record_by_record_decoding(
    bodies: list[bytes], tag: str, host: tuple[str, int]
) -> None:
    props = [
        {"TAGS": tag, "UNIQ_CLIENT_MESSAGE_ID_KEYIDX": str(i)} if tag else {}
        for i in range(len(bodies))
    ]
    head = _head(5)
    head.born_host = pack_host(host)
    buf = encode_batch(head, bodies, [encode_properties(p) for p in props])
    expected = []
    at = 0
    for size in record_sizes(1, bodies, [encode_properties(p) for p in props]):
        expected.append(decode(bytes(buf[at : at + size])))
        at += size
    for data in (bytes(buf), buf, memoryview(bytes(buf))):
        got = decode_batch(data)
        assert got == expected
        assert all(type(m) is StoredMessage for m in got)
        assert [m.properties for m in got] == props
        assert [m.body for m in got] == bodies
        assert got[0].born_host == host


def test_batch_decoded_messages_behave_like_constructed_ones() -> None:
    buf, _ = _batch([b"a", b"b"], [{"TAGS": "x", "KEYS": "k1 k2"}, {}])
    first, second = decode_batch(bytes(buf))
    made = StoredMessage(
        **{f.name: getattr(first, f.name) for f in dataclasses.fields(StoredMessage)}
    )
    assert made == first and repr(made) == repr(first)
    assert first.tags == "x" and first.keys == ["k1", "k2"] and second.properties == {}
    assert first.properties is first.properties  # decoded once, then kept
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.body = b"changed"  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(second)) == second
    changed = dataclasses.replace(first, reconsume_times=3)
    assert changed.reconsume_times == 3 and changed.properties == {"TAGS": "x", "KEYS": "k1 k2"}


@given(
    bodies=st.lists(st.binary(max_size=100), min_size=1, max_size=20),
    flip=st.integers(min_value=0),
    bit=st.integers(min_value=0, max_value=7),
)
def test_decode_batch_catches_any_single_bit_flip(bodies: list[bytes], flip: int, bit: int) -> None:
    buf, _ = _batch(bodies, [{"k": "v"}] * len(bodies))
    buf[flip % len(buf)] ^= 1 << bit
    with pytest.raises(RecordError, match="record at"):
        decode_batch(bytes(buf))


@given(data=st.binary(max_size=600))
def test_decode_batch_of_garbage_raises_record_error_only(data: bytes) -> None:
    with contextlib.suppress(RecordError):
        decode_batch(data)


def test_decode_batch_rejects_truncation_fillers_and_bad_topics() -> None:
    buf, sizes = _batch([b"one", b"two"], [{}, {}])
    assert decode_batch(b"") == []
    with pytest.raises(RecordError, match=f"record at {sizes[0]}"):
        decode_batch(bytes(buf[:-1]))
    with pytest.raises(RecordError, match="filler"):
        decode_batch(bytes(buf) + encode_blank(64))
    bad, _ = _batch([b"x"], [{}], topic=b"\xff")
    with pytest.raises(RecordError, match="topic is not UTF-8"):
        decode_batch(bytes(bad))


@given(st.ip_addresses(v=4), st.integers(-(2**31), 2**31 - 1))
def test_unpack_host_inverts_pack_host(ip: ipaddress.IPv4Address, port: int) -> None:
    assert unpack_host(pack_host((str(ip), port))) == (str(ip), port)

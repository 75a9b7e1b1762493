"""The optional C codec (orbitmq._native) writes exactly what the Python codec writes, and
OrbitMQ works without it (issue #15). The differential tests run wherever the extension was
built (any machine with a C compiler at install), with the codec switched on for this module
whatever ORBITMQ_NATIVE says (it is off by default, docs/native.md); the fallback test runs
everywhere."""

from __future__ import annotations

import os
import subprocess
import sys

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import orbitmq.common.record as record_module
from orbitmq.common.record import (
    BatchHeader,
    RecordError,
    decode_batch,
    decode_batch_py,
    encode_batch,
    encode_batch_py,
)

try:
    from orbitmq import _native as NATIVE
except ImportError:  # not built here (no compiler at install)
    NATIVE = None  # type: ignore[assignment]  # the tests below then skip

native = pytest.mark.skipif(NATIVE is None, reason="orbitmq._native not built here")
_DEFAULT = record_module.NATIVE


def setup_module() -> None:
    """The record codec's dispatch goes to the extension for this module's tests (a module-level
    switch: hypothesis tests may not take function-scoped fixtures)."""
    record_module.NATIVE = NATIVE


def teardown_module() -> None:
    record_module.NATIVE = _DEFAULT


I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
HOST = st.binary(min_size=8, max_size=8)

heads = st.builds(
    BatchHeader,
    topic=st.text(min_size=1, max_size=40).map(str.encode).filter(lambda t: len(t) < 128),
    queue_id=st.integers(0, 2**31 - 1),
    first_queue_offset=st.integers(0, 2**40),
    first_physical_offset=st.integers(0, 2**40),
    flag=I32,
    sys_flag=I32,
    born_timestamp_ms=I64,
    born_host=HOST,
    store_timestamp_ms=I64,
    store_host=HOST,
    reconsume_times=I32,
    prepared_transaction_offset=I64,
)
records = st.lists(
    st.tuples(st.binary(max_size=300), st.binary(max_size=100)), min_size=1, max_size=40
)


@native
@settings(max_examples=150, deadline=None)
@given(head=heads, recs=records)
def test_encode_batch_is_byte_identical(head: BatchHeader, recs: list[tuple[bytes, bytes]]) -> None:
    bodies = [b for b, _ in recs]
    props = [p for _, p in recs]
    assert NATIVE is not None
    want = encode_batch_py(head, bodies, props)  # both Python paths: small and numpy
    got = encode_batch(head, bodies, props)
    assert isinstance(got, bytearray)
    assert bytes(got) == bytes(want)


@native
def test_encode_takes_views_and_rejects_bad_input() -> None:
    head = BatchHeader(b"T", 0, 0, 0, 0, 0, 0, bytes(8), 0, bytes(8), 0, 0)
    frame = b"xxhelloyy"
    views = [memoryview(frame)[2:7]]
    assert encode_batch(head, views, [b""]) == encode_batch_py(head, [b"hello"], [b""])
    assert NATIVE is not None
    with pytest.raises(ValueError):
        NATIVE.encode_batch(b"T", 0, 0, 0, 0, 0, 0, bytes(8), 0, bytes(8), 0, 0, [b"a"], [])
    with pytest.raises(ValueError):
        NATIVE.encode_batch(b"T", 0, 0, 0, 0, 0, 0, bytes(7), 0, bytes(8), 0, 0, [b"a"], [b""])
    with pytest.raises(TypeError):
        NATIVE.encode_batch(b"T", 0, 0, 0, 0, 0, 0, bytes(8), 0, bytes(8), 0, 0, [1], [b""])


@native
@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=5000), seed=st.integers(0, 2**32 - 1), cut=st.integers(0, 5000))
def test_crc32c_matches_the_package(data: bytes, seed: int, cut: int) -> None:
    assert NATIVE is not None
    assert NATIVE.crc32c(data) == crc32c.crc32c(data)
    assert NATIVE.crc32c(data, seed) == crc32c.crc32c(data, seed)
    cut = min(cut, len(data))
    assert NATIVE.crc32c(data[cut:], NATIVE.crc32c(data[:cut])) == crc32c.crc32c(data)


@native
def test_crc32c_large_buffer_without_the_gil() -> None:
    data = os.urandom(1 << 20)
    assert NATIVE is not None
    assert NATIVE.crc32c(memoryview(data)) == crc32c.crc32c(data)


@native
@settings(max_examples=150, deadline=None)
@given(
    head=heads,
    recs=records,
    flip=st.integers(0, 10**6),
    cut=st.integers(0, 10**6),
    verify=st.booleans(),
)
def test_pull_body_decode_matches_and_rejects_alike(
    head: BatchHeader, recs: list[tuple[bytes, bytes]], flip: int, cut: int, verify: bool
) -> None:
    """Same messages from a valid body; from a damaged or cut one, the same RecordError."""
    data = bytes(encode_batch_py(head, [b for b, _ in recs], [p for _, p in recs]))
    try:
        want = decode_batch_py(data, verify_crc=verify)
    except RecordError as exc:  # a random topic need not be valid UTF-8 in every position
        with pytest.raises(RecordError, match=str(exc)):
            decode_batch(data, verify_crc=verify)
        return
    got = decode_batch(data, verify_crc=verify)
    assert got == want
    assert [m.properties for m in got] == [m.properties for m in want]
    damaged = bytearray(data)
    damaged[flip % len(data)] ^= 0x5A
    for body in (bytes(damaged), data[: cut % len(data)]):
        try:
            expected: object = decode_batch_py(body, verify_crc=verify)
        except RecordError as exc:
            with pytest.raises(RecordError) as info:
                decode_batch(body, verify_crc=verify)
            assert str(info.value) == str(exc)
        else:
            assert decode_batch(body, verify_crc=verify) == expected


def test_the_python_codec_is_the_default() -> None:
    """Without ORBITMQ_NATIVE=1 the Python codec serves, extension built or not."""
    code = "from orbitmq.common.native import NATIVE\nassert NATIVE is None, NATIVE\n"
    env = {k: v for k, v in os.environ.items() if k != "ORBITMQ_NATIVE"}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)


def test_without_the_extension_the_python_codec_serves() -> None:
    """ORBITMQ_NATIVE=0 (or no compiler at install): NATIVE is None and records still
    encode and decode."""
    code = (
        "from orbitmq.common.native import NATIVE\n"
        "from orbitmq.common.record import BatchHeader, decode_batch, encode_batch\n"
        "h = BatchHeader(b'T', 1, 5, 0, 0, 0, 0, bytes(8), 0, bytes(8), 0, 0)\n"
        "buf = encode_batch(h, [b'a', b'bc'], [b'', b'K\\x01v\\x02'])\n"
        "msgs = decode_batch(bytes(buf))\n"
        "assert NATIVE is None, NATIVE\n"
        "assert [m.body for m in msgs] == [b'a', b'bc'] and msgs[1].queue_offset == 6\n"
    )
    env = {**os.environ, "ORBITMQ_NATIVE": "0"}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)

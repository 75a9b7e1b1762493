"""The optional C codec (orbitmq._native) writes exactly what the Python codec writes, and
OrbitMQ works without it (issue #15). The differential tests run wherever the extension was
built (any machine with a C compiler at install), with the codec switched on for this module
whatever ORBITMQ_NATIVE says (it is on by default when built, docs/native.md): the codec
functions on random input, and a store written, read, sealed and replicated with either codec;
the fallback tests run everywhere."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import orbitmq.common.record as record_module
from orbitmq.common.message import MessageBatch, encode_properties
from orbitmq.common.record import (
    VECTOR_MIN_BATCH,
    BatchHeader,
    RecordError,
    decode_batch,
    decode_batch_py,
    encode_batch,
    encode_batch_py,
)
from orbitmq.store.message_store import MessageStore
from tests.store.conftest import small_config

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
@settings(max_examples=50, deadline=None)
@given(head=heads, recs=records, stride=st.integers(1, 300))
def test_encode_batch_with_a_phy_stride_is_byte_identical(
    head: BatchHeader, recs: list[tuple[bytes, bytes]], stride: int
) -> None:
    """Encryption at rest encodes plaintext records whose physical offsets step further than
    their sizes: the extension does it as the Python reference does."""
    bodies = [b for b, _ in recs]
    props = [p for _, p in recs]
    want = encode_batch_py(head, bodies, props, phy_stride=stride)
    assert NATIVE is not None and NATIVE.PHY_STRIDE == 1
    assert bytes(encode_batch(head, bodies, props, phy_stride=stride)) == bytes(want)


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


def test_the_extension_is_the_default_when_built() -> None:
    """Without ORBITMQ_NATIVE the extension serves when it was built (the Python codec when
    not); any value but 0 keeps it on."""
    code = (
        "import importlib.util\n"
        "from orbitmq.common.native import NATIVE\n"
        "built = importlib.util.find_spec('orbitmq._native') is not None\n"
        "assert (NATIVE is not None) == built, (NATIVE, built)\n"
        "if built:\n"
        "    from orbitmq.common import record\n"
        "    assert record.NATIVE is NATIVE\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "ORBITMQ_NATIVE"}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    subprocess.run(
        [sys.executable, "-c", code], env={**env, "ORBITMQ_NATIVE": "1"}, check=True, timeout=60
    )


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


# ------------------------------------------------------------------ the store, either codec

STORE_TOPICS = ("Alpha", "Beta")
CLOCK_MS = 1_700_000_000_000
SEGMENT = 256 * 1024  # a large batch spans segments


def _store_batches(rng: random.Random) -> list[MessageBatch]:
    """What the broker appends: bodies that are views of a request frame (one byte to 2 KiB;
    the store refuses empty ones, the codec tests above cover them), properties (tags, keys,
    user properties, none), batches on both sides of the vectorised encode's threshold and
    large ones; together they roll the CommitLog's segments."""
    out: list[MessageBatch] = []
    for n in [1, 1, 2, VECTOR_MIN_BATCH - 1, VECTOR_MIN_BATCH, VECTOR_MIN_BATCH + 1, 64, 256,
              1000, 3, 1000, 1, 500]:  # fmt: skip
        bodies_raw = [rng.randbytes(rng.choice([1, 1, 40, 300, 2000])) for _ in range(n)]
        frame = b"HEAD" + b"".join(bodies_raw)
        views: list[bytes] = []
        at = 4
        for raw in bodies_raw:  # slices of one frame, as decode_send_body gives them
            views.append(memoryview(frame)[at : at + len(raw)])  # type: ignore[arg-type]
            at += len(raw)
        props = [
            rng.choice([
                b"",
                encode_properties({"TAGS": f"t{i % 3}", "KEYS": f"k{i} kk{i}"}),
                encode_properties({"UNIQ_KEY": rng.randbytes(8).hex(), "user": "é" * (i % 5)}),
            ])
            for i in range(n)
        ]  # fmt: skip
        out.append(
            MessageBatch(
                rng.choice(STORE_TOPICS), rng.randrange(3), views, props, flag=rng.randrange(4),
                sys_flag=rng.choice([0, 1 << 2]), born_timestamp_ms=rng.randrange(1 << 41),
                born_host=("10.1.2.3", rng.randrange(1 << 16)), reconsume_times=rng.randrange(3),
            )
        )  # fmt: skip
    return out


def _open_store(path: Path, **overrides: object) -> MessageStore:
    sizes = {"mapped_file_size_commit_log": SEGMENT, "max_message_size": 64 * 1024}
    config = small_config(path, **{**sizes, **overrides})
    store = MessageStore(config, clock=lambda: CLOCK_MS)
    store.open()
    return store


def _log(store: MessageStore) -> bytes:
    cl = store.commit_log
    return b"".join(
        bytes(seg.view[: max(0, min(seg.size, cl.max_offset - seg.start))])
        for seg in cl.segments.segments
    )


def _pulls(store: MessageStore) -> list[bytes]:
    """Every queue read back as pull bodies (the records a consumer gets, in order)."""
    out = []
    for topic in STORE_TOPICS:
        for qid in range(3):
            offset = 0
            while True:
                res = store.get_messages(topic, qid, offset, max_count=300, max_bytes=1 << 22)
                if not res.count:
                    break
                out.append(b"".join(bytes(v) for v in res.messages))
                offset = res.next_begin_offset
    return out


def _write(path: Path, codec: object, batches: list[MessageBatch], **overrides: object) -> Any:
    """Append the batches (half one by one, half grouped) with ``codec`` as the record codec;
    the results, the log, and what each queue reads back."""
    record_module.NATIVE = codec  # type: ignore[assignment]
    store = _open_store(path, **overrides)
    try:
        half = len(batches) // 2
        results = [store.append(b) for b in batches[:half]]
        for b in batches[half:]:  # append_many refuses a group straddling a segment: pairs
            results += store.append_many([b]) or [store.append(b)]
        assert store.wait_for_dispatch()
        return results, _log(store), _pulls(store)
    finally:
        store.close()
        record_module.NATIVE = NATIVE


def _decoded(pulls: list[bytes], codec: object) -> list[Any]:
    record_module.NATIVE = codec  # type: ignore[assignment]
    try:
        return [(m, m.properties) for body in pulls for m in decode_batch(body, verify_crc=True)]
    finally:
        record_module.NATIVE = NATIVE


@native
def test_the_store_writes_and_reads_alike_with_either_codec(tmp_path: Path) -> None:
    seed = int(os.environ.get("ORBITMQ_SEED") or random.randrange(1 << 30))
    print(f"seed {seed} (ORBITMQ_SEED replays it)")
    batches = _store_batches(random.Random(seed))
    py = _write(tmp_path / "py", None, batches)
    c = _write(tmp_path / "c", NATIVE, batches)
    assert c[0] == py[0]  # offsets and positions
    assert len(py[1]) > 3 * SEGMENT  # several segments
    assert c[1] == py[1]  # the CommitLog, byte for byte
    assert c[2] == py[2]
    want = _decoded(py[2], None)
    assert len(want) == sum(len(b) for b in batches)
    assert _decoded(c[2], NATIVE) == want


@native
def test_sealed_records_and_a_replica_read_alike_with_either_codec(tmp_path: Path) -> None:
    """Encryption at rest (random nonces: the logs differ, what is read must not), and a
    native master's log replayed into a slave running the Python codec."""
    seed = int(os.environ.get("ORBITMQ_SEED") or random.randrange(1 << 30))
    print(f"seed {seed} (ORBITMQ_SEED replays it)")
    batches = _store_batches(random.Random(seed))[:9]
    key = tmp_path / "master.key"
    key.write_bytes(os.urandom(32).hex().encode())
    key.chmod(0o600)
    sealed = {"encrypt_at_rest": True, "encryption_key_file": str(key)}
    py = _write(tmp_path / "py", None, batches, **sealed)
    c = _write(tmp_path / "c", NATIVE, batches, **sealed)
    assert c[0] == py[0]
    assert _decoded(c[2], NATIVE) == _decoded(py[2], None)

    record_module.NATIVE = NATIVE
    master = _open_store(tmp_path / "master")
    try:
        for b in batches:
            master.append(b)
        record_module.NATIVE = None
        slave = _open_store(tmp_path / "slave")
        try:
            while slave.commit_log.max_offset < master.commit_log.max_offset:
                at = slave.commit_log.max_offset
                slave.append_replicated(at, bytes(master.read_replication(at, 64 * 1024)))
            assert master.wait_for_dispatch() and slave.wait_for_dispatch()
            assert _log(slave) == _log(master)
            assert _decoded(_pulls(slave), None) == _decoded(_pulls(master), NATIVE)
        finally:
            slave.close()
    finally:
        master.close()
        record_module.NATIVE = NATIVE

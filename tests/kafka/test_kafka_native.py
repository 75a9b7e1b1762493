"""The C Produce mapping (orbitmq._kafka_native.send_body) against the Python reference
(orbitmq.kafka.mapping.to_send_body): the same send body, byte for byte, for every batch it
serves; None (the Python path decides) for every other batch and for malformed records. Also
`with_first`, which adds the idempotent producer's numbers to a built body."""

from __future__ import annotations

import random
from collections.abc import Iterator
from types import ModuleType

import pytest

from orbitmq.client import _codec
from orbitmq.common.message import decode_properties, encode_properties
from orbitmq.kafka import mapping
from orbitmq.kafka.native import KAFKA_NATIVE
from orbitmq.protocol.kafka.primitives import KafkaCodecError
from orbitmq.protocol.kafka.records import (
    GZIP,
    Batch,
    Record,
    build_batch,
    parse_records,
    read_batches,
)
from orbitmq.protocol.messages import decode_send_body

needs_c = pytest.mark.skipif(KAFKA_NATIVE is None, reason="orbitmq._kafka_native not built")


class _Ids:
    """Deterministic message ids, so both paths can be compared byte for byte."""

    def __init__(self) -> None:
        self.n = 0

    def next_ids(self, count: int) -> list[str]:
        self.n += count
        return [f"7F00000100002A9F{i:016X}" for i in range(self.n - count, self.n)]


@pytest.fixture
def ids(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Ids]:
    gen = _Ids()
    monkeypatch.setattr(mapping, "default_generator", gen)
    yield gen


def _plain(rng: random.Random, i: int) -> Record:
    key = None if rng.random() < 0.5 else b"key-%d" % rng.randrange(10**9)
    value = rng.randbytes(rng.choice((1, 5, 200, 3000)))
    return Record(i, rng.randrange(-3, 10**7), key, value)


def _odd(rng: random.Random, i: int) -> Record:
    kind = rng.randrange(6)
    if kind == 0:
        return Record(i, 0, b"k", b"v", [("h", b"1")])
    if kind == 1:
        return Record(i, 0, b"has space", b"v")
    if kind == 2:
        return Record(i, 0, b"\xc3\xa9t\xc3\xa9", b"v")
    if kind == 3:
        return Record(i, 0, b"", b"v")
    if kind == 4:
        return Record(i, 0, b"k", None)
    return Record(i, 0, None, b"")


def _c() -> ModuleType:
    assert KAFKA_NATIVE is not None
    return KAFKA_NATIVE


def _batch(recs: list[Record], base_ts: int, codec: int = 0) -> Batch:
    return next(read_batches(build_batch(recs, base_timestamp=base_ts, codec=codec)))


@needs_c
def test_c_body_equals_the_python_body(ids: _Ids) -> None:
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    for _ in range(40):
        n = rng.randrange(1, 80)
        base_ts = rng.choice((0, 1_700_000_000_000, -5))
        recs = [_plain(rng, i) for i in range(n)]
        batch = _batch(recs, base_ts, rng.choice((0, GZIP)))
        payload = batch.payload()
        id_list = ids.next_ids(n)
        got = _c().send_body(payload, n, base_ts, id_list)
        ids.n -= n  # the Python path draws the same ids
        assert got == mapping.to_send_body("T", batch.records(), base_ts)
        # the whole entry point, with and without C, gives the same bytes
        ids.n -= n
        via_c = mapping.batch_send_body("T", batch)
        assert via_c == got


@needs_c
def test_c_declines_odd_and_malformed_records(ids: _Ids) -> None:
    rng = random.Random(11)
    for i in range(30):
        recs = [_plain(rng, j) for j in range(5)]
        recs.insert(rng.randrange(6), _odd(rng, i))
        recs = [Record(j, r.timestamp_delta, r.key, r.value, r.headers) for j, r in enumerate(recs)]
        payload = _batch(recs, 1000).payload()
        assert _c().send_body(payload, 6, 1000, ids.next_ids(6)) is None
    payload = _batch([_plain(rng, j) for j in range(4)], 1000).payload()
    native = _c()
    for cut in (payload[:-1], payload + b"\x00", payload[:3]):
        assert native.send_body(cut, 4, 1000, ids.next_ids(4)) is None
    assert native.send_body(payload, 5, 1000, ids.next_ids(5)) is None  # count too high
    assert native.send_body(payload, 3, 1000, ids.next_ids(3)) is None  # bytes left over
    assert native.send_body(payload, 4, 2**63 - 1, ids.next_ids(4)) is None  # ts overflow
    with pytest.raises(KafkaCodecError):
        parse_records(payload[:-1], 4)


def test_python_path_alone_serves_every_batch(ids: _Ids, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mapping, "KAFKA_NATIVE", None)
    rng = random.Random(3)
    recs = [_plain(rng, i) for i in range(10)] + [_odd(rng, 10)]
    batch = _batch(recs, 42)
    body = decode_send_body(mapping.batch_send_body("T", batch))
    assert len(body.bodies) == 11
    assert bytes(body.bodies[0]) == recs[0].value


def test_with_first_appends_to_the_first_message_only(ids: _Ids) -> None:
    rng = random.Random(5)
    recs = [_plain(rng, i) for i in range(7)]
    plain = mapping.to_send_body("T", recs, 10)
    first = {"KAFKA_PID": "9", "PRODUCER_SEQ": "12"}
    ids.n -= 7
    assert mapping.with_first(plain, first) == mapping.to_send_body("T", recs, 10, first)
    a, b = decode_send_body(plain), decode_send_body(mapping.with_first(plain, first))
    assert b.properties[0] == a.properties[0] + encode_properties(first)
    assert b.properties[1:] == a.properties[1:]
    assert [bytes(x) for x in b.bodies] == [bytes(x) for x in a.bodies]
    assert decode_properties(b.properties[0])["KAFKA_PID"] == "9"


# -- Fetch: stored records -> Kafka batches ---------------------------------------------------

_USUAL = [
    b"KAFKA_TS\x011700000000123\x02KEYS\x01k1\x02UNIQ_CLIENT_MESSAGE_ID_KEYIDX\x01AB\x02",
    b"KAFKA_TS\x01007\x02UNIQ_CLIENT_MESSAGE_ID_KEYIDX\x01AB\x02",
    b"KEYS\x01a b c\x02",  # the first key; no KAFKA_TS: the born time
    b"KEYS\x01\x02",  # an empty key
    b"UNIQ_CLIENT_MESSAGE_ID_KEYIDX\x02",  # a part without a value
    b"",
    b"KAFKA_TS\x011\x02KAFKA_TS\x012\x02KEYS\x01x\x02KEYS\x01y\x02",  # the last ones count
    # an idempotent batch's first message: its numbers are no headers
    b"KAFKA_TS\x015\x02UNIQ_CLIENT_MESSAGE_ID_KEYIDX\x01AB\x02KAFKA_PID\x017\x02KAFKA_EPOCH\x010"
    b"\x02KAFKA_SEQ\x010\x02KAFKA_COUNT\x013\x02PRODUCER_ID\x0199\x02PRODUCER_SEQ\x010\x02"
    b"PRODUCER_COUNT\x013\x02",
]
_ODD = [
    b"KAFKA_TS\x01-5\x02",
    b"KAFKA_TS\x01\x02",
    b"TAGS\x01t\x02",
    b"unit\x01C\x02",
    b"KAFKA_NULL_VALUE\x011\x02",
    b"KAFKA_TS\x0112345678901234567890\x02",
]


def _stored(rng: random.Random, runs: int, props: list[bytes], sys_flag: int = 0) -> bytes:
    from orbitmq.common.record import BatchHeader, encode_batch_py

    out = bytearray()
    offset = rng.randrange(0, 1000)
    for _ in range(runs):
        n = rng.randrange(1, 6)
        head = BatchHeader(b"T", 0, offset, len(out), 0, sys_flag, 1_600_000_000_000 + offset,
                           bytes(8), 1_600_000_000_999, bytes(8), 0, 0)  # fmt: skip
        bodies = [rng.randbytes(rng.choice((1, 20, 300))) for _ in range(n)]
        out += encode_batch_py(head, bodies, [rng.choice(props) for _ in range(n)])
        offset += n + rng.choice((0, 0, 1, 7))  # some gaps: a batch per run of offsets
    return bytes(out)


@needs_c
def test_c_fetch_equals_the_python_encoder() -> None:
    from orbitmq.kafka.fetch_encode import encode_pull_py

    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    for _ in range(30):
        data = _stored(rng, rng.randrange(1, 5), _USUAL)
        first = decode_records_offsets(data)
        for start in (0, *first, first[-1] + 1):
            got = _c().fetch_batches(data, start)
            assert got == encode_pull_py(data, start), start
        assert _c().fetch_batches(memoryview(data), first[0]) == encode_pull_py(data, 0)


def test_python_fast_path_equals_the_decoded_path() -> None:
    from orbitmq.kafka.fetch_encode import encode_messages, encode_pull_py
    from orbitmq.protocol.messages import decode_records

    rng = random.Random(4)
    for _ in range(10):
        data = _stored(rng, 3, _USUAL[:2] + _USUAL[-1:])
        plain = [_codec.plain(m) for m in decode_records(data)]
        assert encode_pull_py(data, 0) == encode_messages(plain)


@needs_c
def test_c_fetch_declines_odd_and_damaged_records() -> None:
    from orbitmq.common.message import SYSFLAG_COMPRESSED

    rng = random.Random(9)
    for odd in _ODD:
        data = _stored(rng, 1, [odd]) + _stored(rng, 1, _USUAL)
        assert _c().fetch_batches(data, 0) is None, odd
        assert _c().fetch_batches(data, 10**9) == b""  # only skipped: served
    data = _stored(rng, 1, _USUAL[:1], SYSFLAG_COMPRESSED)
    assert _c().fetch_batches(data, 0) is None
    data = _stored(rng, 2, _USUAL)
    for at in (0, 5, 9, 30, len(data) - 1):  # size, magic, CRC, header, properties
        bad = bytearray(data)
        bad[at] ^= 0x40
        assert _c().fetch_batches(bytes(bad), 0) is None, at
    assert _c().fetch_batches(data[:-3], 0) is None
    assert _c().fetch_batches(b"", 0) == b""


def decode_records_offsets(data: bytes) -> list[int]:
    from orbitmq.protocol.messages import decode_records

    return [m.queue_offset for m in decode_records(data)]


@needs_c
def test_c_paths_on_mutated_input_agree_with_python_or_decline(ids: _Ids) -> None:
    """Random byte flips, cuts and splices (bounded; ORBITMQ_TEST_KAFKA_FUZZ=N for more): the C
    code never crashes and never serves what the Python reference would not serve alike."""
    import os

    from orbitmq.kafka.fetch_encode import encode_pull_py

    rounds = int(os.environ.get("ORBITMQ_TEST_KAFKA_FUZZ", "300"))
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    payload = _batch([_plain(rng, i) for i in range(6)], 77).payload()
    stored = _stored(rng, 3, _USUAL)

    def mutate(data: bytes) -> bytes:
        b = bytearray(data)
        for _ in range(rng.randrange(1, 4)):
            kind = rng.randrange(3)
            at = rng.randrange(len(b)) if b else 0
            if kind == 0 and b:
                b[at] = rng.randrange(256)
            elif kind == 1:
                del b[at : at + rng.randrange(1, 9)]
            else:
                b[at:at] = rng.randbytes(rng.randrange(1, 9))
        return bytes(b)

    for _ in range(rounds):
        bad = mutate(payload)
        n = rng.choice((6, 5, 7))
        got = _c().send_body(bad, n, 77, ids.next_ids(n))
        if got is not None:
            ids.n -= n
            assert got == mapping.to_send_body("T", parse_records(bad, n), 77)
        bad = mutate(stored)
        out = _c().fetch_batches(bad, 0)
        if out is not None:
            assert out == encode_pull_py(bad, 0)

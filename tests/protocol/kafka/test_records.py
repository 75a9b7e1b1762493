"""Record batch v2 against aiokafka's record batch reader and builder (independent code), for
every codec; CRC and structure checks; the base offset and leader epoch re-based without
touching the CRC; malformed input raises only KafkaCodecError."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orbitmq.protocol.kafka.primitives import KafkaCodecError
from orbitmq.protocol.kafka.records import (
    CODEC_NAMES,
    Record,
    build_batch,
    read_batches,
    rebase,
)

default_records = pytest.importorskip("aiokafka.record.default_records")


def _records(n: int, rnd: random.Random) -> list[Record]:
    return [
        Record(i, i * 3, None if i % 4 == 0 else rnd.randbytes(5), rnd.randbytes(rnd.randint(0, 300)),
               [("h", b"v"), ("null", None)] if i % 2 else [])
        for i in range(n)
    ]  # fmt: skip


@pytest.mark.parametrize("codec", sorted(CODEC_NAMES))
def test_aiokafka_reads_what_we_build(codec: int) -> None:
    rnd = random.Random(codec)
    recs = _records(20, rnd)
    data = build_batch(recs, base_offset=100, base_timestamp=1_700_000_000_000, codec=codec,
                       producer_id=7, producer_epoch=1, base_sequence=40)  # fmt: skip
    batch = default_records._DefaultRecordBatchPy(data)
    assert batch.validate_crc()
    assert (batch.base_offset, batch.producer_id, batch.producer_epoch, batch.base_sequence) == (
        100, 7, 1, 40)  # fmt: skip
    got = list(batch)
    assert [(r.offset, r.key, r.value, list(r.headers)) for r in got] == [
        (100 + r.offset_delta, r.key, r.value, r.headers) for r in recs
    ]


@pytest.mark.parametrize("codec", sorted(CODEC_NAMES))
def test_we_read_what_aiokafka_builds(codec: int) -> None:
    # compressible values: aiokafka keeps a batch uncompressed when compression does not pay
    recs = [
        Record(i, i, b"k%d" % i, b"sensor reading %d; " % i * 20, [("h", b"v")]) for i in range(15)
    ]
    builder = default_records._DefaultRecordBatchBuilderPy(2, codec, 0, 9, 2, 5, 1 << 20)
    for r in recs:
        builder.append(
            r.offset_delta, 1_700_000_000_000 + r.timestamp_delta, r.key, r.value, r.headers
        )
    data = bytes(builder.build())
    [batch] = list(read_batches(data))
    assert batch.codec == codec and batch.record_count == 15
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (9, 2, 5)
    assert [(r.key, r.value, r.headers) for r in batch.records()] == [
        (r.key, r.value, r.headers) for r in recs
    ]


def test_rebase_keeps_crc_and_several_batches_read_in_order() -> None:
    a = build_batch(_records(3, random.Random(1)))
    b = build_batch(_records(2, random.Random(2)), codec=1)
    data = rebase(a, 1000, 4) + rebase(b, 1003, 4)
    batches = list(read_batches(data))
    assert [(x.base_offset, x.last_offset, x.leader_epoch) for x in batches] == [
        (1000, 1002, 4), (1003, 1004, 4)]  # fmt: skip
    assert all(x.crc_ok() for x in batches)


def test_corruption_is_detected() -> None:
    data = bytearray(build_batch(_records(4, random.Random(3))))
    data[-3] ^= 0x40
    with pytest.raises(KafkaCodecError, match="CRC"):
        list(read_batches(data))
    bad_magic = bytearray(build_batch(_records(1, random.Random(4))))
    bad_magic[16] = 1
    with pytest.raises(KafkaCodecError, match="magic"):
        list(read_batches(bad_magic))
    with pytest.raises(KafkaCodecError):
        list(read_batches(bytes(build_batch(_records(2, random.Random(5))))[:-1]))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 4))
def test_garbage_raises_only_codec_errors(blob: bytes, codec: int) -> None:
    good = build_batch(_records(2, random.Random(6)), codec=codec)
    for data in (blob, good[:61] + blob, good[: len(good) // 2] + blob):
        try:
            for batch in read_batches(data, verify=False):
                batch.records()
        except KafkaCodecError:
            pass


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.none() | st.binary(max_size=40), st.none() | st.binary(max_size=300),
                          st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=20)),
                                   max_size=3)), min_size=1, max_size=20))  # fmt: skip
def test_fast_parse_equals_the_reference_reader(items: list[Any]) -> None:
    from orbitmq.protocol.kafka.primitives import Reader
    from orbitmq.protocol.kafka.records import _parse_records, _read_record, decompress

    recs = [Record(i, i * 1000 - 7, k, v, list(h)) for i, (k, v, h) in enumerate(items)]
    [batch] = list(read_batches(build_batch(recs)))
    payload = decompress(batch.codec, batch.data[61:])
    r = Reader(payload)
    assert _parse_records(payload, len(recs)) == [_read_record(r) for _ in recs] == recs

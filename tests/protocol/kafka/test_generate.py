"""The committed tables match the committed definitions; the generator's parsing rules."""

from __future__ import annotations

import contextlib
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from orbitmq.protocol.kafka import generate
from orbitmq.protocol.kafka.codec import REQUESTS, decode
from orbitmq.protocol.kafka.connection import ServerConnection, encode_request
from orbitmq.protocol.kafka.primitives import KafkaCodecError
from orbitmq.protocol.kafka.schema_types import MAX_VERSION, NONE


def test_generated_tables_are_current() -> None:
    assert generate.main(["--check"]) == 0


def test_comment_stripping_keeps_strings() -> None:
    text = '{"about": "see http://x // y", // a comment\n "n": 1}'
    assert generate.strip_comments(text) == '{"about": "see http://x // y", \n "n": 1}'


def test_versions_and_names() -> None:
    assert generate.parse_versions("3+") == (3, MAX_VERSION)
    assert generate.parse_versions("2-5") == (2, 5)
    assert generate.parse_versions("7") == (7, 7)
    assert generate.parse_versions("none") == NONE
    assert generate.snake("ThrottleTimeMs") == "throttle_time_ms"
    assert generate.snake("IsrNodes") == "isr_nodes"
    assert generate.snake("ProducerIdBlockSize") == "producer_id_block_size"


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200), st.sampled_from(sorted(REQUESTS)))
def test_any_bytes_decode_or_raise_codec_error(blob: bytes, api_key: int) -> None:
    msg = REQUESTS[api_key]
    version = random.Random(blob).randint(msg.valid[0], msg.valid[1])
    with contextlib.suppress(KafkaCodecError):
        decode(msg.name, version, blob)


def test_frames_split_anywhere_and_oversize_refused() -> None:
    conn = ServerConnection({18: (0, 4), 3: (0, 12)}, max_frame=1000)
    frames = b"".join(
        encode_request(3, v, i, "c", {"topics": [{"name": f"t{i}"}]})
        for i, v in enumerate((1, 9, 12))
    )
    got = []
    for i in range(0, len(frames), 7):
        got += conn.receive(frames[i : i + 7])
    assert [(e.correlation_id, e.body["topics"][0]["name"]) for e in got] == [
        (0, "t0"), (1, "t1"), (2, "t2")]  # fmt: skip
    try:
        conn.receive(b"\x7f\xff\xff\xff")
    except KafkaCodecError as e:
        assert "frame size" in str(e)
    else:
        raise AssertionError("a 2 GiB length prefix was accepted")

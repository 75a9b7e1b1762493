"""Kafka request frames for fuzzing the Kafka listener: valid seeds, frame-aware mutation, and
the offline decoder target.

Seeds: every API the gateway serves (orbitmq.kafka.server.SUPPORTED) at its lowest and highest
version, with realistic bodies (Produce carries record batches with keys, headers and every
codec), so mutations reach past the frame and header checks into the body decoders and the
record batch parser. ``mutate_frame`` mutates a seed's payload and, most of the time, writes a
length prefix that matches it again (a wrong prefix only tests the framing, which raw mutation
does anyway).

The offline target (``kafka`` in targets.py) runs what the gateway runs on the bytes before any
broker call: ``ServerConnection.receive`` (framing, request header, body decode), then, for each
Produce, ``read_batches`` and ``batch_send_body`` (the per-batch mapping, in C when built), which
is where a record batch is taken apart. Documented error: ``KafkaCodecError``.
"""

from __future__ import annotations

import contextlib
import random
import struct
from typing import Any

from orbitmq.kafka.mapping import batch_send_body
from orbitmq.kafka.server import SUPPORTED
from orbitmq.protocol.kafka.connection import Request, ServerConnection, encode_request
from orbitmq.protocol.kafka.primitives import KafkaCodecError
from orbitmq.protocol.kafka.records import (
    GZIP,
    LZ4,
    NONE,
    SNAPPY,
    ZSTD,
    Record,
    build_batch,
    read_batches,
)
from tests.fuzz.mutate import mutate

TOPIC = "fz"
GROUP = "fzg"


def _batches() -> list[bytes]:
    recs = [
        Record(0, 0, b"k0", b"v0", [("h", b"x"), ("bin", b"\xff\x00")]),
        Record(1, 3, None, b"v1" * 20, []),
        Record(2, 5, b"k2", None, [("rocketmq.tag", b"t")]),
    ]
    out = [build_batch(recs, base_timestamp=1_700_000_000_000, codec=c)
           for c in (NONE, GZIP, SNAPPY, LZ4, ZSTD)]  # fmt: skip
    out.append(build_batch(recs[:1], base_timestamp=1_700_000_000_000, producer_id=7,
                           producer_epoch=0, base_sequence=0))  # fmt: skip
    return out


def _bodies() -> dict[int, list[dict[str, Any]]]:
    fetch_part = {"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0,
                  "log_start_offset": -1, "partition_max_bytes": 1 << 16, "max_bytes": 1 << 16}  # fmt: skip
    member = {"group_id": GROUP, "member_id": "m-1", "generation_id": 1,
              "generation_id_or_member_epoch": 1}  # fmt: skip
    produce = [
        {"acks": acks, "timeout_ms": 1000, "topic_data": [
            {"name": TOPIC, "partition_data": [{"index": 0, "records": batch}]}]}
        for acks, batch in zip((-1, 1, 0, -1, 1, -1), _batches(), strict=True)
    ]  # fmt: skip
    return {
        0: produce,
        1: [{"replica_id": -1, "max_wait_ms": 20, "min_bytes": 1, "max_bytes": 1 << 16,
             "isolation_level": 0, "session_id": 0, "session_epoch": -1,
             "topics": [{"topic": TOPIC, "partitions": [fetch_part]}]}],
        2: [{"replica_id": -1, "topics": [{"name": TOPIC, "partitions": [
            {"partition_index": 0, "timestamp": t, "current_leader_epoch": -1}]}]}
            for t in (-2, -1, 1_700_000_000_000)],
        3: [{"topics": [{"name": TOPIC}], "allow_auto_topic_creation": True}, {"topics": None}],
        8: [{**member, "topics": [{"name": TOPIC, "partitions": [
            {"partition_index": 0, "committed_offset": 3, "committed_metadata": ""}]}]}],
        9: [{"group_id": GROUP, "topics": [{"name": TOPIC, "partition_indexes": [0, 1]}],
             "groups": [{"group_id": GROUP, "topics": [{"name": TOPIC, "partition_indexes": [0]}]}]}],
        10: [{"key": GROUP, "key_type": 0, "coordinator_keys": [GROUP]}],
        11: [{"group_id": GROUP, "session_timeout_ms": 6000, "rebalance_timeout_ms": 100,
              "member_id": "", "protocol_type": "consumer",
              "protocols": [{"name": "range", "metadata": b"\x00\x01\x00\x01\x00\x02fz\x00\x00\x00\x00"}]}],
        12: [member],
        13: [{**member, "members": [{"member_id": "m-1"}]}],
        14: [{**member, "protocol_type": "consumer", "protocol_name": "range",
              "assignments": [{"member_id": "m-1", "assignment": b"\x00\x01\x00\x00\x00\x01"}]}],
        15: [{"groups": [GROUP]}],
        16: [{"states_filter": []}],
        18: [{"client_software_name": "fz", "client_software_version": "1"}],
        19: [{"topics": [{"name": "fz-new", "num_partitions": 2, "replication_factor": 1,
                          "assignments": [], "configs": [{"name": "retention.ms", "value": "1000"}]}],
              "timeout_ms": 1000, "validate_only": False}],
        20: [{"topic_names": ["fz-new"], "topics": [{"name": "fz-new"}], "timeout_ms": 1000}],
        22: [{"transactional_id": None, "transaction_timeout_ms": 1000, "producer_id": -1,
              "producer_epoch": -1}],
    }  # fmt: skip


def seed_frames() -> tuple[bytes, ...]:
    """A valid request frame per API the gateway serves, at its lowest and highest version."""
    out: list[bytes] = []
    cid = 0
    for api, bodies in sorted(_bodies().items()):
        lo, hi = SUPPORTED[api]
        for version in sorted({lo, hi}):
            for body in bodies:
                cid += 1
                with contextlib.suppress(KafkaCodecError):  # a body a version cannot carry
                    out.append(encode_request(api, version, cid, "fz", body))
    return tuple(out)


SEEDS = seed_frames()
_PAYLOADS = tuple(s[4:] for s in SEEDS)


def mutate_frame(rng: random.Random, seeds: tuple[bytes, ...] = SEEDS) -> bytes:
    """One to three frames for one connection: mostly a mutated payload behind a length that
    fits it, sometimes valid frames around it, sometimes raw mutated bytes."""
    if rng.random() < 0.2:
        return mutate(rng, seeds)  # framing itself: wrong lengths, cut frames, random bytes
    payload = mutate(rng, _PAYLOADS)
    frame = struct.pack(">i", len(payload)) + payload
    if rng.random() < 0.3:  # a request after it (pipelining), or before it
        other = rng.choice(seeds)
        frame = frame + other if rng.random() < 0.5 else other + frame
    return frame


def decode_like_the_gateway(data: bytes) -> object:
    """The fuzz target: what the gateway does with received bytes before any broker call."""
    conn = ServerConnection(SUPPORTED, max_frame=1 << 20)
    cut = data[0] % (len(data) + 1) if data else 0  # where reads end must not matter
    events = conn.receive(data[:cut]) + conn.receive(data[cut:])
    bodies = []
    for ev in events:
        if isinstance(ev, Request) and ev.api_key == 0:
            for t in ev.body.get("topic_data") or []:
                for p in t.get("partition_data") or []:
                    for batch in read_batches(p.get("records") or b""):
                        bodies.append(batch_send_body(str(t.get("name")), batch))
    return events, bodies


__all__ = ["SEEDS", "decode_like_the_gateway", "mutate_frame", "seed_frames"]

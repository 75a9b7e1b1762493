"""The metadata log's record codec (orbitmq.broker.metadata.records): round trips, cutting
into envelopes, and every malformed input refused with MetadataRecordError."""

from __future__ import annotations

import msgspec
import pytest

from orbitmq.broker.metadata.records import (
    FORMAT_VERSION,
    Change,
    FilePut,
    GroupDel,
    GroupPut,
    MetadataRecordError,
    Offsets,
    OffsetsDelGroup,
    SnapshotBegin,
    SnapshotEnd,
    TopicDel,
    TopicPut,
    decode_envelope,
    encode_envelopes,
    offset_changes,
)
from orbitmq.protocol.bodies import TopicConfig
from orbitmq.protocol.group_config import SubscriptionGroupConfig

EVERY_KIND: list[Change] = [
    SnapshotBegin(snapshot_id=7),
    TopicPut(config=TopicConfig(topic_name="T", read_queue_nums=2, write_queue_nums=2)),
    TopicDel(topic="Old"),
    GroupPut(config=SubscriptionGroupConfig(group_name="G", retry_max_times=3)),
    GroupDel(group="H"),
    Offsets(group="G", entries=[("T", 0, 5), ("T", 1, 9)], replace=True),
    OffsetsDelGroup(group="H"),
    FilePut(name="pop.secret", data=b"\x00\xffsecret"),
    SnapshotEnd(snapshot_id=7),
]


def test_every_change_kind_round_trips_in_order() -> None:
    [body] = encode_envelopes(3, 12, EVERY_KIND)
    env = decode_envelope(body)
    assert (env.v, env.writer, env.epoch) == (FORMAT_VERSION, 3, 12)
    assert env.changes == EVERY_KIND
    assert decode_envelope(memoryview(body)).changes == EVERY_KIND


def test_changes_are_cut_into_envelopes_that_fit() -> None:
    changes: list[Change] = [
        TopicPut(config=TopicConfig(topic_name=f"topic-{i:04d}")) for i in range(500)
    ]
    bodies = encode_envelopes(0, 1, changes, max_bytes=4096)
    assert len(bodies) > 10
    assert all(len(b) <= 4096 + 200 for b in bodies)
    again = [c for b in bodies for c in decode_envelope(b).changes]
    assert again == changes
    assert encode_envelopes(0, 1, []) == []


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\xc1garbage",
        b"[]",
        b'{"v":1,"writer":0,"epoch":1}',
        b'{"v":2,"writer":0,"epoch":1,"changes":[]}',
        b'{"v":1,"writer":0,"epoch":1,"changes":[{"k":"no_such_kind"}]}',
        b'{"v":1,"writer":0,"epoch":1,"changes":[{"k":"topic_del","topic":5}]}',
        b'{"v":1,"writer":"x","epoch":1,"changes":[]}',
        b'{"v":1,"writer":0,"epoch":1,"changes":[{"k":"offsets","group":"G","entries":[[1]]}]}',
    ],
)
def test_malformed_records_are_refused(body: bytes) -> None:
    with pytest.raises(MetadataRecordError):
        decode_envelope(body)


def test_offset_table_becomes_chunked_changes_replacing_each_group_once() -> None:
    table = {"G": {"T": {q: q * 10 for q in range(5)}}, "E": {}}
    changes = offset_changes(table, chunk=2, replace=True)
    g = [c for c in changes if isinstance(c, Offsets) and c.group == "G"]
    assert [len(c.entries) for c in g] == [2, 2, 1]
    assert [c.replace for c in g] == [True, False, False]
    assert sorted(e for c in g for e in c.entries) == [("T", q, q * 10) for q in range(5)]
    # A group with no offsets is still named (a snapshot must not delete it on a replica).
    assert [c for c in changes if isinstance(c, Offsets) and c.group == "E"] == [
        Offsets(group="E", entries=[], replace=True)
    ]


def test_records_are_readable_json() -> None:
    [body] = encode_envelopes(0, 1, [TopicDel(topic="T")])
    assert msgspec.json.decode(body) == {
        "v": 1, "writer": 0, "epoch": 1, "changes": [{"k": "topic_del", "topic": "T"}]
    }  # fmt: skip

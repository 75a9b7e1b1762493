"""The sink's row conversion and option checks, without a SparkSession: record batches become
packed send bodies whose messages carry exactly the columns' fields; bad options, columns and
values fail with an error that names them."""

from __future__ import annotations

import contextlib
import os
import random
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orbitmq.common.errors import ClientError
from orbitmq.common.message import decode_properties
from orbitmq.protocol.messages import decode_send_body
from orbitmq.spark.commit import Marker
from orbitmq.spark.encode import IDS, Prepared
from orbitmq.spark.options import OptionError, parse_sink_options
from orbitmq.spark.sink import check_columns

pa = pytest.importorskip("pyarrow")
types = pytest.importorskip("pyspark.sql.types")


def unpack(prep: Prepared, rows: range | list[int]) -> list[tuple[bytes, dict[str, str]]]:
    import numpy as np

    packed, ids = prep.packed(rows if isinstance(rows, range) else np.asarray(rows))
    body = decode_send_body(packed)
    out = [
        (bytes(b), decode_properties(p)) for b, p in zip(body.bodies, body.properties, strict=True)
    ]
    assert [p["UNIQ_CLIENT_MESSAGE_ID_KEYIDX"] for _, p in out] == ids
    return out


def test_packed_rows_carry_every_column() -> None:
    when = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    rb = pa.record_batch(
        {
            "value": pa.array(["a", "bb", "ccc"]),
            "key": pa.array([b"k1", None, b""], pa.binary()),
            "tags": pa.array(["t", None, "u"]),
            "properties": pa.array(
                [[("x", "1"), ("y", None)], None, []],
                pa.map_(pa.string(), pa.string()),
            ),
            "delivery_time": pa.array([when, None, when], pa.timestamp("us", tz="UTC")),
        }
    )
    prep = Prepared(rb, "T")
    got = unpack(prep, range(3))
    assert [b for b, _ in got] == [b"a", b"bb", b"ccc"]
    p0, p1, p2 = (p for _, p in got)
    ms = str(int(when.timestamp() * 1000))
    assert {k: v for k, v in p0.items() if not k.startswith("UNIQ")} == {
        "x": "1", "y": "", "KEYS": "k1", "TAGS": "t", "TIMER_DELIVER_MS": ms,
    }  # fmt: skip
    assert set(p1) == {"UNIQ_CLIENT_MESSAGE_ID_KEYIDX"}
    assert {k: v for k, v in p2.items() if not k.startswith("UNIQ")} == {
        "TAGS": "u",
        "TIMER_DELIVER_MS": ms,
    }
    # A subset of rows, in the order given (rows grouped per queue are taken, not sliced).
    assert [b for b, _ in unpack(prep, [2, 0])] == [b"ccc", b"a"]


def test_properties_the_sink_sets_itself_are_dropped_so_read_then_write_works() -> None:
    """A row read by the orbitmq source carries its old message id (and may carry a
    transaction's names); the sink drops them and sets its own, as Kafka passes headers on."""
    props = pa.array(
        [[("UNIQ_CLIENT_MESSAGE_ID_KEYIDX", "OLD"), ("x", "1"), ("PGROUP", "g")], [], None],
        pa.map_(pa.string(), pa.string()),
    )
    prep = Prepared(
        pa.record_batch({"value": pa.array([b"a", b"b", b"c"]), "properties": props}), "T"
    )
    got = unpack(prep, range(3))
    assert {k: v for k, v in got[0][1].items() if not k.startswith("UNIQ")} == {"x": "1"}
    assert got[0][1]["UNIQ_CLIENT_MESSAGE_ID_KEYIDX"] != "OLD"
    assert [set(p) for _, p in got[1:]] == [{"UNIQ_CLIENT_MESSAGE_ID_KEYIDX"}] * 2


def test_ids_are_unique_across_large_batches() -> None:
    a = IDS.take(200_000).to_pylist()
    b = IDS.take(70_000).to_pylist()
    assert len(set(a) | set(b)) == 270_000
    assert all(len(x) == 32 for x in a[:10])


@pytest.mark.parametrize(
    ("column", "values", "needle"),
    [
        ("value", pa.array([b"x", b""]), "value"),
        ("value", pa.array([b"x", None], pa.binary()), "value"),
        ("tags", pa.array(["a\x01b", "c"]), "x01"),
        ("key", pa.array([b"\xff\xfe", b"k"]), "key"),
    ],
)
def test_bad_values_fail_naming_the_column(column: str, values: object, needle: str) -> None:
    cols = {"value": pa.array([b"x", b"y"])} | {column: values}
    with pytest.raises(ClientError, match=needle):
        Prepared(pa.record_batch(cols), "T")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=20), min_size=1, max_size=20), st.integers(0, 2**32))
def test_random_tags_either_round_trip_or_fail_clearly(tags: list[str], seed: int) -> None:
    print("seed", seed)
    rnd = random.Random(seed)
    values = [os.urandom(rnd.randint(1, 40)) for _ in tags]
    rb = pa.record_batch({"value": pa.array(values, pa.binary()), "tags": pa.array(tags)})
    try:
        prep = Prepared(rb, "T")
    except ClientError as exc:
        assert any("\x01" in t or "\x02" in t for t in tags), exc
        return
    got = unpack(prep, range(len(tags)))
    assert [b for b, _ in got] == values
    assert [p.get("TAGS", "") for _, p in got] == tags


@given(st.binary(max_size=200))
def test_marker_decoder_refuses_garbage_clearly(data: bytes) -> None:
    with contextlib.suppress(ValueError):  # anything else would be a bug
        Marker.decode(data)


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({}, "namesrv"),
        ({"namesrv": "n:1", "deliveryGuarantee": "twice"}, "deliveryGuarantee"),
        ({"namesrv": "n:1", "maxBatchMessages": "0"}, "maxBatchMessages"),
        ({"namesrv": "n:1", "maxBatchBytes": str(8 << 20)}, "maxBatchBytes"),
        ({"namesrv": "n:1", "commitTimeout": "soon"}, "commitTimeout"),
        ({"namesrv": "n:1", "colour": "blue"}, "colour"),
        ({"namesrv": "n:1", "path": "/x"}, "path"),
    ],
)
def test_bad_options_name_the_option(options: dict[str, str], needle: str) -> None:
    with pytest.raises(OptionError, match=needle):
        parse_sink_options(options, streaming=True)


def test_defaults_and_spark_passthrough_options() -> None:
    opts = parse_sink_options(
        {"NameSrv": "n:1", "checkpointLocation": "/c", "queryName": "q"}, streaming=True
    )
    assert opts.exactly_once and opts.topic is None
    assert not parse_sink_options({"namesrv": "n:1"}, streaming=False).exactly_once


def struct(ddl: str) -> object:
    """A StructType from ``name type, ...`` (the few types used here; Spark's own DDL parser
    needs a running session)."""
    t = types
    simple = {
        "string": t.StringType(), "int": t.IntegerType(), "bigint": t.LongType(),
        "binary": t.BinaryType(), "timestamp": t.TimestampType(),
        "map<string,string>": t.MapType(t.StringType(), t.StringType()),
        "map<string,int>": t.MapType(t.StringType(), t.IntegerType()),
    }  # fmt: skip
    fields = [part.strip().split(" ", 1) for part in ddl.split(", ")]
    return t.StructType([t.StructField(name, simple[kind]) for name, kind in fields])


@pytest.mark.parametrize(
    ("ddl", "options", "needle"),
    [
        ("vaule string", {}, "vaule"),
        ("value int", {}, "value"),
        ("value string, tags int", {}, "tags"),
        ("value string, properties map<string,int>", {}, "properties"),
        ("key string", {}, "value"),
        ("value string", {"topic": None}, "topic"),
        ("value string, broker string", {}, "queue_id"),
        ("value string, delay bigint", {}, "delay"),
        ("value string, delay bigint, delivery_time timestamp", {"deliveryGuarantee": "atLeastOnce"},
         "delivery_time"),
    ],
)  # fmt: skip
def test_bad_columns_name_the_column(ddl: str, options: dict[str, str | None], needle: str) -> None:
    schema = struct(ddl)
    raw = {"namesrv": "n:1", "topic": "T"} | options
    opts = parse_sink_options({k: v for k, v in raw.items() if v is not None}, streaming=True)
    with pytest.raises(OptionError, match=needle):
        check_columns(schema, opts)


def test_source_columns_minus_read_only_ones_are_accepted() -> None:
    schema = struct(
        "key binary, value binary, topic string, queue_id int, broker string, tags string, "
        "properties map<string,string>"
    )
    opts = parse_sink_options({"namesrv": "n:1"}, streaming=True)
    assert check_columns(schema, opts) == (
        "key", "value", "topic", "queue_id", "broker", "tags", "properties",
    )  # fmt: skip

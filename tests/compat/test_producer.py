"""The official RocketMQ 5 Python client's Producer against OrbitMQ's gRPC proxy: normal messages
with tag, keys and properties, FIFO, delay, transactions (commit, rollback, check-back), a 4 MiB
body, and each topic's message type rule. What it sends must read the same through the native
SDK, and what the native SDK sends must read the same through the official client."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import pytest

from orbitmq.client import (
    ConsumeFromWhere,
    Message,
    MessageQueue,
    Producer,
    ReceivedMessage,
    SimpleConsumer,
)
from orbitmq.client.consumer.config import SimpleConfig
from orbitmq.common.record import StoredMessage
from tests.compat.conftest import Orbit, unique

pytestmark = [pytest.mark.compat, pytest.mark.integration]

MESSAGE_TYPES = {"NORMAL": 1, "FIFO": 2, "DELAY": 3, "TRANSACTION": 4}
"""apache.rocketmq.v2.MessageType values, as the official client reports them."""


def prime(consumer: str, group: str, topic: str, expr: str = "*") -> list[dict[str, Any]]:
    """Steps that start a SimpleConsumer and receive once: a group's first receive fixes where
    it starts in each queue (the end), so messages sent afterwards are all delivered."""
    return [
        {"op": "simple_consumer", "name": consumer, "group": group, "topics": {topic: expr}},
        {"op": "receive", "consumer": consumer, "expect": 0},
    ]


def pull_all(orbit: Orbit, topic: str) -> list[StoredMessage]:
    """Every message of the topic, read with the native SDK (pull, no consumer group)."""
    out: list[StoredMessage] = []
    for mq in orbit.admin.queues(topic):
        assert isinstance(mq, MessageQueue)
        offset = orbit.admin.min_offset(mq)
        end = orbit.admin.max_offset(mq)
        while offset < end:
            result = orbit.admin.pull(mq, offset, max_nums=32, max_bytes=16 * 1024 * 1024)
            out.extend(result.messages)
            if result.next_begin_offset <= offset:
                break
            offset = result.next_begin_offset
    return out


def native_receive(orbit: Orbit, topic: str, expect: int) -> list[ReceivedMessage]:
    """Consume the topic from its start with a native SimpleConsumer (a new group)."""
    got: list[ReceivedMessage] = []
    with SimpleConsumer(
        orbit.namesrv,
        unique("CompatNativeG"),
        SimpleConfig(consume_from_where=ConsumeFromWhere.FIRST_OFFSET, await_duration_s=1.0),
        subscriptions={topic: "*"},
    ) as consumer:
        consumer.start()
        deadline = time.monotonic() + 15
        while len(got) < expect and time.monotonic() < deadline:
            batch = consumer.receive(32, 30)
            if batch:
                consumer.ack_many(batch)
                got.extend(batch)
    return got


def user_properties(props: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in props.items() if k.startswith("app_")}


SPECS = [
    {"body": "plain"},
    {"body": "tagged", "tag": "TagA"},
    {"body": "with keys", "tag": "TagB", "keys": ["k1", "k2"]},
    {"body": "with props", "properties": {"app_color": "red", "app_n": "7"}},
    {"body": "all", "tag": "TagC", "keys": ["order-1"], "properties": {"app_x": "y"}},
]


def test_normal_messages_round_trip_and_read_the_same_natively(orbit: Orbit) -> None:
    topic = orbit.topic(unique("CompatNormal"))
    messages = [dict(s, topic=topic) for s in SPECS]
    out = orbit.run(
        [
            *prime("c", unique("CompatG"), topic),
            {"op": "producer", "name": "p", "topics": [topic]},
            {"op": "send", "producer": "p", "messages": messages[:4]},
            {"op": "send", "producer": "p", "messages": messages[4:], "async": True},
            {"op": "receive", "consumer": "c", "expect": len(messages), "timeout_s": 20},
        ]
    )
    receipts = out["results"][3]["receipts"] + out["results"][4]["receipts"]
    ids = [r["message_id"] for r in receipts]
    assert len(set(ids)) == len(messages) and all(ids)
    got = {m["message_id"]: m for m in out["results"][5]["messages"]}
    assert set(got) == set(ids)
    for spec, msg_id in zip(messages, ids, strict=True):
        m = got[msg_id]
        assert m["body"] == spec["body"] and m["topic"] == topic
        assert m["tag"] == spec.get("tag")
        assert m["keys"] == sorted(spec.get("keys", []))
        assert user_properties(m["properties"]) == spec.get("properties", {})
        assert m["delivery_attempt"] == 1 and not m["corrupted"]
        assert m["message_type"] == MESSAGE_TYPES["NORMAL"]

    # Through the native SDK: pulled (no group), and consumed by a native SimpleConsumer.
    pulled = {m.msg_id: m for m in pull_all(orbit, topic)}
    consumed = {m.msg_id: m.message for m in native_receive(orbit, topic, len(messages))}
    for stored in (pulled, consumed):
        assert set(stored) == set(ids)
        for spec, msg_id in zip(messages, ids, strict=True):
            s = stored[msg_id]
            assert s.body == spec["body"].encode()
            assert s.tags == spec.get("tag")
            assert sorted(s.keys) == sorted(spec.get("keys", []))
            assert user_properties(dict(s.properties)) == spec.get("properties", {})


def test_native_sdk_messages_read_the_same_through_the_official_client(orbit: Orbit) -> None:
    topic = orbit.topic(unique("CompatFromNative"))
    group = unique("CompatG")
    orbit.run(prime("c", group, topic))
    sent = []
    with Producer(orbit.namesrv) as producer:
        for spec in SPECS:
            msg = Message(
                topic,
                spec["body"].encode(),
                tags=spec.get("tag"),
                keys=spec.get("keys", ()),
                properties=dict(spec.get("properties", {})),
            )
            sent.append((spec, producer.send(msg).msg_id))
    out = orbit.run(
        [
            {"op": "simple_consumer", "name": "c", "group": group, "topics": {topic: "*"}},
            {"op": "receive", "consumer": "c", "expect": len(sent), "timeout_s": 20},
        ]
    )
    got = {m["message_id"]: m for m in out["results"][1]["messages"]}
    assert set(got) == {msg_id for _, msg_id in sent}
    for spec, msg_id in sent:
        m = got[msg_id]
        assert m["body"] == spec["body"]
        assert m["tag"] == spec.get("tag")
        assert m["keys"] == sorted(spec.get("keys", []))
        assert user_properties(m["properties"]) == spec.get("properties", {})
        assert m["delivery_attempt"] == 1 and not m["corrupted"]


def test_tag_filter(orbit: Orbit) -> None:
    topic = orbit.topic(unique("CompatTags"))
    out = orbit.run(
        [
            *prime("c", unique("CompatG"), topic, "TagA||TagC"),
            {"op": "producer", "name": "p", "topics": [topic]},
            {"op": "send", "producer": "p", "messages": [dict(s, topic=topic) for s in SPECS]},
            {"op": "receive", "consumer": "c", "expect": 2, "timeout_s": 15, "idle_s": 1.5},
        ]
    )
    assert sorted(m["tag"] for m in out["results"][-1]["messages"]) == ["TagA", "TagC"]


def test_fifo_messages_keep_their_group_order(orbit: Orbit) -> None:
    topic = orbit.topic(unique("CompatFifo"), "FIFO")
    normal = orbit.topic(unique("CompatNotFifo"))
    messages = [
        {"topic": topic, "body": f"{g}-{i}", "group": g} for i in range(4) for g in ("ga", "gb")
    ]
    out = orbit.run(
        [
            *prime("c", unique("CompatG"), topic),
            {"op": "producer", "name": "p", "topics": [topic, normal]},
            {"op": "send", "producer": "p", "messages": messages},
            {"op": "receive", "consumer": "c", "expect": len(messages), "timeout_s": 20},
            # The message type rule: FIFO only to a FIFO topic, and a FIFO topic takes FIFO only.
            {
                "op": "send",
                "producer": "p",
                "messages": [{"topic": normal, "body": "x", "group": "ga"}],
                "expect_error": True,
            },
            {
                "op": "send",
                "producer": "p",
                "messages": [{"topic": topic, "body": "x"}],
                "expect_error": True,
            },
        ]
    )
    got = out["results"][4]["messages"]
    assert len(got) == len(messages)
    for g in ("ga", "gb"):
        mine = [m for m in got if m["message_group"] == g]
        assert [m["body"] for m in mine] == [f"{g}-{i}" for i in range(4)]
        assert {m["message_type"] for m in mine} == {MESSAGE_TYPES["FIFO"]}
    assert out["results"][5]["error"], "a FIFO message to a NORMAL topic must be refused"
    assert out["results"][6]["error"], "a NORMAL message to a FIFO topic must be refused"


def test_delay_message_arrives_at_its_delivery_time(orbit: Orbit) -> None:
    topic = orbit.topic(unique("CompatDelay"), "DELAY")
    normal = orbit.topic(unique("CompatNotDelay"))
    out = orbit.run(
        [
            *prime("c", unique("CompatG"), topic),
            {"op": "producer", "name": "p", "topics": [topic, normal]},
            {
                "op": "send",
                "producer": "p",
                "messages": [{"topic": topic, "body": "later", "delay_s": 2}],
            },
            {"op": "receive", "consumer": "c", "expect": 1, "timeout_s": 20},
            {
                "op": "send",
                "producer": "p",
                "messages": [{"topic": normal, "body": "x", "delay_s": 2}],
                "expect_error": True,
            },
        ]
    )
    sent_at = out["results"][3]["sent_at"]
    (m,) = out["results"][4]["messages"]
    assert m["body"] == "later" and m["message_type"] == MESSAGE_TYPES["DELAY"]
    due_s = m["delivery_timestamp"] / 1000
    assert due_s >= sent_at + 0.5  # whole seconds: now + 2 s, rounded down
    assert m["received_at"] >= sent_at + 0.5, "not held back at all"
    assert m["received_at"] >= due_s - 0.5, "delivered before its delivery time"
    assert out["results"][5]["error"], "a DELAY message to a NORMAL topic must be refused"


def test_transactions_commit_rollback_and_check_back(orbit: Orbit) -> None:
    topic = orbit.topic(unique("CompatTx"), "TRANSACTION")
    normal = orbit.topic(unique("CompatNotTx"))
    out = orbit.run(
        [
            *prime("c", unique("CompatG"), topic),
            {"op": "producer", "name": "p", "topics": [topic, normal], "checker": "COMMIT"},
            {
                "op": "send",
                "producer": "p",
                "messages": [{"topic": topic, "body": "committed"}],
                "transaction": "commit",
            },
            {
                "op": "send",
                "producer": "p",
                "messages": [{"topic": topic, "body": "rolled back"}],
                "transaction": "rollback",
            },
            # Neither commit nor rollback: the local transaction's outcome is unknown; the broker
            # checks back through the proxy, the checker answers COMMIT.
            {
                "op": "send",
                "producer": "p",
                "messages": [{"topic": topic, "body": "checked"}],
                "transaction": "open",
            },
            {"op": "wait_checks", "producer": "p", "expect": 1, "timeout_s": 30},
            {"op": "receive", "consumer": "c", "expect": 2, "timeout_s": 20, "idle_s": 1.5},
            {
                "op": "send",
                "producer": "p",
                "messages": [{"topic": normal, "body": "x"}],
                "transaction": "commit",
                "expect_error": True,
            },
        ]
    )
    r = out["results"]
    committed, rolled, checked = (r[i]["receipts"][0] for i in (3, 4, 5))
    assert all(x["transaction_id"] for x in (committed, rolled, checked))
    checks = r[6]["checks"]
    assert checks and checks[0]["message_id"] == checked["message_id"]
    assert checks[0]["body"] == "checked"
    got = {m["message_id"]: m for m in r[7]["messages"]}
    assert set(got) == {committed["message_id"], checked["message_id"]}
    assert {m["message_type"] for m in got.values()} == {MESSAGE_TYPES["TRANSACTION"]}
    assert r[8]["error"], "a transactional message to a NORMAL topic must be refused"


def test_four_mib_body(orbit: Orbit) -> None:
    topic = orbit.topic(unique("CompatBig"), queues=1)
    size = 4 * 1024 * 1024
    out = orbit.run(
        [
            *prime("c", unique("CompatG"), topic),
            {"op": "producer", "name": "p", "topics": [topic]},
            {
                "op": "send",
                "producer": "p",
                "messages": [{"topic": topic, "size": size, "body": "0123456789"}],
            },
            {"op": "receive", "consumer": "c", "expect": 1, "timeout_s": 20},
        ]
    )
    expected = hashlib.md5((b"0123456789" * (size // 10 + 1))[:size]).hexdigest()
    (m,) = out["results"][4]["messages"]
    assert m["body_len"] == size and m["body_md5"] == expected and not m["corrupted"]
    (stored,) = pull_all(orbit, topic)
    assert hashlib.md5(stored.body).hexdigest() == expected

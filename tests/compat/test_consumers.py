"""The official RocketMQ 5 Python client's SimpleConsumer and PushConsumer against OrbitMQ's gRPC
proxy: receive, ack, change invisible duration, redelivery after the invisible time (the delivery
attempt grows), a push listener, and failures that are retried and finally dead-lettered."""

from __future__ import annotations

import time

import pytest

from orbitmq.common.errors import SubscriptionGroupNotExistError
from orbitmq.protocol.consumer import MemberInfo
from tests.compat.conftest import Orbit, unique
from tests.compat.test_producer import prime

pytestmark = [pytest.mark.compat, pytest.mark.integration]


def test_simple_consumer_ack_change_invisible_and_redelivery(orbit: Orbit) -> None:
    topic = orbit.topic(unique("CompatSimple"))
    group = unique("CompatSG")
    # RocketMQ 5's SimpleConsumer behaviour: visible again when the invisible time ends.
    orbit.group_config(group, pop_retry_delays_ms=[])
    msgs = [{"topic": topic, "body": f"m{i}"} for i in range(2)]
    out = orbit.run(
        [
            *prime("c", group, topic),
            {"op": "producer", "name": "p", "topics": [topic]},
            {"op": "send", "producer": "p", "messages": msgs},
            # 1st delivery: not acked, comes back after 2 s.
            {"op": "receive", "consumer": "c", "expect": 2, "invisible_s": 2, "ack": False},
            # 2nd: hidden for 30 s, but changed to 2 s: comes back soon, not in 30 s.
            {
                "op": "receive",
                "consumer": "c",
                "expect": 2,
                "timeout_s": 15,
                "invisible_s": 30,
                "change_invisible_s": 2,
                "ack": False,
            },
            # 3rd: acked; nothing comes back, though an unacked one would after 2 s.
            {
                "op": "receive",
                "consumer": "c",
                "expect": 2,
                "timeout_s": 15,
                "invisible_s": 2,
                "idle_s": 3,
            },
        ]
    )
    ids = {r["message_id"] for r in out["results"][3]["receipts"]}
    rounds = [out["results"][i]["messages"] for i in (4, 5, 6)]
    for attempt, got in enumerate(rounds, start=1):
        assert {m["message_id"] for m in got} == ids, f"delivery {attempt}: {got}"
        assert [m["delivery_attempt"] for m in got] == [attempt, attempt]
        assert sorted(m["body"] for m in got) == ["m0", "m1"]
    # The changed invisible time took effect: back well before the original 30 s.
    assert out["results"][5]["seconds"] + out["results"][6]["seconds"] < 25


def test_push_consumer_listener_gets_every_message(orbit: Orbit) -> None:
    topic = orbit.topic(unique("CompatPush"))
    group = unique("CompatPG")
    msgs = [{"topic": topic, "body": f"p{i}", "tag": "T"} for i in range(5)]
    out = orbit.run(
        [
            *prime("s", group, topic),  # fixes the group's start before anything is sent
            {"op": "shutdown", "name": "s"},
            {"op": "push_consumer", "name": "c", "group": group, "topics": {topic: "*"}},
            {"op": "producer", "name": "p", "topics": [topic]},
            {"op": "send", "producer": "p", "messages": msgs},
            {"op": "wait_push", "consumer": "c", "expect": 5, "timeout_s": 20, "idle_s": 1},
        ]
    )
    deliveries = out["results"][-1]["deliveries"]
    ids = {r["message_id"] for r in out["results"][-2]["receipts"]}
    assert sorted(d["body"] for d in deliveries) == [f"p{i}" for i in range(5)]
    assert {d["message_id"] for d in deliveries} == ids
    assert {d["delivery_attempt"] for d in deliveries} == {1}


def test_push_consumer_failures_are_retried_then_dead_lettered(orbit: Orbit) -> None:
    topic = orbit.topic(unique("CompatPushDlq"))
    group = unique("CompatDG")
    # One retry, after 1 s, then the DLQ (delivered at most twice).
    orbit.group_config(group, retry_max_times=1, retry_delays_ms=[1000], pop_retry_delays_ms=[])
    msgs = [
        {"topic": topic, "body": "fails once", "properties": {"fail_times": "1"}},
        {"topic": topic, "body": "always fails", "properties": {"fail_times": "-1"}},
    ]
    out = orbit.run(
        [
            *prime("s", group, topic),
            {"op": "shutdown", "name": "s"},
            {"op": "push_consumer", "name": "c", "group": group, "topics": {topic: "*"}},
            {"op": "producer", "name": "p", "topics": [topic]},
            {"op": "send", "producer": "p", "messages": msgs},
            {"op": "wait_push", "consumer": "c", "expect": 4, "timeout_s": 30, "idle_s": 2},
        ]
    )
    receipts = out["results"][-2]["receipts"]
    once_id, always_id = (r["message_id"] for r in receipts)
    deliveries = out["results"][-1]["deliveries"]
    once = [d for d in deliveries if d["message_id"] == once_id]
    always = [d for d in deliveries if d["message_id"] == always_id]
    assert [(d["delivery_attempt"], d["result"]) for d in once] == [(1, "FAILURE"), (2, "SUCCESS")]
    assert [(d["delivery_attempt"], d["result"]) for d in always] == [
        (1, "FAILURE"),
        (2, "FAILURE"),
    ], "retried once, then dead-lettered: no third delivery"

    deadline = time.monotonic() + 15
    dead: list[str] = []
    while time.monotonic() < deadline:
        dead = [d.message.msg_id or "" for d in orbit.admin.dlq_messages(group)]
        if always_id in dead:
            break
        time.sleep(0.2)
    assert dead == [always_id]


def _members(orbit: Orbit, group: str) -> list[MemberInfo]:
    try:
        return orbit.admin.describe_group(group).members
    except SubscriptionGroupNotExistError:
        return []


def test_official_consumers_are_listed_as_members_of_their_group(orbit: Orbit) -> None:
    """What `orbitmq group describe` shows of a group consumed through the proxy: the official
    client's SimpleConsumer, by its own client id and language, until it shuts down."""
    topic = orbit.topic(unique("CompatMember"))
    group = unique("CompatMG")
    running = orbit.start_run(
        [
            {"op": "simple_consumer", "name": "s", "group": group, "topics": {topic: "TagA"}},
            {"op": "sleep", "s": 6},
            {"op": "shutdown", "name": "s"},
            {"op": "sleep", "s": 3},
        ]
    )
    try:
        deadline = time.monotonic() + 20
        while not (members := _members(orbit, group)) and time.monotonic() < deadline:
            time.sleep(0.1)
        (member,) = members
        assert member.language == "PYTHON" and member.client_id
        (sub,) = member.subscriptions
        assert (sub.topic, sub.expression_type, sub.expression) == (topic, "TAG", "TagA")
        while _members(orbit, group) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _members(orbit, group) == []  # left at shutdown, not at the brokers' expiry
    finally:
        running.finish(timeout=60)


def test_new_simple_consumer_group_receives_messages_sent_before_it(orbit: Orbit) -> None:
    """The official client's quick start (issue #14): send 10, then a SimpleConsumer of a new
    group receives them, RocketMQ's first-consume rule (the topic's start is in memory)."""
    topic = orbit.topic(unique("CompatFirst"))
    group = unique("CompatFirstG")
    msgs = [{"topic": topic, "body": f"m{i}"} for i in range(10)]
    out = orbit.run(
        [
            {"op": "producer", "name": "p", "topics": [topic]},
            {"op": "send", "producer": "p", "messages": msgs},
            {"op": "simple_consumer", "name": "c", "group": group, "topics": {topic: "*"}},
            {"op": "receive", "consumer": "c", "expect": 10, "timeout_s": 20},
        ]
    )
    got = out["results"][3]["messages"]
    assert sorted(m["body"] for m in got) == sorted(f"m{i}" for i in range(10))

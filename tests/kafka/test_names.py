"""Kafka-style names through the gateway: a dotted topic (``orders.v1``) created by a Kafka admin,
produced and consumed by a dotted consumer group (``my.app``) with committed offsets that a
restarted consumer resumes from and that `orbitmq group describe` shows (with the lag)."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import pytest
from typer.testing import CliRunner

from orbitmq.cli.main import app
from orbitmq.client.admin.client import AsyncAdminClient
from tests.kafka.conftest import Stack
from tests.kafka.raw import RawClient

confluent = pytest.importorskip("confluent_kafka")
admin_mod = pytest.importorskip("confluent_kafka.admin")

pytestmark = pytest.mark.timeout(120)

TOPIC = "orders.v1"
GROUP = "my.app"


def _cli(stack: Stack, *args: str) -> str:
    result = CliRunner().invoke(app, list(args), env={"ORBITMQ_NAMESRV": stack.namesrv,
                                                      "COLUMNS": "250"})  # fmt: skip
    assert result.exit_code == 0, (args, result.output)
    return result.stdout


def _produce(bootstrap: str, start: int, count: int) -> None:
    producer = confluent.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                                   "linger.ms": 5})  # fmt: skip
    for i in range(start, start + count):
        producer.produce(TOPIC, key=f"k{i}".encode(), value=f"v{i}".encode(), partition=i % 2)
    assert producer.flush(30) == 0


def _consume_and_commit(bootstrap: str, want: int, seconds: float = 30) -> list[bytes]:
    consumer = confluent.Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP,
                                   "auto.offset.reset": "earliest", "enable.auto.commit": False})  # fmt: skip
    consumer.subscribe([TOPIC])
    got: list[bytes] = []
    end = time.monotonic() + seconds
    try:
        while len(got) < want and time.monotonic() < end:
            msg: Any = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append(msg.value())
        consumer.commit(asynchronous=False)
        # nothing beyond what was wanted arrives (the committed offsets are exact)
        extra = consumer.poll(1.0)
        assert extra is None or extra.error() is not None, extra.value()
    finally:
        consumer.close()
    return got


async def test_dotted_topic_and_group_resume_from_committed_offsets(stack: Stack) -> None:
    def create() -> None:
        admin = admin_mod.AdminClient({"bootstrap.servers": stack.bootstrap})
        futures = admin.create_topics([admin_mod.NewTopic(TOPIC, num_partitions=2)],
                                      operation_timeout=20)  # fmt: skip
        futures[TOPIC].result(30)

    await asyncio.to_thread(create)
    await asyncio.to_thread(_produce, stack.bootstrap, 0, 10)
    first = await asyncio.to_thread(_consume_and_commit, stack.bootstrap, 10)
    assert sorted(first) == sorted(f"v{i}".encode() for i in range(10))

    admin = await AsyncAdminClient((stack.namesrv,)).start()
    try:
        assert TOPIC in await admin.list_topics()  # `orbitmq topic list` shows the Kafka name
        await asyncio.to_thread(_produce, stack.bootstrap, 10, 6)
        desc = await admin.describe_group(GROUP)  # what `orbitmq group describe my.app` prints
        assert desc.group == GROUP
        mine = [q for q in desc.queues if q.topic == TOPIC]
        assert [(q.consumer_offset, q.lag) for q in mine] == [(5, 3), (5, 3)]
        assert desc.total_lag == 6
        out = await asyncio.to_thread(_cli, stack, "group", "describe", GROUP)
        assert re.search(r"^total lag 6$", out, re.M), out
        assert GROUP in out and TOPIC in out
        assert TOPIC in (await asyncio.to_thread(_cli, stack, "topic", "list")).split()

        # a restarted consumer resumes from the committed offsets: only the 6 new records
        second = await asyncio.to_thread(_consume_and_commit, stack.bootstrap, 6)
        assert sorted(second) == sorted(f"v{i}".encode() for i in range(10, 16))
        desc = await admin.describe_group(GROUP)
        assert [(q.consumer_offset, q.lag) for q in desc.queues if q.topic == TOPIC] == [
            (8, 0),
            (8, 0),
        ]
    finally:
        await admin.close()


# Kafka allows any group id; one OrbitMQ cannot hold as a group name is refused, not escaped
_BAD_GROUPS = ["my app", "a/b", "..", "x" * 121, "a+b", ""]


@pytest.mark.parametrize("gid", _BAD_GROUPS)
async def test_group_id_outside_orbitmq_names_gets_invalid_group_id(stack: Stack, gid: str) -> None:
    def run() -> None:
        c = RawClient(stack.bootstrap)
        try:
            c.call(3, 8, {"topics": [{"name": "plain"}], "allow_auto_topic_creation": True,
                          "include_cluster_authorized_operations": False,
                          "include_topic_authorized_operations": False})  # fmt: skip
            join = c.call(11, 5, {"group_id": gid, "session_timeout_ms": 10000,
                                  "rebalance_timeout_ms": 10000, "member_id": "",
                                  "group_instance_id": None, "protocol_type": "consumer",
                                  "protocols": [{"name": "range", "metadata": b""}]})  # fmt: skip
            assert join["error_code"] == 24
            part = {"partition_index": 0, "committed_offset": 1, "committed_leader_epoch": -1,
                    "committed_metadata": ""}  # fmt: skip
            commit = c.call(8, 8, {"group_id": gid, "generation_id_or_member_epoch": -1,
                                   "member_id": "", "group_instance_id": None,
                                   "topics": [{"name": "plain", "partitions": [part]}]})  # fmt: skip
            assert commit["topics"][0]["partitions"][0]["error_code"] == 24
            want = [{"name": "plain", "partition_indexes": [0]}]
            assert c.call(9, 7, {"group_id": gid, "topics": want,
                                 "require_stable": False})["error_code"] == 24  # fmt: skip
            fetched = c.call(9, 8, {"groups": [{"group_id": gid, "topics": want}],
                                    "require_stable": False})  # fmt: skip
            assert fetched["groups"][0]["error_code"] == 24
        finally:
            c.close()

    await asyncio.to_thread(run)


async def test_topic_names_orbitmq_cannot_hold_get_invalid_topic(stack: Stack) -> None:
    def run() -> None:
        c = RawClient(stack.bootstrap)
        try:
            names = ["..", ".", "a" * 128, "a b"]
            topics = [{"name": n, "num_partitions": 1, "replication_factor": -1,
                       "assignments": [], "configs": []} for n in names]  # fmt: skip
            res = c.call(19, 5, {"topics": topics, "timeout_ms": 5000, "validate_only": False})
            assert [t["error_code"] for t in res["topics"]] == [17] * len(names)
            meta = c.call(3, 8, {"topics": [{"name": n} for n in names],
                                 "allow_auto_topic_creation": True,
                                 "include_cluster_authorized_operations": False,
                                 "include_topic_authorized_operations": False})  # fmt: skip
            assert [t["error_code"] for t in meta["topics"]] == [17] * len(names)
        finally:
            c.close()

    await asyncio.to_thread(run)


async def test_produce_fetch_commit_on_a_name_orbitmq_cannot_hold_answer_unknown_topic(
    stack: Stack,
) -> None:
    """A Kafka-legal name longer than OrbitMQ's 127 characters (or any name the NameServer
    refuses) is a topic that does not exist: UNKNOWN_TOPIC_OR_PARTITION, the connection lives."""
    from orbitmq.protocol.kafka.records import Record, build_batch

    long_name = "t." + "a" * 130
    batch = build_batch([Record(0, 0, None, b"v")], base_timestamp=1_700_000_000_000)

    def run() -> None:
        c = RawClient(stack.bootstrap)
        try:
            for name in (long_name, "a b"):
                body = {"acks": -1, "timeout_ms": 5000, "topic_data": [
                    {"name": name, "partition_data": [{"index": 0, "records": batch}]}]}  # fmt: skip
                res = c.call(0, 8, body)["responses"][0]["partition_responses"][0]
                assert res["error_code"] == 3
                fetch = {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20,
                         "isolation_level": 0, "session_id": 0, "session_epoch": -1, "topics": [
                             {"topic": name, "partitions": [{"partition": 0, "current_leader_epoch": -1,
                              "fetch_offset": 0, "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
                         "forgotten_topics_data": [], "rack_id": ""}  # fmt: skip
                assert c.call(1, 11, fetch)["responses"][0]["partitions"][0]["error_code"] == 3
                part = {"partition_index": 0, "committed_offset": 1, "committed_leader_epoch": -1,
                        "committed_metadata": ""}  # fmt: skip
                commit = c.call(8, 8, {"group_id": "my.app", "generation_id_or_member_epoch": -1,
                                       "member_id": "", "group_instance_id": None,
                                       "topics": [{"name": name, "partitions": [part]}]})  # fmt: skip
                assert commit["topics"][0]["partitions"][0]["error_code"] == 3
        finally:
            c.close()

    await asyncio.to_thread(run)

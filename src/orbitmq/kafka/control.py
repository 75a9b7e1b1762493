"""Kafka's control plane on OrbitMQ: Metadata, topics, the group coordinator's APIs, group
offsets and producer ids.

One gateway answers as the leader of every partition and the coordinator of every group (the
WarpStream model: it forwards to the brokers through the SDK, so any gateway can serve any
partition). Topics are created on one master broker, chosen by a hash of the name, with
num_partitions queues, and the answer waits (bounded by the request's timeout) until the
NameServers route it, so a client can produce right after. Group offsets are the brokers'
consumer offsets: a Kafka group and a RocketMQ group of the same name share them, and `orbitmq
group` shows a Kafka group's lag like any other.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable
from typing import Any

from orbitmq.client.admin.client import AsyncAdminClient
from orbitmq.client.route import MessageQueue
from orbitmq.kafka import errors as E
from orbitmq.kafka.config import KafkaConfig
from orbitmq.kafka.groups import Coordinator
from orbitmq.kafka.names import legal_group, legal_topic
from orbitmq.kafka.partitions import Partitions
from orbitmq.kafka.producer_state import ProducerStates

Body = dict[str, Any]
_INTERNAL_PREFIXES = ("rmq_sys_", "%RETRY%", "%DLQ%", "%LMQ%", "SCHEDULE_TOPIC", "TBW102",
                      "RMQ_SYS_", "OFFSET_MOVED_EVENT", "TRANS_CHECK_MAX_TIME_TOPIC")  # fmt: skip
NO_AUTH_OPS = -2147483648


def is_internal(topic: str) -> bool:
    return topic.startswith(_INTERNAL_PREFIXES) or topic == "DefaultCluster"


class ControlPlane:
    def __init__(
        self,
        config: KafkaConfig,
        admin: AsyncAdminClient,
        partitions: Partitions,
        coordinator: Coordinator,
        states: ProducerStates,
        advertised: tuple[str, int],
    ) -> None:
        self.config = config
        self.admin = admin
        self.partitions = partitions
        self.coordinator = coordinator
        self.states = states
        self.advertised = advertised

    def _node(self) -> Body:
        host, port = self.advertised
        return {"node_id": self.config.node_id, "host": host, "port": port, "rack": None}

    # -- Metadata and topics -------------------------------------------------------------------

    async def metadata(
        self,
        body: Body,
        version: int,
        may_create: Callable[[str], bool] | None = None,
        visible: Callable[[str], bool] | None = None,
    ) -> Body:
        """``may_create``: whether the caller may auto-create a topic (None: anyone; a topic
        it may not create is TOPIC_AUTHORIZATION_FAILED, as Kafka answers). ``visible``: the
        topics a listing of all shows (None: all), filtered before any is looked up."""
        requested = body.get("topics")
        if requested is None or (version == 0 and not requested):
            names = [t for t in await self.admin.list_topics() if not is_internal(t)]
            if visible is not None:
                names = [t for t in names if visible(t)]
        else:
            names = [t["name"] for t in requested]
        auto = self.config.auto_create_topics and (
            version < 4 or body.get("allow_auto_topic_creation")
        )
        topics = [
            await self._topic_metadata(name, bool(auto and requested), may_create)
            if name is not None
            else _unknown_topic_id(version)
            for name in names
        ]
        return {"throttle_time_ms": 0, "brokers": [self._node()], "cluster_id": self.config.cluster_id,
                "controller_id": self.config.node_id, "topics": topics,
                "cluster_authorized_operations": NO_AUTH_OPS}  # fmt: skip

    async def _topic_metadata(
        self, name: str, auto_create: bool, may_create: Callable[[str], bool] | None = None
    ) -> Body:
        node = self.config.node_id
        out: Body = {"error_code": E.NONE, "name": name, "topic_id": bytes(16), "is_internal": False,
                     "partitions": [], "topic_authorized_operations": NO_AUTH_OPS}  # fmt: skip
        if not legal_topic(name) or is_internal(name):
            out["error_code"] = E.INVALID_TOPIC_EXCEPTION
            return out
        parts = await self.partitions.of(name, fresh=True)
        if parts is None and auto_create and may_create is not None and not may_create(name):
            out["error_code"] = E.TOPIC_AUTHORIZATION_FAILED
            return out
        if parts is None and auto_create:
            code = await self._create(name, self.config.default_partitions, 10_000)
            parts = await self.partitions.of(name, fresh=True) if code == E.NONE else None
        if parts is None:
            out["error_code"] = E.UNKNOWN_TOPIC_OR_PARTITION
            return out
        out["partitions"] = [
            {"error_code": E.NONE, "partition_index": i, "leader_id": node, "leader_epoch": -1,
             "replica_nodes": [node], "isr_nodes": [node], "offline_replicas": []}
            for i in range(len(parts))
        ]  # fmt: skip
        return out

    async def _create(self, name: str, partitions: int, timeout_ms: int) -> int:
        masters = sorted((await self.admin.masters()).values())
        if not masters:
            return E.REQUEST_TIMED_OUT
        addr = masters[zlib.crc32(name.encode()) % len(masters)]
        await self.admin.create_topic(name, read_queue_nums=partitions, write_queue_nums=partitions,
                                      broker_addr=addr)  # fmt: skip
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(1, timeout_ms) / 1000
        while loop.time() < deadline:  # bounded: until the NameServers route it
            if await self.partitions.of(name, fresh=True) is not None:
                return E.NONE
            await asyncio.sleep(0.05)
        return E.REQUEST_TIMED_OUT

    async def create_topics(self, body: Body) -> Body:
        out = []
        for t in body["topics"]:
            name, n, rf = t["name"], t["num_partitions"], t["replication_factor"]
            n = self.config.default_partitions if n == -1 else n
            res: Body = {"name": name, "topic_id": bytes(16), "error_code": E.NONE, "error_message": None,
                         "num_partitions": n, "replication_factor": 1, "configs": []}  # fmt: skip
            if not legal_topic(name) or is_internal(name):
                res["error_code"], res["error_message"] = (
                    E.INVALID_TOPIC_EXCEPTION,
                    "illegal topic name",
                )
            elif not 1 <= n <= 1024 or t.get("assignments"):
                res["error_code"], res["error_message"] = (
                    E.INVALID_PARTITIONS,
                    "1-1024 partitions, no manual assignment",
                )
            elif rf not in (-1, 1):
                res["error_code"] = E.INVALID_REPLICATION_FACTOR
                res["error_message"] = "replication is the broker group's (docs/ha.md): ask -1 or 1"
            elif await self.partitions.of(name, fresh=True) is not None:
                res["error_code"], res["error_message"] = (
                    E.TOPIC_ALREADY_EXISTS,
                    f"topic {name} exists",
                )
            elif not body.get("validate_only"):
                try:
                    res["error_code"] = await self._create(
                        name, n, body.get("timeout_ms") or 30_000
                    )
                except Exception as e:  # noqa: BLE001  # mapped to a Kafka code
                    res["error_code"], res["error_message"] = E.code_for(e), str(e)
            out.append(res)
        return {"throttle_time_ms": 0, "topics": out}

    async def delete_topics(self, body: Body) -> Body:
        names = body.get("topic_names") or [t["name"] for t in body.get("topics") or []]
        out = []
        for name in names:
            code = E.NONE
            if await self.partitions.of(name, fresh=True) is None:
                code = E.UNKNOWN_TOPIC_OR_PARTITION
            else:
                try:
                    await self.admin.delete_topic(name)
                except Exception as e:  # noqa: BLE001  # mapped to a Kafka code
                    code = E.code_for(e)
                self.partitions.forget(name)
            out.append(
                {"name": name, "topic_id": bytes(16), "error_code": code, "error_message": None}
            )
        return {"throttle_time_ms": 0, "responses": out}

    # -- coordinator lookup, producer ids --------------------------------------------------------

    def find_coordinator(self, body: Body, version: int) -> Body:
        host, port = self.advertised
        keys = body.get("coordinator_keys") if version >= 4 else [body["key"]]
        code = E.COORDINATOR_NOT_AVAILABLE if body.get("key_type", 0) != 0 else E.NONE
        node = {"node_id": self.config.node_id, "host": host, "port": port, "error_code": code,
                "error_message": None if code == E.NONE else "transactions are not served"}  # fmt: skip
        return {
            "throttle_time_ms": 0,
            **node,
            "coordinators": [{"key": k, **node} for k in keys or []],
        }

    def init_producer_id(self, body: Body) -> Body:
        if body.get("transactional_id") is not None:
            return {"throttle_time_ms": 0, "error_code": E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                    "producer_id": -1, "producer_epoch": -1}  # fmt: skip
        pid, epoch = body.get("producer_id", -1), body.get("producer_epoch", -1)
        if pid is not None and pid >= 0 and epoch is not None and epoch >= 0:
            return {"throttle_time_ms": 0, "error_code": E.NONE, "producer_id": pid,
                    "producer_epoch": (epoch + 1) & 0x7FFF}  # fmt: skip
        return {"throttle_time_ms": 0, "error_code": E.NONE,
                "producer_id": self.states.new_producer_id(), "producer_epoch": 0}  # fmt: skip

    # -- group offsets -------------------------------------------------------------------------

    async def offset_commit(self, body: Body) -> Body:
        gid = body["group_id"]
        member = body.get("member_id") or ""
        check = (
            self.coordinator.generation_ok(
                gid, member, body.get("generation_id_or_member_epoch", -1)
            )
            if legal_group(gid)
            else E.INVALID_GROUP_ID
        )
        commits: dict[MessageQueue, int] = {}
        where: dict[MessageQueue, tuple[str, int]] = {}
        codes: dict[tuple[str, int], int] = {}
        for t in body["topics"]:
            for p in t["partitions"]:
                key = (t["name"], p["partition_index"])
                if check != E.NONE:
                    codes[key] = check
                    continue
                mq = await self.partitions.queue(*key)
                codes[key] = E.UNKNOWN_TOPIC_OR_PARTITION if mq is None else E.NONE
                if mq is not None:
                    commits[mq], where[mq] = p["committed_offset"], key
        if commits:
            try:
                await self.admin.commit_offsets(gid, commits)
            except Exception as e:  # noqa: BLE001  # mapped to a Kafka code
                for key in where.values():
                    codes[key] = E.code_for(e)
        topics = [
            {"name": t["name"], "partitions": [
                {"partition_index": p["partition_index"], "error_code": codes[(t["name"], p["partition_index"])]}
                for p in t["partitions"]
            ]}
            for t in body["topics"]
        ]  # fmt: skip
        return {"throttle_time_ms": 0, "topics": topics}

    async def offset_fetch(self, body: Body, version: int) -> Body:
        if version >= 8:
            groups = []
            for g in body["groups"]:
                gid = g["group_id"]
                if not legal_group(gid):
                    groups.append({"group_id": gid, "topics": [], "error_code": E.INVALID_GROUP_ID})
                    continue
                topics = await self._fetch_group(gid, g["topics"])
                groups.append({"group_id": gid, "topics": topics, "error_code": E.NONE})
            return {"throttle_time_ms": 0, "groups": groups}
        if not legal_group(body["group_id"]):
            return {"throttle_time_ms": 0, "topics": [], "error_code": E.INVALID_GROUP_ID}
        topics = await self._fetch_group(body["group_id"], body["topics"])
        return {"throttle_time_ms": 0, "topics": topics, "error_code": E.NONE}

    async def _fetch_group(self, gid: str, wanted: list[Body] | None) -> list[Body]:
        if wanted is None:  # all topics the group committed: those we can see
            wanted = []
        out = []
        for t in wanted:
            parts = []
            for index in t["partition_indexes"]:
                mq = await self.partitions.queue(t["name"], index)
                offset, code = -1, E.NONE
                if mq is None:
                    code = E.UNKNOWN_TOPIC_OR_PARTITION
                else:
                    try:
                        found = await self.admin.committed_offset(gid, mq)
                        offset = -1 if found is None else found
                    except Exception as e:  # noqa: BLE001  # mapped to a Kafka code
                        code = E.code_for(e)
                parts.append({"partition_index": index, "committed_offset": offset,
                              "committed_leader_epoch": -1, "metadata": "", "error_code": code})  # fmt: skip
            out.append({"name": t["name"], "partitions": parts})
        return out

    # -- group description ---------------------------------------------------------------------

    def list_groups(self) -> Body:
        groups = [{"group_id": g.group_id, "protocol_type": g.protocol_type or "", "group_state": g.state,
                   "group_type": "classic"} for g in self.coordinator.groups.values()]  # fmt: skip
        return {"throttle_time_ms": 0, "error_code": E.NONE, "groups": groups}

    def describe_groups(self, body: Body) -> Body:
        out = []
        for gid in body["groups"]:
            g = self.coordinator.groups.get(gid)
            if g is None:
                out.append({"error_code": E.NONE, "group_id": gid, "group_state": "Dead", "protocol_type": "",
                            "protocol_data": "", "members": [], "authorized_operations": NO_AUTH_OPS})  # fmt: skip
                continue
            members = [{"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                        "client_id": m.client_id, "client_host": m.client_host,
                        "member_metadata": dict(m.protocols).get(g.protocol or "", b""),
                        "member_assignment": m.assignment} for m in g.members.values()]  # fmt: skip
            out.append({"error_code": E.NONE, "group_id": gid, "group_state": g.state,
                        "protocol_type": g.protocol_type or "", "protocol_data": g.protocol or "",
                        "members": members, "authorized_operations": NO_AUTH_OPS})  # fmt: skip
        return {"throttle_time_ms": 0, "groups": out}


def _unknown_topic_id(version: int) -> Body:
    """A topic asked for by id only (Metadata v10+, name null): this gateway has no topic ids
    (it answers all zero), so none is known, as Kafka answers an unknown id. (Found by fuzzing
    the listener: a null name raised in the handler.)"""
    return {"error_code": E.UNKNOWN_TOPIC_ID, "name": None if version >= 12 else "",
            "topic_id": bytes(16), "is_internal": False, "partitions": [],
            "topic_authorized_operations": NO_AUTH_OPS}  # fmt: skip

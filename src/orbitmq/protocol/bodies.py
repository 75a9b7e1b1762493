"""Structured bodies (msgpack via msgspec): topic configs, routes, broker registration.

Field names follow RocketMQ's (snake_case). Permissions use RocketMQ's bits.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

PERM_INHERIT = 0x1
PERM_WRITE = 0x2
PERM_READ = 0x4
PERM_READ_WRITE = PERM_READ | PERM_WRITE

MESSAGE_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED")


class TopicConfig(msgspec.Struct, kw_only=True):
    topic_name: str
    read_queue_nums: int = 8
    write_queue_nums: int = 8
    perm: int = PERM_READ_WRITE
    message_type: str = "NORMAL"
    retention_ms: int | None = None
    """OrbitMQ: messages older than this are no longer served (None: broker-wide rules)."""
    retention_bytes: int | None = None
    """OrbitMQ: each queue keeps at most this many bytes of the newest messages."""
    tier_retention_ms: int | None = None
    """OrbitMQ: tiered storage keeps this topic's chunks this long (None: the broker's
    ``tier_retention_ms``; docs/tiered-storage.md)."""


class QueueData(msgspec.Struct, kw_only=True):
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int


class BrokerData(msgspec.Struct, kw_only=True):
    cluster: str
    broker_name: str
    broker_addrs: dict[int, str]
    """broker id (0 = master) -> "host:port"."""

    def master_addr(self) -> str | None:
        return self.broker_addrs.get(0)


class TopicRouteData(msgspec.Struct, kw_only=True):
    queue_datas: list[QueueData]
    broker_datas: list[BrokerData]


class RegisterBrokerBody(msgspec.Struct, kw_only=True):
    topic_configs: dict[str, TopicConfig]
    data_version: int = 0


class ClusterInfo(msgspec.Struct, kw_only=True):
    broker_addr_table: dict[str, BrokerData]
    cluster_addr_table: dict[str, list[str]]


class TopicList(msgspec.Struct, kw_only=True):
    topics: list[str]


class QueueStats(msgspec.Struct, kw_only=True):
    queue_id: int
    min_offset: int
    max_offset: int
    last_update_timestamp_ms: int = 0
    # Tiered storage (docs/tiered-storage.md), absent when the broker has no tier:
    local_min_offset: int | None = None
    """First offset still on the broker's disk (``min_offset`` may be the tier's)."""
    tier_min_offset: int | None = None
    tier_max_offset: int | None = None
    """The tier's upload watermark: offsets below it are in the tier."""
    tier_last_upload_ms: int = 0


class TopicStats(msgspec.Struct, kw_only=True):
    topic: str
    broker_name: str
    queues: list[QueueStats]


class TopicConfigList(msgspec.Struct, kw_only=True):
    topic_configs: list[TopicConfig]


def encode_body(obj: msgspec.Struct) -> bytes:
    return msgspec.msgpack.encode(obj)


T = TypeVar("T")


def decode_body(data: bytes | memoryview, typ: type[T]) -> T:
    """Decode a body; raises msgspec.DecodeError/ValidationError on bad input."""
    return msgspec.msgpack.decode(data, type=typ)

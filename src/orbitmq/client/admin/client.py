"""The admin client behind the CLI: topics, cluster, offsets, pulls, message lookups and
consumer groups.

:class:`AdminClient` is async (``AsyncAdminClient`` is the same class, named like the other
async clients); :class:`BlockingAdminClient` runs one on a private event loop thread. The names
are wave 1's: ``AdminClient`` was released as the async client, so it stays that. Messages come back decoded (:class:`orbitmq.common.record.StoredMessage`, CRC-checked)
with compressed bodies already inflated and the compression bits cleared from ``sys_flag``.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Sequence
from typing import Any

from orbitmq.client._loop_thread import BlockingFacade, LoopThread
from orbitmq.client._settings import resolve_config
from orbitmq.client.admin.auth import AuthAdminOps
from orbitmq.client.admin.config import AdminConfig
from orbitmq.client.admin.groups import GroupAdmin
from orbitmq.client.admin.topics import TopicAdmin
from orbitmq.client.admin.types import GroupDescription, PullResult, TopicDescription
from orbitmq.client.dlq import DlqMessage
from orbitmq.client.route import (
    MessageQueue,
)
from orbitmq.common.errors import (
    MQError,
)
from orbitmq.common.record import StoredMessage
from orbitmq.protocol.bodies import (
    PERM_READ_WRITE,
    ClusterInfo,
    TopicConfig,
    TopicRouteData,
    TopicStats,
)
from orbitmq.protocol.consumer import (
    GroupSummary,
    QueueConsumeStats,
    QueueOffset,
)
from orbitmq.protocol.group_config import (
    SubscriptionGroupConfig,
)

log = logging.getLogger(__name__)

__all__ = ["AdminClient", "AsyncAdminClient", "BlockingAdminClient"]


class AdminClient(TopicAdmin, GroupAdmin, AuthAdminOps):
    """Administration over the Remoting protocol. ``async with AdminClient(addrs) as admin:``."""


AsyncAdminClient = AdminClient
"""The same class, under the name the other async clients follow (``AsyncProducer``, ...)."""


class BlockingAdminClient(BlockingFacade[AdminClient]):
    """:class:`AdminClient` with blocking methods, on a private event loop thread."""

    def __init__(
        self,
        namesrv_addrs: str | Sequence[str],
        config: AdminConfig | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
        **overrides: Any,
    ) -> None:
        config = resolve_config(AdminConfig, config, overrides, "BlockingAdminClient")
        self._thread = LoopThread("orbitmq-admin")
        self._async = AdminClient(namesrv_addrs, config, ssl_context=ssl_context)
        self._closed = False

    @property
    def async_client(self) -> AdminClient:
        return self._async

    def cluster_info(self) -> ClusterInfo:
        return self._thread.run(self._async.cluster_info())

    def masters(self, cluster: str | None = None) -> dict[str, str]:
        return self._thread.run(self._async.masters(cluster))

    def list_topics(self) -> list[str]:
        return self._thread.run(self._async.list_topics())

    def topic_route(self, topic: str) -> TopicRouteData:
        return self._thread.run(self._async.topic_route(topic))

    def create_topic(
        self,
        topic: str,
        *,
        read_queue_nums: int = 8,
        write_queue_nums: int = 8,
        perm: int = PERM_READ_WRITE,
        message_type: str = "NORMAL",
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        cluster: str | None = None,
        broker_addr: str | None = None,
    ) -> list[str]:
        return self._thread.run(
            self._async.create_topic(
                topic,
                read_queue_nums=read_queue_nums,
                write_queue_nums=write_queue_nums,
                perm=perm,
                message_type=message_type,
                retention_ms=retention_ms,
                retention_bytes=retention_bytes,
                cluster=cluster,
                broker_addr=broker_addr,
            )
        )

    def update_topic(
        self, config: TopicConfig, *, cluster: str | None = None, broker_addr: str | None = None
    ) -> list[str]:
        return self._thread.run(
            self._async.update_topic(config, cluster=cluster, broker_addr=broker_addr)
        )

    def delete_topic(self, topic: str, *, cluster: str | None = None) -> list[str]:
        return self._thread.run(self._async.delete_topic(topic, cluster=cluster))

    def describe_topic(self, topic: str) -> TopicDescription:
        return self._thread.run(self._async.describe_topic(topic))

    def topic_stats(self, topic: str) -> list[TopicStats]:
        return self._thread.run(self._async.topic_stats(topic))

    def topic_configs(self, broker_addr: str) -> list[TopicConfig]:
        return self._thread.run(self._async.topic_configs(broker_addr))

    def broker_runtime_info(self, broker_addr: str) -> dict[str, Any]:
        return self._thread.run(self._async.broker_runtime_info(broker_addr))

    def wipe_write_perm(self, broker_name: str) -> dict[str, int | MQError]:
        return self._thread.run(self._async.wipe_write_perm(broker_name))

    def add_write_perm(self, broker_name: str) -> dict[str, int | MQError]:
        return self._thread.run(self._async.add_write_perm(broker_name))

    def queues(self, topic: str, *, writable: bool = False) -> list[MessageQueue]:
        return self._thread.run(self._async.queues(topic, writable=writable))

    def min_offset(self, mq: MessageQueue) -> int:
        return self._thread.run(self._async.min_offset(mq))

    def max_offset(self, mq: MessageQueue) -> int:
        return self._thread.run(self._async.max_offset(mq))

    def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return self._thread.run(self._async.search_offset(mq, timestamp_ms))

    def pull(
        self,
        mq: MessageQueue,
        offset: int,
        *,
        max_nums: int = 32,
        max_bytes: int = 4 * 1024 * 1024,
        tags: Sequence[str] | None = None,
        suspend_timeout_ms: int = 0,
    ) -> PullResult:
        return self._thread.run(
            self._async.pull(
                mq,
                offset,
                max_nums=max_nums,
                max_bytes=max_bytes,
                tags=tags,
                suspend_timeout_ms=suspend_timeout_ms,
            )
        )

    def get_message_by_id(self, topic: str, msg_id: str) -> StoredMessage | None:
        return self._thread.run(self._async.get_message_by_id(topic, msg_id))

    def get_message_by_offset(self, broker_addr: str, offset: int) -> StoredMessage | None:
        return self._thread.run(self._async.get_message_by_offset(broker_addr, offset))

    def query_by_key(
        self,
        topic: str,
        key: str,
        *,
        max_num: int = 64,
        begin_ts_ms: int = 0,
        end_ts_ms: int | None = None,
    ) -> list[StoredMessage]:
        return self._thread.run(
            self._async.query_by_key(
                topic, key, max_num=max_num, begin_ts_ms=begin_ts_ms, end_ts_ms=end_ts_ms
            )
        )

    def list_groups(self) -> list[GroupSummary]:
        return self._thread.run(self._async.list_groups())

    def describe_group(self, group: str) -> GroupDescription:
        return self._thread.run(self._async.describe_group(group))

    def consume_stats(self, group: str, topic: str | None = None) -> list[QueueConsumeStats]:
        return self._thread.run(self._async.consume_stats(group, topic))

    def reset_offset(
        self, group: str, topic: str, position: str, timestamp_ms: int | None = None
    ) -> dict[str, list[QueueOffset]]:
        return self._thread.run(self._async.reset_offset(group, topic, position, timestamp_ms))

    def update_group_config(
        self, config: SubscriptionGroupConfig, *, cluster: str | None = None
    ) -> list[str]:
        return self._thread.run(self._async.update_group_config(config, cluster=cluster))

    def get_group_config(self, group: str) -> SubscriptionGroupConfig:
        return self._thread.run(self._async.get_group_config(group))

    def group_configs(self) -> dict[str, list[SubscriptionGroupConfig]]:
        return self._thread.run(self._async.group_configs())

    def delete_group_config(self, group: str, *, cluster: str | None = None) -> list[str]:
        return self._thread.run(self._async.delete_group_config(group, cluster=cluster))

    def dlq_messages(self, group: str, *, max_messages: int = 1000) -> list[DlqMessage]:
        return self._thread.run(self._async.dlq_messages(group, max_messages=max_messages))

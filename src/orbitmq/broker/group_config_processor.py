"""Handlers of consumer-group configs and of the admin read of dead-letter queues.

- UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200): body SubscriptionGroupConfig; validated, stored
  durably, then answered.
- GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201): body SubscriptionGroupConfigList of every configured
  group; with field ``group``, that group's effective config (the defaults when it has none)
  and field ``configured``.
- DELETE_SUBSCRIPTIONGROUP (207): field ``group``; the group is back to the defaults. Field
  ``deleted`` says whether it had a config (deleting twice is not an error).
- GET_DLQ_MESSAGES (1070): fields ``group``, ``queue_id`` (0), ``queue_offset`` (-1: the
  queue's min offset), ``max_msg_nums`` (1..256, 32). Answers like a pull: SUCCESS with the
  records, PULL_NOT_FOUND (no DLQ here, or nothing from that offset), PULL_OFFSET_MOVED;
  fields ``next_begin_offset``, ``min_offset``, ``max_offset``. It ignores the DLQ topic's
  missing read permission: that is what keeps consumers, not operators, out.

See docs/retry-dlq.md.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from orbitmq.broker.context import BrokerContext
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MessageIllegalError
from orbitmq.common.validation import validate_group
from orbitmq.protocol.bodies import decode_body, encode_body
from orbitmq.protocol.consumer import dlq_topic
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.group_config import (
    SubscriptionGroupConfig,
    SubscriptionGroupConfigList,
    validate_group_config,
)
from orbitmq.protocol.requests import (
    DeleteSubscriptionGroupRequest,
    GetAllSubscriptionGroupRequest,
    GetDlqMessagesRequest,
)
from orbitmq.store.message_store import GetStatus

if TYPE_CHECKING:
    from orbitmq.net.connection import Connection, Reply

DLQ_READ_BYTES = 4 * 1024 * 1024


class GroupConfigProcessor:
    """Consumer-group configs and the admin read of DLQs (the codes above)."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx
        self.groups = ctx.groups
        self.topics = ctx.topics
        self.store = ctx.store
        self.bridge = ctx.bridge

    async def update(self, frame: Frame, conn: Connection) -> Reply:
        if not frame.body:
            raise MessageIllegalError("UPDATE_AND_CREATE_SUBSCRIPTIONGROUP needs a body")
        body = frame.body if isinstance(frame.body, bytes) else bytes(frame.body)
        config = decode_body(body, SubscriptionGroupConfig)
        validate_group_config(config)  # before the thread hop: a bad config costs nothing
        self.ctx.check_metadata_change()  # a slave takes none (NO_PERMISSION, as a send)
        await asyncio.to_thread(self.groups.upsert, config)
        await self.ctx.metadata_logged()  # replicated (sync mode) before it is answered
        return frame.reply(ResponseCode.SUCCESS)

    async def get_all(self, frame: Frame, conn: Connection) -> Reply:
        group = GetAllSubscriptionGroupRequest.decode(frame).group
        if group:
            validate_group(group)
            configs = [self.groups.get(group)]
            fields: dict[str, object] = {"configured": self.groups.find(group) is not None}
        else:
            configs = self.groups.all()
            fields = {}
        body = encode_body(SubscriptionGroupConfigList(configs=configs))
        return frame.reply(ResponseCode.SUCCESS, fields=fields, body=body)

    async def delete(self, frame: Frame, conn: Connection) -> Reply:
        group = DeleteSubscriptionGroupRequest.decode(frame).group
        validate_group(group)
        self.ctx.check_metadata_change()
        deleted = await asyncio.to_thread(self.groups.delete, group)
        await self.ctx.metadata_logged()
        return frame.reply(ResponseCode.SUCCESS, fields={"deleted": deleted})

    async def dlq_messages(self, frame: Frame, conn: Connection) -> Reply:
        req = GetDlqMessagesRequest.decode(frame)
        group = req.group
        validate_group(group)
        queue_id = req.queue_id
        offset = req.queue_offset
        max_nums = req.max_msg_nums
        topic = dlq_topic(group)
        store = self.store
        if self.topics.get(topic) is None:
            return frame.reply(
                ResponseCode.PULL_NOT_FOUND,
                f"group {group} has no dead-letter queue on this broker",
                fields={"next_begin_offset": 0, "min_offset": 0, "max_offset": 0},
            )
        if offset < 0:
            offset = store.min_offset(topic, queue_id)
        res = await self.bridge.read(
            store.get_messages, topic, queue_id, offset, max_nums, DLQ_READ_BYTES, None
        )
        fields = {
            "next_begin_offset": res.next_begin_offset,
            "min_offset": res.min_offset,
            "max_offset": res.max_offset,
        }
        if res.status is GetStatus.FOUND:
            return frame.reply(ResponseCode.SUCCESS, fields=fields), res.body_parts
        if res.status in (GetStatus.OFFSET_TOO_SMALL, GetStatus.OFFSET_OVERFLOW_BADLY):
            return frame.reply(
                ResponseCode.PULL_OFFSET_MOVED, f"offset {offset}: {res.status.value}", fields
            )
        return frame.reply(ResponseCode.PULL_NOT_FOUND, "no message", fields)

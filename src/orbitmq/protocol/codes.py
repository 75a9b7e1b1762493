"""Request codes, numbered as RocketMQ Remoting numbers them where RocketMQ has the request.

Response codes are :class:`orbitmq.common.codes.ResponseCode` (shared with the error
hierarchy). Codes OrbitMQ adds start at 1000.
"""

from __future__ import annotations

import enum

from orbitmq.common.codes import ResponseCode

__all__ = ["RequestCode", "ResponseCode"]


class RequestCode(enum.IntEnum):
    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    UPDATE_BROKER_CONFIG = 25
    GET_BROKER_CONFIG = 26
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    VIEW_MESSAGE_BY_ID = 33
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    WIPE_WRITE_PERM_OF_BROKER = 205
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    ADD_WRITE_PERM_OF_BROKER = 327
    DELETE_TOPIC_IN_BROKER = 215
    DELETE_TOPIC_IN_NAMESRV = 216
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    GET_CONSUMER_CONNECTION_LIST = 203
    DELETE_SUBSCRIPTIONGROUP = 207
    GET_CONSUME_STATS = 208
    RESET_CONSUMER_CLIENT_OFFSET = 220
    INVOKE_BROKER_TO_RESET_OFFSET = 222
    SEND_BATCH_MESSAGE = 320
    UPDATE_NAMESRV_CONFIG = 318
    GET_NAMESRV_CONFIG = 319
    # Pop: RocketMQ numbers these 200050..200151, which do not fit the frame's 16-bit code
    # field; OrbitMQ keeps the last digits in its own range.
    POP_MESSAGE = 1050
    ACK_MESSAGE = 1051
    CHANGE_MESSAGE_INVISIBLETIME = 1053
    BATCH_ACK_MESSAGE = 1151
    # OrbitMQ's own.
    GET_TOPIC_STATS = 1000
    GET_BROKER_RUNTIME_INFO = 1001
    GET_CONSUMER_GROUP_LIST = 1002
    RECALL_MESSAGE = 1060
    """Cancel a pending delayed/timer message by topic and message id (docs/timers.md)."""
    GET_DLQ_MESSAGES = 1070
    """Admin read of a group's %DLQ% topic, which consumers cannot pull (docs/retry-dlq.md)."""
    # Controller (docs/ha.md). RocketMQ numbers these 1001-1013, where OrbitMQ's own 1000-1002
    # already were: OrbitMQ keeps the last two digits in 1200-1213. BROKER_HEARTBEAT keeps 904.
    BROKER_HEARTBEAT = 904
    """A broker's liveness report to every controller node (epoch, offsets, priority)."""
    CONTROLLER_ALTER_SYNC_STATE_SET = 1201
    CONTROLLER_ELECT_MASTER = 1202
    CONTROLLER_REGISTER_BROKER = 1203
    CONTROLLER_GET_REPLICA_INFO = 1204
    CONTROLLER_GET_METADATA_INFO = 1205
    NOTIFY_BROKER_ROLE_CHANGED = 1208
    """One-way, controller to broker: the group's master or epochs changed."""
    CLEAN_BROKER_DATA = 1211
    CONTROLLER_GET_NEXT_BROKER_ID = 1212
    CONTROLLER_APPLY_BROKER_ID = 1213
    CONTROLLER_GET_AUTH_DATA = 1220
    """OrbitMQ's own: the users-and-ACLs document of a controller with ``auth_store = "raft"``
    (field ``version``: the one the caller holds; no body in the answer when it is current)."""
    # Users and ACLs (docs/security.md), RocketMQ 5.3's numbers.
    AUTH_CREATE_USER = 3001
    AUTH_UPDATE_USER = 3002
    AUTH_DELETE_USER = 3003
    AUTH_GET_USER = 3004
    AUTH_LIST_USER = 3005
    AUTH_CREATE_ACL = 3006
    AUTH_UPDATE_ACL = 3007
    AUTH_DELETE_ACL = 3008
    AUTH_GET_ACL = 3009
    AUTH_LIST_ACL = 3010

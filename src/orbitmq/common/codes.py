"""Response codes, numbered as Apache RocketMQ numbers them.

Keeping RocketMQ's numbers means a packet capture, a log line or an error report reads the same
to someone who knows RocketMQ. Codes OrbitMQ adds start at 1000.
"""

from __future__ import annotations

import enum


class ResponseCode(enum.IntEnum):
    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    CONSUMER_NOT_ONLINE = 206
    CONSUME_MSG_TIMEOUT = 207
    NO_MESSAGE = 208
    POLLING_FULL = 209
    POLLING_TIMEOUT = 210
    # OrbitMQ's own codes.
    STORE_IO_ERROR = 1000
    CORRUPT_RECORD = 1001
    STORE_CLOSED = 1002
    RECEIPT_HANDLE_INVALID = 1003
    """A Pop receipt handle that is malformed or names no message this broker handed out."""
    RECEIPT_HANDLE_EXPIRED = 1004
    """A Pop receipt handle that was valid once: already acked, replaced by
    change_invisible_duration, or past its invisible time (the message was made visible again)."""
    OFFSET_ILLEGAL = 1005
    """A committed or reset offset outside the queue ([0, max_offset])."""
    # Timers (1010-1019).
    TIMER_MESSAGE_NOT_FOUND = 1010
    """RECALL_MESSAGE names no delayed message of that topic on this broker."""
    TIMER_MESSAGE_NOT_PENDING = 1011
    """RECALL_MESSAGE came too late: the message was already delivered, or already recalled."""
    # Transactions (1030-1039).
    TRANSACTION_NOT_FOUND = 1030
    """END_TRANSACTION names no half message this broker holds (wrong offset, id or group)."""
    TRANSACTION_STATE_CONFLICT = 1031
    """END_TRANSACTION contradicts the decision already applied (rollback after commit, or any
    decision after the broker discarded the transaction)."""
    TRANSACTION_TYPE_MISMATCH = 1032
    """A transactional send to a topic whose message_type is not TRANSACTION, with
    enforce_topic_message_type on."""
    # Security (1040-1049; docs/security.md).
    ADMIN_REQUIRES_TLS = 1040
    """An admin request (topic, group, offset, permission, config, user or ACL change, or a
    config read) came over plaintext, or over TLS without a client certificate where the
    listener's ``admin_transport`` asks for mutual TLS. Nothing was done."""
    # Controller (RocketMQ's numbers, 2000-2014; docs/ha.md).
    CONTROLLER_FENCED_MASTER_EPOCH = 2000
    """A controller request carried a master epoch that is no longer the group's."""
    CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH = 2001
    """ALTER_SYNC_STATE_SET carried a SyncStateSet epoch that is no longer the group's."""
    CONTROLLER_INVALID_MASTER = 2002
    """ALTER_SYNC_STATE_SET from a broker that is not the group's master."""
    CONTROLLER_INVALID_REPLICAS = 2003
    """A proposed SyncStateSet names an unknown broker or leaves out the master."""
    CONTROLLER_MASTER_NOT_AVAILABLE = 2004
    """No broker can be master now (no alive SyncStateSet member); the set is kept."""
    CONTROLLER_BROKER_NOT_ALIVE = 2006
    """The request names a broker the controller has no live heartbeat from."""
    CONTROLLER_NOT_LEADER = 2007
    """This controller node is not the Raft leader; the remark and ``leader_addr`` say who is."""
    CONTROLLER_BROKER_METADATA_NOT_EXIST = 2008
    """The broker group or broker id is unknown to the controller (apply for an id first)."""
    CONTROLLER_INVALID_CLEAN_BROKER_METADATA = 2009
    """CLEAN_BROKER_DATA named an alive broker or the current master."""
    CONTROLLER_MASTER_STILL_EXIST = 2011
    """An election was asked while the master is alive and no other broker was designated."""
    CONTROLLER_ELECT_MASTER_FAILED = 2012
    """The election may not run yet (the old master's lease may still hold) or the designated
    broker cannot be master; the remark says which."""
    CONTROLLER_BROKER_ID_INVALID = 2014
    """APPLY_BROKER_ID asked for an id that is taken by another broker or is not the next one."""

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

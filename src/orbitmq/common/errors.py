"""The one exception hierarchy of OrbitMQ.

    MQError                          every error OrbitMQ raises on purpose; carries a ResponseCode
    ├── MessageIllegalError          MESSAGE_ILLEGAL: the message breaks a documented limit
    │   ├── InvalidTopicError        empty, too long, or characters outside [A-Za-z0-9%|_+-]
    │   ├── EmptyBodyError
    │   ├── MessageTooLargeError     body over max_message_size
    │   └── PropertiesTooLargeError  encoded properties over max_properties_size
    ├── StoreError                   the message store could not do what was asked
    │   ├── DiskFullError            SERVICE_NOT_AVAILABLE: disk use above the warning ratio
    │   ├── StoreIOError             a write or fsync failed (ENOSPC, EIO); the append did not happen
    │   ├── FlushTimeoutError        FLUSH_DISK_TIMEOUT: appended, but not fsynced in time
    │   ├── StoreClosedError         the store is closed or fenced after an I/O failure
    │   └── CorruptRecordError       bytes on disk fail their checks (path, offset, detail)
    ├── SystemBusyError              SYSTEM_BUSY: a bounded queue is full; retry soon
    ├── ProtocolError                bytes on a connection that are not a valid frame
    ├── RemoteError                  a server answered with a non-SUCCESS ``response_code``
    │   └── RequestTimeoutError      no answer within the timeout
    ├── ClientError                  the client cannot do what was asked (no route, closed, ...)
    └── ConfigError                  a configuration value is out of range

Policy lives on the class: ``retriable`` says whether trying again (possibly elsewhere) can help.
"""

from __future__ import annotations

from typing import ClassVar

from orbitmq.common.codes import ResponseCode


class MQError(Exception):
    code: ClassVar[ResponseCode] = ResponseCode.SYSTEM_ERROR
    retriable: ClassVar[bool] = False


class ConfigError(MQError, ValueError):
    """A configuration value is missing or out of range."""


class MessageIllegalError(MQError, ValueError):
    code = ResponseCode.MESSAGE_ILLEGAL


class InvalidTopicError(MessageIllegalError):
    """The topic name is empty, longer than 127 characters or uses characters outside [A-Za-z0-9%|_+-]."""


class EmptyBodyError(MessageIllegalError):
    """A message must carry a body of at least one byte."""


class MessageTooLargeError(MessageIllegalError):
    """The body is larger than the configured maximum (4 MiB by default)."""


class PropertiesTooLargeError(MessageIllegalError):
    """The encoded properties are larger than the configured maximum (32 KiB by default)."""


class StoreError(MQError):
    """The message store could not complete an operation."""


class DiskFullError(StoreError):
    """Disk use is above ``disk_space_warning_level_ratio``; writes resume once space is freed."""

    code = ResponseCode.SERVICE_NOT_AVAILABLE
    retriable = True


class StoreIOError(StoreError):
    """A write or fsync failed. The failed append is not visible; nothing before it is lost."""

    code = ResponseCode.STORE_IO_ERROR
    retriable = True


class FlushTimeoutError(StoreError):
    """SYNC_FLUSH: the data was appended but not fsynced within ``sync_flush_timeout_ms``."""

    code = ResponseCode.FLUSH_DISK_TIMEOUT
    retriable = True
    result: object = None
    """Where the data landed (it is stored, only not yet fsynced), when known."""


class StoreClosedError(StoreError):
    """The store is closed, or fenced after an fsync failure (reopen it to recover)."""

    code = ResponseCode.STORE_CLOSED


class CorruptRecordError(StoreError):
    """Bytes on disk fail their checks. Raised by strict decoders; readers skip and report instead."""

    code = ResponseCode.CORRUPT_RECORD

    def __init__(self, path: str, offset: int, detail: str) -> None:
        super().__init__(f"{path} @ {offset}: {detail}")
        self.path = path
        self.offset = offset
        self.detail = detail


class SystemBusyError(MQError):
    """The server is overloaded (a full send queue or too long a wait): try again soon."""

    code = ResponseCode.SYSTEM_BUSY
    retriable = True


class ProtocolError(MQError):
    """Bytes received that do not form a valid frame; the connection is closed."""

    code = ResponseCode.SYSTEM_ERROR


class RemoteError(MQError):
    """A server answered with an error code; ``response_code`` is the code it sent."""

    def __init__(self, code: int, remark: str = "") -> None:
        super().__init__(f"{_code_name(code)}: {remark}" if remark else _code_name(code))
        self.response_code = code
        self.remark = remark

    @property
    def can_retry(self) -> bool:
        """Whether another try (possibly on another broker) can succeed."""
        return self.response_code in _RETRIABLE


class RequestTimeoutError(RemoteError):
    def __init__(self, remark: str = "") -> None:
        super().__init__(ResponseCode.SYSTEM_BUSY, remark or "request timed out")


class ClientError(MQError):
    """The client cannot do what was asked: no route to the topic, closed, bad arguments."""


class FilterExpressionError(MQError, ValueError):
    """A subscription expression (tag or SQL92) that cannot be parsed or is too big."""

    code = ResponseCode.SUBSCRIPTION_PARSE_FAILED


class SubscriptionGroupNotExistError(MQError):
    """A request names a consumer group this broker does not know."""

    code = ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST


class ReceiptHandleInvalidError(MQError, ValueError):
    """A Pop receipt handle that is malformed or names nothing this broker handed out."""

    code = ResponseCode.RECEIPT_HANDLE_INVALID


class ReceiptHandleExpiredError(MQError):
    """A Pop receipt handle that is no longer current: acked, replaced, or past its time."""

    code = ResponseCode.RECEIPT_HANDLE_EXPIRED


class OffsetIllegalError(MQError, ValueError):
    """An offset to commit or reset to that lies outside the queue."""

    code = ResponseCode.OFFSET_ILLEGAL


class TransactionNotFoundError(MQError):
    """END_TRANSACTION names no half message this broker holds (offset, id or group wrong)."""

    code = ResponseCode.TRANSACTION_NOT_FOUND


class TransactionStateConflictError(MQError):
    """END_TRANSACTION contradicts the decision already applied to the transaction."""

    code = ResponseCode.TRANSACTION_STATE_CONFLICT


class TransactionTypeMismatchError(MessageIllegalError):
    """A transactional send to a topic not typed TRANSACTION (enforce_topic_message_type on)."""

    code = ResponseCode.TRANSACTION_TYPE_MISMATCH


_RETRIABLE = frozenset(
    {
        ResponseCode.SYSTEM_ERROR,
        ResponseCode.SYSTEM_BUSY,
        ResponseCode.FLUSH_DISK_TIMEOUT,
        ResponseCode.SLAVE_NOT_AVAILABLE,
        ResponseCode.FLUSH_SLAVE_TIMEOUT,
        ResponseCode.SERVICE_NOT_AVAILABLE,
        ResponseCode.TOPIC_NOT_EXIST,
        ResponseCode.STORE_IO_ERROR,
        ResponseCode.STORE_CLOSED,
    }
)


def _code_name(code: int) -> str:
    try:
        return ResponseCode(code).name
    except ValueError:
        return f"CODE_{code}"

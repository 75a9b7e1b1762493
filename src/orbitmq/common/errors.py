"""The one exception hierarchy of OrbitMQ, and the one registry from response code to class.

Every error OrbitMQ raises on purpose is an ``MQError`` with a ``code`` (a ResponseCode). Each
response code has exactly one class here, registered by the code it declares; subclasses that
refine a code (``InvalidTopicError`` is a MESSAGE_ILLEGAL) inherit it and are not registered.
The broker raises these classes and its dispatcher answers with ``exc.code``; a client turns an
answer back into the code's class with ``error_for(code, remark)``.

Policy lives on the class, read by every client, the proxy and the Spark connector, so they
cannot disagree (docs/errors.md has the table, checked by a test):

- ``retriable``: trying again, possibly on another broker, can help;
- ``refresh_route``: the answer suggests a stale route: refresh it before the next try;
- ``stored``: the message IS stored, less safely than asked (FLUSH_DISK_TIMEOUT,
  FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE). A producer must not resend it as lost; like
  RocketMQ it reports a SendResult with that status instead.

    MQError                            SYSTEM_ERROR unless a subclass says otherwise
    ├── InternalServerError            SYSTEM_ERROR answered by a server
    ├── MessageIllegalError            MESSAGE_ILLEGAL: the message breaks a documented limit
    │   ├── InvalidTopicError, EmptyBodyError, MessageTooLargeError, PropertiesTooLargeError,
    │   │   TimerDelayTooLongError     (refinements, same code)
    │   └── TransactionTypeMismatchError  its own code
    ├── StoreError                     the message store could not do what was asked
    │   ├── DiskFullError              SERVICE_NOT_AVAILABLE (also a ServiceNotAvailableError)
    │   ├── StoreUnavailableError      SERVICE_NOT_AVAILABLE: a store service is failing
    │   ├── TierUnavailableError       SERVICE_NOT_AVAILABLE: a cold read cannot reach the tier
    │   ├── StoreIOError, FlushTimeoutError, StoreClosedError, CorruptRecordError
    ├── NoPermissionError              NO_PERMISSION; DeadLetterNotWritableError refines it
    ├── ... one class per other code (see the table in docs/errors.md)
    ├── ProtocolError                  bytes on a connection that are not a valid frame
    ├── RemoteError                    a server answered ``code``; error_for builds it
    │   └── RequestTimeoutError        no answer within the timeout
    ├── ClientError                    the client cannot do what was asked (no route, closed, ...)
    └── ConfigError                    a configuration value is out of range

What ``error_for`` returns is both a ``RemoteError`` (a server said so: ``except RemoteError``
keeps working) and an instance of the code's class (``except TopicNotExistError`` works on
either side of the wire). The two-base class is made once per code, on first use. An unknown
code gives a plain ``RemoteError`` carrying it, with no policy (nothing is retried blindly).
"""

from __future__ import annotations

from typing import Any, ClassVar, cast

from orbitmq.common.codes import ResponseCode

__all__ = [
    "AdminRequiresTlsError",
    "ClientError",
    "ConfigError",
    "ConsumeTimeoutError",
    "ConsumerNotOnlineError",
    "ControllerBrokerIdInvalidError",
    "ControllerBrokerMetadataNotExistError",
    "ControllerBrokerNotAliveError",
    "ControllerElectMasterFailedError",
    "ControllerFencedMasterEpochError",
    "ControllerFencedSyncStateSetEpochError",
    "ControllerInvalidCleanBrokerMetadataError",
    "ControllerInvalidMasterError",
    "ControllerInvalidReplicasError",
    "ControllerMasterNotAvailableError",
    "ControllerMasterStillExistError",
    "ControllerNotLeaderError",
    "CorruptRecordError",
    "DeadLetterNotWritableError",
    "DiskFullError",
    "EmptyBodyError",
    "FilterExpressionError",
    "FlushSlaveTimeoutError",
    "FlushTimeoutError",
    "InternalServerError",
    "InvalidTopicError",
    "MQError",
    "MessageIllegalError",
    "MessageNotFoundError",
    "MessageTooLargeError",
    "NoMessageError",
    "NoPermissionError",
    "OffsetIllegalError",
    "PollingFullError",
    "PollingTimeoutError",
    "PropertiesTooLargeError",
    "ProtocolError",
    "PullNotFoundError",
    "PullOffsetMovedError",
    "PullRetryImmediatelyError",
    "ReceiptHandleExpiredError",
    "ReceiptHandleInvalidError",
    "RemoteError",
    "RequestCodeNotSupportedError",
    "RequestTimeoutError",
    "ServiceNotAvailableError",
    "SlaveNotAvailableError",
    "StoreClosedError",
    "StoreError",
    "StoreIOError",
    "SubscriptionGroupNotExistError",
    "SubscriptionNotExistError",
    "SubscriptionNotLatestError",
    "SystemBusyError",
    "TimerDelayTooLongError",
    "TimerMessageNotFoundError",
    "TimerMessageNotPendingError",
    "TopicAlreadyExistsError",
    "TopicNotExistError",
    "TransactionFailedError",
    "TransactionNotFoundError",
    "TransactionStateConflictError",
    "TransactionTypeMismatchError",
    "VersionNotSupportedError",
    "error_class",
    "error_for",
    "registered_codes",
    "remote_class",
]

_CLASS_BY_CODE: dict[int, type[MQError]] = {}
_REMOTE_BY_CLASS: dict[type[MQError], type[RemoteError]] = {}


class MQError(Exception):
    code: int = ResponseCode.SYSTEM_ERROR
    """The ResponseCode a server answers for this error (an instance attribute on RemoteError)."""
    retriable: ClassVar[bool] = False
    """Trying again, possibly on another broker, can help."""
    refresh_route: ClassVar[bool] = False
    """The cached route is likely stale: refresh it before trying again."""
    stored: ClassVar[bool] = False
    """The message is stored, only less safely than asked: never resend it as lost."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" not in cls.__dict__:
            return  # a refinement of its parent's code, or no code of its own
        # One registry: a class declared elsewhere would be known only once its module is
        # imported, and error_for must not depend on import order.
        if cls.__module__ != __name__:
            raise TypeError(f"{cls.__qualname__}: response-code classes live in {__name__}")
        code = int(cls.__dict__["code"])
        other = _CLASS_BY_CODE.setdefault(code, cls)
        if other is not cls:
            raise TypeError(f"{cls.__name__} and {other.__name__} both claim code {code}")


class InternalServerError(MQError):
    """SYSTEM_ERROR: the server failed in a way it did not foresee (its log says why)."""

    code = ResponseCode.SYSTEM_ERROR
    retriable = True


class SystemBusyError(MQError):
    """The server is overloaded (a full send queue or too long a wait): try again soon."""

    code = ResponseCode.SYSTEM_BUSY
    retriable = True


class RequestCodeNotSupportedError(MQError):
    """The server does not handle this request code."""

    code = ResponseCode.REQUEST_CODE_NOT_SUPPORTED


class TransactionFailedError(MQError):
    """TRANSACTION_FAILED, as RocketMQ numbers it; OrbitMQ's brokers answer more precise codes."""

    code = ResponseCode.TRANSACTION_FAILED


class ConfigError(MQError, ValueError):
    """A configuration value is missing or out of range."""


class MessageIllegalError(MQError, ValueError):
    """The message (or a request field) breaks a documented limit."""

    code = ResponseCode.MESSAGE_ILLEGAL


class InvalidTopicError(MessageIllegalError):
    """The topic name is empty, longer than 127 characters, uses characters outside [A-Za-z0-9%|_+.-] or is . or ..."""


class EmptyBodyError(MessageIllegalError):
    """A message must carry a body of at least one byte."""


class MessageTooLargeError(MessageIllegalError):
    """The body is larger than the configured maximum (4 MiB by default)."""


class PropertiesTooLargeError(MessageIllegalError):
    """The encoded properties are larger than the configured maximum (32 KiB by default)."""


class TimerDelayTooLongError(MessageIllegalError):
    """A delay beyond ``timer_max_delay_ms``."""


class ServiceNotAvailableError(MQError):
    """The broker cannot take this request now (disk full, read-only, starting or stopping)."""

    code = ResponseCode.SERVICE_NOT_AVAILABLE
    retriable = True


class StoreError(MQError):
    """The message store could not complete an operation."""


class DiskFullError(StoreError, ServiceNotAvailableError):
    """Disk use is above ``disk_space_warning_level_ratio``; writes resume once space is freed."""


class StoreUnavailableError(StoreError, ServiceNotAvailableError):
    """A store service that makes sends visible (the dispatcher) is failing: sends are refused
    until it works again, rather than acknowledged and never readable."""


class TierUnavailableError(StoreError, ServiceNotAvailableError):
    """A read below the local data needs the tier (docs/tiered-storage.md), which cannot be
    read now: retry later; no offset moves past the unread data."""


class StoreIOError(StoreError):
    """A write or fsync failed. The failed append is not visible; nothing before it is lost."""

    code = ResponseCode.STORE_IO_ERROR
    retriable = True


class FlushTimeoutError(StoreError):
    """SYNC_FLUSH: the data was appended but not fsynced within ``sync_flush_timeout_ms``."""

    code = ResponseCode.FLUSH_DISK_TIMEOUT
    stored = True
    result: object = None
    """Where the data landed (it is stored, only not yet fsynced), when known."""


class StoreClosedError(StoreError):
    """The store is closed, or fenced after an fsync failure (reopen it to recover). Another
    broker can take the request meanwhile."""

    code = ResponseCode.STORE_CLOSED
    retriable = True


class CorruptRecordError(StoreError):
    """Bytes on disk fail their checks. Raised by strict decoders; readers skip and report instead."""

    code = ResponseCode.CORRUPT_RECORD

    def __init__(self, path: str, offset: int, detail: str) -> None:
        super().__init__(f"{path} @ {offset}: {detail}")
        self.path = path
        self.offset = offset
        self.detail = detail


class SlaveNotAvailableError(MQError):
    """Stored on the master, but no slave is there to copy it (SYNC_MASTER)."""

    code = ResponseCode.SLAVE_NOT_AVAILABLE
    stored = True


class FlushSlaveTimeoutError(MQError):
    """Stored on the master, but the slave did not confirm its copy in time (SYNC_MASTER)."""

    code = ResponseCode.FLUSH_SLAVE_TIMEOUT
    stored = True


class VersionNotSupportedError(MQError):
    """The frame's protocol version is newer than the server speaks."""

    code = ResponseCode.VERSION_NOT_SUPPORTED


class NoPermissionError(MQError):
    """The topic is not writable (or readable) here, or the group is disabled. Not retried: the
    permission will not change by itself; the client refreshes its route, since a broker turned
    read-only is dropped from the topic's writable queues."""

    code = ResponseCode.NO_PERMISSION
    refresh_route = True


class AdminRequiresTlsError(MQError):
    """An admin request over a connection that the listener's ``admin_transport`` does not
    accept (plaintext, or TLS without a client certificate): not retried, reconnect with TLS."""

    code = ResponseCode.ADMIN_REQUIRES_TLS


class DeadLetterNotWritableError(NoPermissionError):
    """The group's DLQ or retry topic exists here without write permission (or the broker is
    read-only): the copy cannot be stored, the message stays un-consumed."""


class TopicNotExistError(MQError):
    """The topic does not exist on this broker; the route may be stale, or another broker has it."""

    code = ResponseCode.TOPIC_NOT_EXIST
    retriable = True
    refresh_route = True


class TopicAlreadyExistsError(MQError):
    """TOPIC_EXIST_ALREADY: a create that must not overwrite found the topic."""

    code = ResponseCode.TOPIC_EXIST_ALREADY


class PullNotFoundError(MQError):
    """PULL_NOT_FOUND: nothing to read from that offset yet; a later pull may find some."""

    code = ResponseCode.PULL_NOT_FOUND
    retriable = True


class PullRetryImmediatelyError(MQError):
    """PULL_RETRY_IMMEDIATELY: nothing read passed the filter; pull on from the next offset."""

    code = ResponseCode.PULL_RETRY_IMMEDIATELY
    retriable = True


class PullOffsetMovedError(MQError):
    """PULL_OFFSET_MOVED: the offset lies outside the queue; pull again from the one answered."""

    code = ResponseCode.PULL_OFFSET_MOVED


class MessageNotFoundError(MQError):
    """QUERY_NOT_FOUND: no (indexed) message, or no committed offset, where the request looked."""

    code = ResponseCode.QUERY_NOT_FOUND


class FilterExpressionError(MQError, ValueError):
    """A subscription expression (tag or SQL92) that cannot be parsed or is too big."""

    code = ResponseCode.SUBSCRIPTION_PARSE_FAILED


class SubscriptionNotExistError(MQError):
    """The broker has no subscription of the group to the topic; the consumer's heartbeat that
    registers it may not have arrived yet."""

    code = ResponseCode.SUBSCRIPTION_NOT_EXIST
    retriable = True


class SubscriptionNotLatestError(MQError):
    """The request names an older subscription than the broker holds; the next heartbeat fixes it."""

    code = ResponseCode.SUBSCRIPTION_NOT_LATEST
    retriable = True


class SubscriptionGroupNotExistError(MQError):
    """A request names a consumer group this broker does not know."""

    code = ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST


class ConsumerNotOnlineError(MQError):
    """The group has no online member on this broker."""

    code = ResponseCode.CONSUMER_NOT_ONLINE


class ConsumeTimeoutError(MQError):
    """CONSUME_MSG_TIMEOUT: a consumer did not answer a direct consume in time. Not retried: it
    may have consumed the message."""

    code = ResponseCode.CONSUME_MSG_TIMEOUT


class NoMessageError(MQError):
    """NO_MESSAGE: a Pop found nothing to hand out; a later one may."""

    code = ResponseCode.NO_MESSAGE
    retriable = True


class PollingFullError(MQError):
    """The group has pop_max_inflight_per_group messages out un-acked: ack some first."""

    code = ResponseCode.POLLING_FULL
    retriable = True


class PollingTimeoutError(MQError):
    """POLLING_TIMEOUT: a long poll ended with nothing; poll again."""

    code = ResponseCode.POLLING_TIMEOUT
    retriable = True


class ReceiptHandleInvalidError(MQError, ValueError):
    """A Pop receipt handle that is malformed or names nothing this broker handed out."""

    code = ResponseCode.RECEIPT_HANDLE_INVALID


class ReceiptHandleExpiredError(MQError):
    """A Pop receipt handle that is no longer current: acked, replaced, or past its time."""

    code = ResponseCode.RECEIPT_HANDLE_EXPIRED


class OffsetIllegalError(MQError, ValueError):
    """An offset to commit or reset to that lies outside the queue."""

    code = ResponseCode.OFFSET_ILLEGAL


class TimerMessageNotFoundError(MQError):
    """RECALL_MESSAGE: no delayed message with that id and topic on this broker."""

    code = ResponseCode.TIMER_MESSAGE_NOT_FOUND


class TimerMessageNotPendingError(MQError):
    """RECALL_MESSAGE: the message was delivered or recalled already."""

    code = ResponseCode.TIMER_MESSAGE_NOT_PENDING


class TransactionNotFoundError(MQError):
    """END_TRANSACTION names no half message this broker holds (offset, id or group wrong)."""

    code = ResponseCode.TRANSACTION_NOT_FOUND


class TransactionStateConflictError(MQError):
    """END_TRANSACTION contradicts the decision already applied to the transaction."""

    code = ResponseCode.TRANSACTION_STATE_CONFLICT


class TransactionTypeMismatchError(MessageIllegalError):
    """A transactional send to a topic not typed TRANSACTION (enforce_topic_message_type on)."""

    code = ResponseCode.TRANSACTION_TYPE_MISMATCH


# Controller answers (docs/ha.md); each code's meaning is on its ResponseCode. Retriable:
# NOT_LEADER (ask the leader it names), MASTER_NOT_AVAILABLE (a member may return) and
# ELECT_MASTER_FAILED (the old master's lease may still hold). A fenced epoch means "re-read",
# never a blind retry.
class ControllerFencedMasterEpochError(MQError):
    code = ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH


class ControllerFencedSyncStateSetEpochError(MQError):
    code = ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH


class ControllerInvalidMasterError(MQError):
    code = ResponseCode.CONTROLLER_INVALID_MASTER


class ControllerInvalidReplicasError(MQError):
    code = ResponseCode.CONTROLLER_INVALID_REPLICAS


class ControllerMasterNotAvailableError(MQError):
    code = ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE
    retriable = True


class ControllerBrokerNotAliveError(MQError):
    code = ResponseCode.CONTROLLER_BROKER_NOT_ALIVE


class ControllerNotLeaderError(MQError):
    code = ResponseCode.CONTROLLER_NOT_LEADER
    retriable = True


class ControllerBrokerMetadataNotExistError(MQError):
    code = ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST


class ControllerInvalidCleanBrokerMetadataError(MQError):
    code = ResponseCode.CONTROLLER_INVALID_CLEAN_BROKER_METADATA


class ControllerMasterStillExistError(MQError):
    code = ResponseCode.CONTROLLER_MASTER_STILL_EXIST


class ControllerElectMasterFailedError(MQError):
    code = ResponseCode.CONTROLLER_ELECT_MASTER_FAILED
    retriable = True


class ControllerBrokerIdInvalidError(MQError):
    code = ResponseCode.CONTROLLER_BROKER_ID_INVALID


class ProtocolError(MQError):
    """Bytes received that do not form a valid frame; the connection is closed."""


class RemoteError(MQError):
    """A server answered with an error: ``code`` is the code it sent, ``remark`` its text.

    Build one with ``error_for(code, remark)``, which makes it an instance of the code's class
    too (and so gives it the code's policy). A bare ``RemoteError(code)`` carries no policy."""

    def __init__(self, code: int, remark: str = "") -> None:
        # Not super(): in a two-base class the next __init__ is the code class's, whose
        # arguments (CorruptRecordError's path, offset, detail) a wire answer does not have.
        Exception.__init__(self, f"{_code_name(code)}: {remark}" if remark else _code_name(code))
        self.code = code
        self.remark = remark

    @property
    def can_retry(self) -> bool:
        """Whether another try (possibly on another broker) can succeed: the class's policy,
        or the code's when this is a bare RemoteError. New code reads ``retriable``."""
        known = _CLASS_BY_CODE.get(self.code)
        return self.retriable or (known is not None and known.retriable)


class RequestTimeoutError(RemoteError):
    """No answer within the timeout. Retriable: the request may not have reached the server."""

    retriable = True

    def __init__(self, remark: str = "") -> None:
        super().__init__(ResponseCode.SYSTEM_BUSY, remark or "request timed out")


class ClientError(MQError):
    """The client cannot do what was asked: no route to the topic, closed, bad arguments."""


def registered_codes() -> dict[int, type[MQError]]:
    """Every response code with its class (a copy)."""
    return dict(_CLASS_BY_CODE)


def error_class(code: int) -> type[MQError]:
    """The class of a response code, for its policy; RemoteError for a code nobody registered.
    SUCCESS is not an error: ValueError."""
    if code == ResponseCode.SUCCESS:
        raise ValueError("SUCCESS is not an error")
    return _CLASS_BY_CODE.get(code, RemoteError)


def error_for(code: int, remark: str = "") -> RemoteError:
    """A server's answer ``code`` (with its ``remark``) as the exception to raise: an instance of
    both RemoteError and the code's class; a plain RemoteError for an unknown code."""
    return remote_class(code)(code, remark)


def remote_class(code: int) -> type[RemoteError]:
    """The class of what ``error_for(code, ...)`` returns (a subclass of RemoteError and of
    ``error_class(code)``), for a module that names it: ``X = remote_class(code)`` then
    ``except X`` catches exactly the server's answers with that code."""
    cls = error_class(code)
    if cls is RemoteError:
        return RemoteError
    twin = _REMOTE_BY_CLASS.get(cls)
    if twin is None:
        namespace = {
            "__module__": __name__,
            "__doc__": f"A server's {_code_name(cls.code)} answer: a RemoteError and a "
            f"{cls.__name__}.",
            "__reduce__": _reduce_remote,
        }
        made = cast(type[RemoteError], type(f"Remote{cls.__name__}", (RemoteError, cls), namespace))
        twin = _REMOTE_BY_CLASS.setdefault(cls, made)
    return twin


def _reduce_remote(self: RemoteError) -> tuple[Any, ...]:
    # The two-base classes are not module attributes: pickle rebuilds them through error_for.
    return error_for, (self.code, self.remark)


def _code_name(code: int) -> str:
    try:
        return ResponseCode(code).name
    except ValueError:
        return f"CODE_{code}"

"""The one place where OrbitMQ's outcomes become ``apache.rocketmq.v2.Code`` statuses.

The official clients read a ``Status`` in every response body and turn its code into a typed
exception (BadRequest, NotFound, TooManyRequests, ...), and some codes steer them (a producer
stops retrying on TOO_MANY_REQUESTS; MESSAGE_NOT_FOUND is an empty receive, not an error). So
every RPC answers business failures in the body, with the code from this table, and keeps gRPC
status codes for transport faults. Like the Java proxy's ``ResponseBuilder``, the mapping is one
table: ResponseCode (what brokers answer) -> Code, and exceptions map through their ResponseCode
unless they name a Code themselves (:class:`ProxyError`).
"""

from __future__ import annotations

from orbitmq.client.route import NameServerUnavailableError, TopicRouteNotFoundError
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import (
    EmptyBodyError,
    InvalidTopicError,
    MessageTooLargeError,
    MQError,
    PropertiesTooLargeError,
    RequestTimeoutError,
)
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb

Code = pb.Code

__all__ = [
    "CODE_BY_RESPONSE",
    "ProxyError",
    "code_of",
    "from_error",
    "from_response_code",
    "make",
    "ok",
]


class ProxyError(MQError):
    """A failure the proxy itself detects, with the ``Code`` clients must see."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = code


# Broker/NameServer answers -> client-visible codes. Anything missing is INTERNAL_ERROR.
CODE_BY_RESPONSE: dict[int, int] = {
    ResponseCode.SUCCESS: Code.OK,
    ResponseCode.SYSTEM_ERROR: Code.INTERNAL_SERVER_ERROR,
    ResponseCode.SYSTEM_BUSY: Code.TOO_MANY_REQUESTS,
    ResponseCode.REQUEST_CODE_NOT_SUPPORTED: Code.NOT_IMPLEMENTED,
    ResponseCode.TRANSACTION_FAILED: Code.INTERNAL_SERVER_ERROR,
    ResponseCode.FLUSH_DISK_TIMEOUT: Code.MASTER_PERSISTENCE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: Code.HA_NOT_AVAILABLE,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: Code.SLAVE_PERSISTENCE_TIMEOUT,
    ResponseCode.MESSAGE_ILLEGAL: Code.BAD_REQUEST,
    ResponseCode.SERVICE_NOT_AVAILABLE: Code.INTERNAL_SERVER_ERROR,
    ResponseCode.VERSION_NOT_SUPPORTED: Code.VERSION_UNSUPPORTED,
    ResponseCode.NO_PERMISSION: Code.FORBIDDEN,
    ResponseCode.TOPIC_NOT_EXIST: Code.TOPIC_NOT_FOUND,
    ResponseCode.PULL_NOT_FOUND: Code.MESSAGE_NOT_FOUND,
    ResponseCode.PULL_RETRY_IMMEDIATELY: Code.MESSAGE_NOT_FOUND,
    ResponseCode.PULL_OFFSET_MOVED: Code.ILLEGAL_OFFSET,
    ResponseCode.QUERY_NOT_FOUND: Code.OFFSET_NOT_FOUND,
    ResponseCode.SUBSCRIPTION_PARSE_FAILED: Code.ILLEGAL_FILTER_EXPRESSION,
    ResponseCode.SUBSCRIPTION_NOT_EXIST: Code.CONSUMER_GROUP_NOT_FOUND,
    ResponseCode.SUBSCRIPTION_NOT_LATEST: Code.BAD_REQUEST,
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: Code.CONSUMER_GROUP_NOT_FOUND,
    ResponseCode.CONSUMER_NOT_ONLINE: Code.NOT_FOUND,
    ResponseCode.CONSUME_MSG_TIMEOUT: Code.PROXY_TIMEOUT,
    ResponseCode.NO_MESSAGE: Code.MESSAGE_NOT_FOUND,
    ResponseCode.POLLING_FULL: Code.TOO_MANY_REQUESTS,
    ResponseCode.POLLING_TIMEOUT: Code.MESSAGE_NOT_FOUND,
    ResponseCode.STORE_IO_ERROR: Code.INTERNAL_SERVER_ERROR,
    ResponseCode.CORRUPT_RECORD: Code.INTERNAL_SERVER_ERROR,
    ResponseCode.STORE_CLOSED: Code.INTERNAL_SERVER_ERROR,
    ResponseCode.RECEIPT_HANDLE_INVALID: Code.INVALID_RECEIPT_HANDLE,
    ResponseCode.RECEIPT_HANDLE_EXPIRED: Code.INVALID_RECEIPT_HANDLE,
    ResponseCode.OFFSET_ILLEGAL: Code.ILLEGAL_OFFSET,
    ResponseCode.TIMER_MESSAGE_NOT_FOUND: Code.NOT_FOUND,
    ResponseCode.TIMER_MESSAGE_NOT_PENDING: Code.PRECONDITION_FAILED,
    ResponseCode.TRANSACTION_NOT_FOUND: Code.INVALID_TRANSACTION_ID,
    ResponseCode.TRANSACTION_STATE_CONFLICT: Code.PRECONDITION_FAILED,
    ResponseCode.TRANSACTION_TYPE_MISMATCH: Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
}

# Exceptions more precise than their ResponseCode (checked in order: subclasses first).
_CODE_BY_ERROR: tuple[tuple[type[BaseException], int], ...] = (
    (RequestTimeoutError, Code.PROXY_TIMEOUT),
    (InvalidTopicError, Code.ILLEGAL_TOPIC),
    (EmptyBodyError, Code.MESSAGE_BODY_EMPTY),
    (MessageTooLargeError, Code.MESSAGE_BODY_TOO_LARGE),
    (PropertiesTooLargeError, Code.MESSAGE_PROPERTIES_TOO_LARGE),
    (TimeoutError, Code.PROXY_TIMEOUT),
    (TopicRouteNotFoundError, Code.TOPIC_NOT_FOUND),
    (NameServerUnavailableError, Code.INTERNAL_SERVER_ERROR),
)


_OK = int(Code.OK)


def ok(message: str = "OK") -> pb.Status:
    return pb.Status(code=_OK, message=message)  # type: ignore[arg-type]


def make(code: int, message: str) -> pb.Status:
    return pb.Status(code=code, message=message)  # type: ignore[arg-type]


def from_response_code(code: int, remark: str = "") -> pb.Status:
    """A broker's answer code as a client status (unknown codes: INTERNAL_ERROR)."""
    mapped = CODE_BY_RESPONSE.get(code, Code.INTERNAL_ERROR)
    if not remark:
        try:
            remark = ResponseCode(code).name
        except ValueError:
            remark = f"broker answered code {code}"
    return make(mapped, remark)


def code_of(exc: BaseException) -> int:
    """The Code an exception stands for."""
    if isinstance(exc, ProxyError):
        return exc.status_code
    for typ, mapped in _CODE_BY_ERROR:
        if isinstance(exc, typ):
            return mapped
    if isinstance(exc, MQError):
        return CODE_BY_RESPONSE.get(exc.code, Code.INTERNAL_ERROR)
    return Code.INTERNAL_ERROR


def from_error(exc: BaseException) -> pb.Status:
    """An exception as a client status; the message is the exception's text (never empty)."""
    return make(code_of(exc), str(exc) or type(exc).__name__)

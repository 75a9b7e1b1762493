"""Kafka error codes the gateway answers, and how an OrbitMQ failure becomes one.

A failure OrbitMQ calls retriable (the error registry's policy: a busy broker, a slave timeout,
a route to refresh) becomes a code Kafka clients retry (REQUEST_TIMED_OUT, NOT_LEADER); the
rest become UNKNOWN_SERVER_ERROR, which clients report.
"""

from __future__ import annotations

from orbitmq.client.route import TopicRouteNotFoundError
from orbitmq.common.errors import MQError

UNKNOWN_SERVER_ERROR = -1
NONE = 0
OFFSET_OUT_OF_RANGE = 1
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
NOT_LEADER_OR_FOLLOWER = 6
REQUEST_TIMED_OUT = 7
MESSAGE_TOO_LARGE = 10
COORDINATOR_NOT_AVAILABLE = 15
INVALID_TOPIC_EXCEPTION = 17
INVALID_GROUP_ID = 24
TOPIC_AUTHORIZATION_FAILED = 29
GROUP_AUTHORIZATION_FAILED = 30
CLUSTER_AUTHORIZATION_FAILED = 31
TOPIC_ALREADY_EXISTS = 36
INVALID_PARTITIONS = 37
INVALID_REPLICATION_FACTOR = 38
INVALID_REQUEST = 42
UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
SASL_AUTHENTICATION_FAILED = 58
UNKNOWN_TOPIC_ID = 100


def code_for(exc: BaseException) -> int:
    if isinstance(exc, TopicRouteNotFoundError):
        return UNKNOWN_TOPIC_OR_PARTITION
    if isinstance(exc, TimeoutError):
        return REQUEST_TIMED_OUT
    if isinstance(exc, MQError):
        if getattr(exc, "refresh_route", False):
            return NOT_LEADER_OR_FOLLOWER
        if getattr(exc, "retriable", False):
            return REQUEST_TIMED_OUT
    return UNKNOWN_SERVER_ERROR

"""The error registry: one class per response code, and the policy every client reads from it.

The table below is the contract. Changing a row changes what producers, consumers, the proxy and
the Spark connector do on that answer, so it is pinned code by code.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from orbitmq.common import errors
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import (
    AdminRequiresTlsError,
    ConsumerNotOnlineError,
    ConsumeTimeoutError,
    ControllerBrokerIdInvalidError,
    ControllerBrokerMetadataNotExistError,
    ControllerBrokerNotAliveError,
    ControllerElectMasterFailedError,
    ControllerFencedMasterEpochError,
    ControllerFencedSyncStateSetEpochError,
    ControllerInvalidCleanBrokerMetadataError,
    ControllerInvalidMasterError,
    ControllerInvalidReplicasError,
    ControllerMasterNotAvailableError,
    ControllerMasterStillExistError,
    ControllerNotLeaderError,
    CorruptRecordError,
    DeadLetterNotWritableError,
    DiskFullError,
    FilterExpressionError,
    FlushSlaveTimeoutError,
    FlushTimeoutError,
    InternalServerError,
    InvalidTopicError,
    MessageIllegalError,
    MessageNotFoundError,
    MQError,
    NoMessageError,
    NoPermissionError,
    OffsetIllegalError,
    PollingFullError,
    PollingTimeoutError,
    PullNotFoundError,
    PullOffsetMovedError,
    PullRetryImmediatelyError,
    ReceiptHandleExpiredError,
    ReceiptHandleInvalidError,
    RemoteError,
    RequestCodeNotSupportedError,
    RequestTimeoutError,
    ServiceNotAvailableError,
    SlaveNotAvailableError,
    StoreClosedError,
    StoreError,
    StoreIOError,
    SubscriptionGroupNotExistError,
    SubscriptionNotExistError,
    SubscriptionNotLatestError,
    SystemBusyError,
    TimerDelayTooLongError,
    TimerMessageNotFoundError,
    TimerMessageNotPendingError,
    TopicAlreadyExistsError,
    TopicNotExistError,
    TransactionFailedError,
    TransactionNotFoundError,
    TransactionStateConflictError,
    TransactionTypeMismatchError,
    VersionNotSupportedError,
    error_class,
    error_for,
    registered_codes,
    remote_class,
)
from orbitmq.net.connection import ConnectionClosedError

RC = ResponseCode
R, F = True, False

# code: (class, retriable, refresh_route, stored)
POLICY: dict[ResponseCode, tuple[type[MQError], bool, bool, bool]] = {
    RC.SYSTEM_ERROR: (InternalServerError, R, F, F),
    RC.SYSTEM_BUSY: (SystemBusyError, R, F, F),
    RC.REQUEST_CODE_NOT_SUPPORTED: (RequestCodeNotSupportedError, F, F, F),
    RC.TRANSACTION_FAILED: (TransactionFailedError, F, F, F),
    # Stored, less safely than asked: never resent as if lost (RocketMQ's SendStatus).
    RC.FLUSH_DISK_TIMEOUT: (FlushTimeoutError, F, F, R),
    RC.SLAVE_NOT_AVAILABLE: (SlaveNotAvailableError, F, F, R),
    RC.FLUSH_SLAVE_TIMEOUT: (FlushSlaveTimeoutError, F, F, R),
    RC.MESSAGE_ILLEGAL: (MessageIllegalError, F, F, F),
    RC.SERVICE_NOT_AVAILABLE: (ServiceNotAvailableError, R, F, F),
    RC.VERSION_NOT_SUPPORTED: (VersionNotSupportedError, F, F, F),
    # Not retried: the permission does not change by itself. The route may have.
    RC.NO_PERMISSION: (NoPermissionError, F, R, F),
    RC.TOPIC_NOT_EXIST: (TopicNotExistError, R, R, F),
    RC.TOPIC_EXIST_ALREADY: (TopicAlreadyExistsError, F, F, F),
    RC.PULL_NOT_FOUND: (PullNotFoundError, R, F, F),
    RC.PULL_RETRY_IMMEDIATELY: (PullRetryImmediatelyError, R, F, F),
    RC.PULL_OFFSET_MOVED: (PullOffsetMovedError, F, F, F),
    RC.QUERY_NOT_FOUND: (MessageNotFoundError, F, F, F),
    RC.SUBSCRIPTION_PARSE_FAILED: (FilterExpressionError, F, F, F),
    RC.SUBSCRIPTION_NOT_EXIST: (SubscriptionNotExistError, R, F, F),
    RC.SUBSCRIPTION_NOT_LATEST: (SubscriptionNotLatestError, R, F, F),
    RC.SUBSCRIPTION_GROUP_NOT_EXIST: (SubscriptionGroupNotExistError, F, F, F),
    RC.CONSUMER_NOT_ONLINE: (ConsumerNotOnlineError, F, F, F),
    RC.CONSUME_MSG_TIMEOUT: (ConsumeTimeoutError, F, F, F),
    RC.NO_MESSAGE: (NoMessageError, R, F, F),
    RC.POLLING_FULL: (PollingFullError, R, F, F),
    RC.POLLING_TIMEOUT: (PollingTimeoutError, R, F, F),
    RC.STORE_IO_ERROR: (StoreIOError, R, F, F),
    RC.CORRUPT_RECORD: (CorruptRecordError, F, F, F),
    RC.STORE_CLOSED: (StoreClosedError, R, F, F),
    RC.RECEIPT_HANDLE_INVALID: (ReceiptHandleInvalidError, F, F, F),
    RC.RECEIPT_HANDLE_EXPIRED: (ReceiptHandleExpiredError, F, F, F),
    RC.OFFSET_ILLEGAL: (OffsetIllegalError, F, F, F),
    RC.TIMER_MESSAGE_NOT_FOUND: (TimerMessageNotFoundError, F, F, F),
    RC.TIMER_MESSAGE_NOT_PENDING: (TimerMessageNotPendingError, F, F, F),
    RC.TRANSACTION_NOT_FOUND: (TransactionNotFoundError, F, F, F),
    RC.TRANSACTION_STATE_CONFLICT: (TransactionStateConflictError, F, F, F),
    RC.TRANSACTION_TYPE_MISMATCH: (TransactionTypeMismatchError, F, F, F),
    RC.ADMIN_REQUIRES_TLS: (AdminRequiresTlsError, F, F, F),
    # Controller (docs/ha.md): a fenced epoch means "re-read the replica info", never a blind
    # retry; NOT_LEADER names the leader to ask; the others wait for a broker or a lease.
    RC.CONTROLLER_FENCED_MASTER_EPOCH: (ControllerFencedMasterEpochError, F, F, F),
    RC.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH: (ControllerFencedSyncStateSetEpochError, F, F, F),
    RC.CONTROLLER_INVALID_MASTER: (ControllerInvalidMasterError, F, F, F),
    RC.CONTROLLER_INVALID_REPLICAS: (ControllerInvalidReplicasError, F, F, F),
    RC.CONTROLLER_MASTER_NOT_AVAILABLE: (ControllerMasterNotAvailableError, R, F, F),
    RC.CONTROLLER_BROKER_NOT_ALIVE: (ControllerBrokerNotAliveError, F, F, F),
    RC.CONTROLLER_NOT_LEADER: (ControllerNotLeaderError, R, F, F),
    RC.CONTROLLER_BROKER_METADATA_NOT_EXIST: (ControllerBrokerMetadataNotExistError, F, F, F),
    RC.CONTROLLER_INVALID_CLEAN_BROKER_METADATA: (
        ControllerInvalidCleanBrokerMetadataError,
        F,
        F,
        F,
    ),
    RC.CONTROLLER_MASTER_STILL_EXIST: (ControllerMasterStillExistError, F, F, F),
    RC.CONTROLLER_ELECT_MASTER_FAILED: (ControllerElectMasterFailedError, R, F, F),
    RC.CONTROLLER_BROKER_ID_INVALID: (ControllerBrokerIdInvalidError, F, F, F),
}


def test_the_table_names_every_response_code_but_success() -> None:
    assert set(POLICY) == set(ResponseCode) - {ResponseCode.SUCCESS}
    assert set(registered_codes()) == set(POLICY)


@pytest.mark.parametrize("code", list(POLICY), ids=lambda c: c.name)
def test_each_code_has_its_class_and_policy(code: ResponseCode) -> None:
    cls, retriable, refresh_route, stored = POLICY[code]
    assert error_class(code) is cls
    assert cls.code == code
    assert (cls.retriable, cls.refresh_route, cls.stored) == (retriable, refresh_route, stored)


@pytest.mark.parametrize("code", list(POLICY), ids=lambda c: c.name)
def test_error_for_round_trips_every_code(code: ResponseCode) -> None:
    cls, retriable, refresh_route, stored = POLICY[code]
    exc = error_for(int(code), "the remark")
    assert isinstance(exc, cls) and isinstance(exc, RemoteError)
    assert exc.code == code and exc.remark == "the remark"
    assert str(exc) == f"{code.name}: the remark"
    assert (exc.retriable, exc.refresh_route, exc.stored) == (retriable, refresh_route, stored)
    assert error_class(exc.code) is cls
    assert type(error_for(code)) is type(exc) is remote_class(code)  # one per code
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is type(exc) and again.code == code and again.remark == "the remark"


def test_an_unknown_code_is_a_plain_remote_error_carrying_it() -> None:
    exc = error_for(424242, "from the future")
    assert type(exc) is RemoteError
    assert exc.code == 424242 and exc.remark == "from the future"
    assert str(exc) == "CODE_424242: from the future"
    assert not (exc.retriable or exc.refresh_route or exc.stored)
    assert error_class(424242) is RemoteError
    assert remote_class(424242) is RemoteError


def test_success_is_not_an_error() -> None:
    with pytest.raises(ValueError):
        error_for(ResponseCode.SUCCESS)
    with pytest.raises(ValueError):
        error_class(ResponseCode.SUCCESS)


def test_stored_answers_are_never_retried() -> None:
    for cls in registered_codes().values():
        assert not (cls.stored and cls.retriable), cls.__name__


def test_merged_duplicates_are_one_class() -> None:
    # The broker's TopicNotFoundError and NoWritePermissionError were second classes for a code.
    assert not hasattr(errors, "TopicNotFoundError")
    assert not hasattr(errors, "NoWritePermissionError")
    assert error_class(ResponseCode.TOPIC_NOT_EXIST) is TopicNotExistError
    assert error_class(ResponseCode.NO_PERMISSION) is NoPermissionError


@pytest.mark.parametrize(
    ("refinement", "base"),
    [
        (InvalidTopicError, MessageIllegalError),
        (TimerDelayTooLongError, MessageIllegalError),
        (DeadLetterNotWritableError, NoPermissionError),
        (DiskFullError, ServiceNotAvailableError),
    ],
)
def test_refinements_inherit_their_codes_class(
    refinement: type[MQError], base: type[MQError]
) -> None:
    assert issubclass(refinement, base)
    assert refinement.code == base.code
    assert error_class(refinement.code) is base
    assert (refinement.retriable, refinement.refresh_route, refinement.stored) == (
        base.retriable,
        base.refresh_route,
        base.stored,
    )


def test_disk_full_is_a_store_error_too() -> None:
    assert issubclass(DiskFullError, StoreError)


def test_only_common_errors_declares_code_classes() -> None:
    with pytest.raises(TypeError, match="response-code classes live in"):

        class Elsewhere(MQError):
            code = ResponseCode.TOPIC_NOT_EXIST


def test_remote_and_local_forms_are_told_apart() -> None:
    # A client that refuses an expression itself raises the local class; a broker's refusal is
    # both, so `except FilterExpressionError` catches either and `isinstance(RemoteError)` tells.
    local = FilterExpressionError("bad")
    remote = error_for(ResponseCode.SUBSCRIPTION_PARSE_FAILED, "bad")
    assert not isinstance(local, RemoteError)
    assert isinstance(remote, FilterExpressionError) and isinstance(remote, RemoteError)


def test_a_remote_corrupt_record_needs_no_path() -> None:
    exc = error_for(ResponseCode.CORRUPT_RECORD, "segment 3 @ 4096: crc")
    assert isinstance(exc, CorruptRecordError) and exc.code == ResponseCode.CORRUPT_RECORD


def test_one_code_attribute() -> None:
    # A broker answers exc.code whatever the class: no second attribute to consult.
    assert RemoteError(ResponseCode.SYSTEM_BUSY).code == ResponseCode.SYSTEM_BUSY
    assert TopicNotExistError("t").code == ResponseCode.TOPIC_NOT_EXIST
    assert RequestTimeoutError().code == ResponseCode.SYSTEM_BUSY


def test_transport_failures_are_retriable() -> None:
    assert RequestTimeoutError().retriable
    assert ConnectionClosedError().retriable


@pytest.mark.parametrize("code", list(POLICY), ids=lambda c: c.name)
def test_can_retry_follows_the_class_policy(code: ResponseCode) -> None:
    # can_retry is the old spelling; a bare RemoteError answers by its code's class.
    assert RemoteError(code).can_retry == POLICY[code][1]
    assert error_for(code).can_retry == POLICY[code][1]


def policy_table() -> str:
    """The table of docs/errors.md, rendered from the registry."""
    yes = {True: "yes", False: ""}
    rows = [
        "| Code | Name | Class | retriable | refresh_route | stored |",
        "|---:|---|---|:-:|:-:|:-:|",
    ]
    for code, cls in sorted(registered_codes().items()):
        name = ResponseCode(code).name
        rows.append(
            f"| {code} | {name} | `{cls.__name__}` | {yes[cls.retriable]} "
            f"| {yes[cls.refresh_route]} | {yes[cls.stored]} |"
        )
    return "\n".join(rows) + "\n"


def test_docs_errors_md_lists_the_registry() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "errors.md").read_text()
    assert policy_table() in doc, "docs/errors.md's table differs from the registry:\n" + (
        policy_table()
    )

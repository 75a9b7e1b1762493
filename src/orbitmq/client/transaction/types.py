"""Transactions' vocabulary: property names, local transaction states, the listener, results
and the transactional producer's config."""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from orbitmq.client.producer.config import ProducerConfig
from orbitmq.client.producer.types import SendResult, SendStatus
from orbitmq.common.config import above, at_least, setting
from orbitmq.common.errors import (
    ClientError,
    MQError,
)
from orbitmq.common.message import (
    PROPERTY_UNIQ_KEY,
    Message,
    decode_properties,
)
from orbitmq.common.record import StoredMessage
from orbitmq.protocol.messages import decode_send_body

log = logging.getLogger(__name__)

__all__ = [
    "PROPERTY_TRANSACTION_BATCH",
    "EndResult",
    "HalfBatchResult",
    "LocalTransaction",
    "LocalTransactionState",
    "TransactionConfig",
    "TransactionListener",
    "TransactionSendResult",
    "as_state",
    "half_batch_count",
    "unpack_half_batch",
]

PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_TRANSACTION_BATCH = "TRAN_BATCH"
"""On a half batch: how many messages it packs (what a check-back's listener reads)."""
PROPERTY_CHECK_IMMUNITY_S = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_TRANSACTION_ID = "__transactionId__"
HALF_ONLY = (PROPERTY_TRANSACTION_PREPARED, PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID)
RESERVED_IN_BATCH = frozenset(
    {
        *HALF_ONLY,
        PROPERTY_TRANSACTION_BATCH,
        PROPERTY_CHECK_IMMUNITY_S,
        PROPERTY_TRANSACTION_ID,
    }
)
"""Names a message inside a half batch may not carry (the broker refuses them too)."""
RESERVED_BATCH_LEVEL = frozenset(
    {*HALF_ONLY, PROPERTY_TRANSACTION_BATCH, PROPERTY_PRODUCER_GROUP, PROPERTY_UNIQ_KEY}
)
"""Names the producer sets on a half batch itself (the transaction id: ``transaction_id=``)."""


class LocalTransactionState(enum.Enum):
    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"
    """Not decided yet: the broker checks back later."""


class TransactionListener(Protocol):
    """What a transactional producer calls. Either method may be ``async def`` (it then runs
    on the producer's event loop); a plain one runs in a worker thread (for the async producer
    and check-backs) or in the caller's thread (the blocking producer's send_in_transaction)."""

    def execute_local_transaction(self, msg: Message, arg: Any) -> Any:
        """Run the local transaction for the half message ``msg``; return a
        LocalTransactionState (or an awaitable of one)."""

    def check_local_transaction(self, msg: StoredMessage) -> Any:
        """The broker asks for the outcome of an undecided transaction. ``msg`` is the half
        message as stored (topic and queue id are the real ones; ``msg.msg_id`` is the
        transaction id). Return a LocalTransactionState (or an awaitable of one)."""


LocalTransaction = Callable[[Message, Any], Any]
"""``local_tx(msg, arg) -> LocalTransactionState`` (or an awaitable of one)."""


@dataclass(slots=True)
class TransactionSendResult:
    send_result: SendResult
    """Where the half message went (queue_offset and offset are the half message's)."""
    local_transaction_state: LocalTransactionState
    transaction_id: str
    end_error: MQError | None = None
    """Why the decision may not have reached the broker (None: it did). The broker checks
    back then, so the outcome still holds."""

    @property
    def msg_id(self) -> str:
        return self.send_result.msg_id


@dataclass(frozen=True, slots=True)
class HalfBatchResult:
    """A stored half batch: everything END_TRANSACTION needs, as plain fields, so that it can
    be pickled to another process of the producer group (a Spark driver deciding what its
    executors sent) and decided there."""

    topic: str
    queue_id: int
    """The real queue: all ``count`` messages go there on COMMIT."""
    broker_name: str
    broker_addr: str
    """The broker's address when the half was sent ("" if unknown); ``end_many`` prefers the
    current route's address for ``broker_name``."""
    offset: int
    """CommitLog offset of the half record: the handle END_TRANSACTION names."""
    queue_offset: int
    """The half record's offset in the half topic."""
    transaction_id: str
    """The half record's unique id; ``msg.msg_id`` in a check-back."""
    count: int
    msg_ids: tuple[str, ...]
    """Each message's own unique id, in order: the committed copies carry them."""
    status: SendStatus = SendStatus.SEND_OK
    """Not SEND_OK: stored, but not as safely as asked. Roll it back (RocketMQ does)."""

    @property
    def msg_id(self) -> str:
        return self.transaction_id


@dataclass(frozen=True, slots=True)
class EndResult:
    """The outcome of one END_TRANSACTION sent by ``end_many``."""

    transaction_id: str
    state: LocalTransactionState
    """The decision sent."""
    broker_state: str = ""
    """The broker's answer: COMMITTED, ROLLED_BACK, DISCARDED, PENDING (for UNKNOWN), RESOLVED
    (decided long ago, the exact outcome forgotten); "" when ``error`` is set."""
    error: MQError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def half_batch_count(msg: StoredMessage) -> int:
    """How many messages a half record (as a check-back's listener gets it) packs; 0 for a
    single half message."""
    try:
        return max(0, int(msg.properties.get(PROPERTY_TRANSACTION_BATCH, "0")))
    except ValueError:
        return 0


def unpack_half_batch(msg: StoredMessage) -> list[tuple[bytes, dict[str, str]]]:
    """The (body, properties) of each message packed in a half batch, in order. Rarely
    needed: a listener normally decides from the batch's own properties."""
    if not half_batch_count(msg):
        raise ClientError(f"message {msg.msg_id} is not a half batch")
    send = decode_send_body(msg.body)
    return [
        (bytes(body), decode_properties(props))
        for body, props in zip(send.bodies, send.properties, strict=True)
    ]


def as_state(value: object, what: str) -> LocalTransactionState:
    if isinstance(value, LocalTransactionState):
        return value
    log.warning("%s returned %r, not a LocalTransactionState: taken as UNKNOWN", what, value)
    return LocalTransactionState.UNKNOWN


@dataclass(frozen=True, slots=True, kw_only=True)
class TransactionConfig(ProducerConfig):
    """A transactional producer's settings: the producer's (its ``group`` is replaced by the
    group the transactional producer is made for), and how check-backs are served."""

    heartbeat_interval_s: float = setting(
        10.0, "How often the brokers of its topics hear from the producer.", above(0)
    )
    check_concurrency: int = setting(16, "Check-backs answered at once.", at_least(1))
    end_timeout_s: float = setting(3.0, "Timeout of one END_TRANSACTION.", above(0))
    client_id: str | None = setting(None, "None: one made from the host and the process.")

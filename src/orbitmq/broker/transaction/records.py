"""Names and op records of transactional messages (RocketMQ's system topics and properties).

A prepared (half) message is stored in :data:`HALF_TOPIC` (one queue) with the properties
:data:`PROPERTY_REAL_TOPIC` / :data:`PROPERTY_REAL_QUEUE_ID` naming where a commit puts it.
Everything that happens to a half message afterwards is an *op record*: one message in
:data:`OP_TOPIC` (one queue) whose body lists operations, each naming the half message by its
CommitLog offset::

    body = msgpack([1, [op, ...]])
    op   = ["cb", half, topic, queue_id, floor]   commit begun: a copy goes to topic/queue_id,
                                                    at queue offset >= floor
         | ["c", half]                             committed: the copy is stored
         | ["r", half]                             rolled back
         | ["d", half]                             discarded after transaction_check_max checks
         | ["k", [half, ...]]                      checked back once more (the count survives)

A *half batch* is one half record for many messages of one queue: property
:data:`PROPERTY_TRANSACTION_BATCH` holds their count and the body packs them in the send-body
layout (:func:`orbitmq.protocol.messages.encode_send_body`). Its ops are the same as a single
half message's; a commit copies all of them in one append.

Both topics are readable (tools may look) but not writable by clients: only the broker appends,
through the normal append path, so they are exactly as durable as any message.
"""

from __future__ import annotations

import msgspec

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
SYSTEM_TOPICS = (HALF_TOPIC, OP_TOPIC)

PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_CHECK_IMMUNITY_S = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_TRANSACTION_ID = "__transactionId__"
PROPERTY_TRANSACTION_BATCH = "TRAN_BATCH"
"""On a half record: it packs this many messages (an OrbitMQ property, not RocketMQ's)."""

LOG_VERSION = 1


class OpRecordError(ValueError):
    """An op-topic body that is not a valid op record."""


class CommitBegin(msgspec.Struct, tag="cb", array_like=True, frozen=True):
    half: int
    topic: str
    queue_id: int
    floor: int
    """The real queue's max offset before the copy was appended: a restart that finds this op
    without its :class:`Committed` looks for the copy from there on."""


class Committed(msgspec.Struct, tag="c", array_like=True, frozen=True):
    half: int


class RolledBack(msgspec.Struct, tag="r", array_like=True, frozen=True):
    half: int


class Discarded(msgspec.Struct, tag="d", array_like=True, frozen=True):
    half: int


class Checked(msgspec.Struct, tag="k", array_like=True, frozen=True):
    halves: list[int]


Op = CommitBegin | Committed | RolledBack | Discarded | Checked


class _Entry(msgspec.Struct, array_like=True):
    version: int
    ops: list[Op]


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_Entry)


def encode_ops(ops: list[Op]) -> bytes:
    return _encoder.encode(_Entry(LOG_VERSION, ops))


def decode_ops(body: bytes | memoryview) -> list[Op]:
    try:
        entry = _decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise OpRecordError(f"op record does not decode: {exc}") from None
    if entry.version != LOG_VERSION:
        raise OpRecordError(f"op record version {entry.version} is unknown")
    return entry.ops

"""The revive log's records: checkpoints (CK), acks (ACK) and revive marks (DONE).

Every change to the Pop state is one message appended to the system topic :data:`REVIVE_TOPIC`
through the broker's normal append path, so it is as durable as any message in the flush mode
the broker runs in, and a restart rebuilds the state by reading the log again. One message body
carries the operations of one request, which makes them atomic (a record is CRC-checked as a
whole: after a crash either all of a request's operations are there or none is)::

    body = msgpack([1, [op, ...]]) + HMAC-SHA256(secret, msgpack part)[:16]
    op   = ["ck", ck_id, group, topic, origin_topic, queue_id, [offsets], [phys], pop_ms, deadline_ms,
            fifo_attempts (list or nil; absent in entries written before FIFO)]
         | ["ack", ck_id, [index, ...]]
         | ["done", ck_id]

The HMAC (with the broker's own secret, see :mod:`orbitmq.broker.pop.receipt`) makes a record
that anyone else wrote to the topic worthless: replay ignores it, so nobody can ack other
groups' messages or have arbitrary records revived by writing to the log.
"""

from __future__ import annotations

import hashlib
import hmac

import msgspec

REVIVE_TOPIC = "rmq_sys_REVIVE_LOG"
"""The system topic holding the Pop state (RocketMQ's name; one queue)."""
LOG_VERSION = 1
MAC_SIZE = 16
MAX_CK_ENTRIES = 1024
"""A CK holds at most one pop's run of one queue (max_msg_nums is at most 1024)."""


class ReviveEntryError(ValueError):
    """A revive-log body that is not a valid, authentic entry."""


class CkRecord(msgspec.Struct, tag="ck", array_like=True, frozen=True):
    """One pop's run of messages from one queue, handed out until ``deadline_ms``."""

    ck_id: int
    group: str
    topic: str
    """The topic the messages were read from (the pop retry topic for retried messages)."""
    origin_topic: str
    """The topic the consumer popped: unacked messages are revived to
    ``pop_retry_topic(group, origin_topic)``."""
    queue_id: int
    offsets: list[int]
    """Queue offsets of the messages handed out, in order (not always contiguous: messages a
    filter rejected are skipped)."""
    phys: list[int]
    """CommitLog offsets of the same messages (revive reads them back from there)."""
    pop_time_ms: int
    deadline_ms: int
    fifo_attempts: list[int] | None = None
    """FIFO pop only (docs/fifo.md): the delivery attempt (1, 2, ...) of each entry. A FIFO
    entry not acked in time is made visible again in place (never copied to the retry topic),
    so the attempt count lives here. None: an ordinary CK (old entries decode to None)."""


class AckRecord(msgspec.Struct, tag="ack", array_like=True, frozen=True):
    ck_id: int
    indexes: list[int]


class DoneRecord(msgspec.Struct, tag="done", array_like=True, frozen=True):
    """Every unacked entry of the CK was copied to the retry topic: the CK is closed."""

    ck_id: int


Op = CkRecord | AckRecord | DoneRecord


class _Entry(msgspec.Struct, array_like=True):
    version: int
    ops: list[Op]


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_Entry)


def _mac(secret: bytes, data: bytes | memoryview) -> bytes:
    return hmac.new(secret, data, hashlib.sha256).digest()[:MAC_SIZE]


def encode_entry(ops: list[Op], secret: bytes) -> bytes:
    data = _encoder.encode(_Entry(LOG_VERSION, ops))
    return data + _mac(secret, data)


def decode_entry(body: bytes | memoryview, secret: bytes) -> list[Op]:
    """The operations of one revive-log body; ReviveEntryError if it is not one we wrote."""
    view = memoryview(body)
    if len(view) <= MAC_SIZE:
        raise ReviveEntryError("entry is too short")
    data, mac = view[:-MAC_SIZE], view[-MAC_SIZE:]
    if not hmac.compare_digest(_mac(secret, data), bytes(mac)):
        raise ReviveEntryError("entry fails its MAC (not written by this broker)")
    try:
        entry = _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ReviveEntryError(f"entry does not decode: {exc}") from None
    if entry.version != LOG_VERSION:
        raise ReviveEntryError(f"entry version {entry.version} is unknown")
    for op in entry.ops:
        if isinstance(op, CkRecord) and (
            not 0 < len(op.offsets) <= MAX_CK_ENTRIES
            or len(op.offsets) != len(op.phys)
            or op.queue_id < 0
            or (op.fifo_attempts is not None and len(op.fifo_attempts) != len(op.offsets))
        ):
            raise ReviveEntryError(f"CK {op.ck_id:x} is malformed")
        if isinstance(op, AckRecord) and any(i < 0 or i >= MAX_CK_ENTRIES for i in op.indexes):
            raise ReviveEntryError(f"ACK of CK {op.ck_id:x} has an index out of range")
    return entry.ops

"""RocketMQ's message-trace record format (``TraceDataEncoder``), shared by the broker that
writes trace records and the tools that read them (CLI, console).

Trace messages live in ``RMQ_SYS_TRACE_TOPIC``. A message's body is one or more records;
fields are separated by ``\\x01`` and every record ends with ``\\x02``. The message's KEYS
are the traced message ids plus their keys, so an ordinary key query by a message id finds
its trace. Field order per type, as RocketMQ 4.x/5.x clients write and read them:

- ``Pub``: type, ts, region, group, topic, msgId, tags, keys, storeHost, bodyLen, costTime,
  msgType, offsetMsgId, success
- ``SubBefore``: type, ts, region, group, requestId, msgId, retryTimes, keys
- ``SubAfter``: type, requestId, msgId, costTime, success, keys, contextCode, ts, group
- ``EndTransaction``: type, ts, region, group, topic, msgId, tags, keys, storeHost, msgType,
  txId, txState, fromCheck
- ``Recall``: type, ts, region, group, topic, msgId, success (a delayed message recalled before
  it was due; RocketMQ 5.3's ``TraceType.Recall``)

RocketMQ has no trace type of its own for a move to the dead-letter queue. OrbitMQ writes it as
what it is, a ``Pub`` of the message (same msgId) into ``%DLQ%<group>`` with the consumer group
as the record's group, so RocketMQ's tools read it as a publish to the DLQ topic;
:func:`trace_label` names such a record ``DLQ`` in timelines.

Records written by RocketMQ clients decode the same way, so both sources merge in one
timeline. Unknown types are kept with their raw fields.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field

TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
FIELD_SEP = "\x01"
RECORD_END = "\x02"
DEFAULT_REGION = "DefaultRegion"
MAX_TRACE_BODY = 128_000
"""Bytes of records per trace message at most (RocketMQ's ``maxMsgSize`` for traces)."""

PUB, SUB_BEFORE, SUB_AFTER, END_TRANSACTION = "Pub", "SubBefore", "SubAfter", "EndTransaction"
RECALL = "Recall"
DLQ = "DLQ"
"""Not a record type: the label of a ``Pub`` into a ``%DLQ%`` topic (:func:`trace_label`)."""
DLQ_PREFIX = "%DLQ%"

# RocketMQ's MessageType ordinals, as Pub and EndTransaction carry them.
MSG_NORMAL, MSG_TRANS_HALF, MSG_TRANS_COMMIT, MSG_DELAY, MSG_ORDER = 0, 1, 2, 3, 4


@dataclass(slots=True)
class TraceRecord:
    """One trace event. Fields a type does not carry keep their defaults."""

    type: str
    ts: int = 0
    group: str = ""
    msg_id: str = ""
    topic: str = ""
    tags: str = ""
    keys: str = ""
    region: str = DEFAULT_REGION
    store_host: str = ""
    body_len: int = 0
    cost_ms: int = 0
    msg_type: int = MSG_NORMAL
    offset_msg_id: str = ""
    success: bool = True
    request_id: str = ""
    retry_times: int = 0
    context_code: int = 0
    tx_id: str = ""
    tx_state: str = ""
    from_check: bool = False
    raw: list[str] = field(default_factory=list)
    """The fields as read (for types this module does not know)."""

    def encode(self) -> str:
        t = self.type
        if t == PUB:
            parts = [t, self.ts, self.region, self.group, self.topic, self.msg_id, self.tags,
                     self.keys, self.store_host, self.body_len, self.cost_ms, self.msg_type,
                     self.offset_msg_id, _b(self.success)]  # fmt: skip
        elif t == SUB_BEFORE:
            parts = [t, self.ts, self.region, self.group, self.request_id, self.msg_id,
                     self.retry_times, self.keys]  # fmt: skip
        elif t == SUB_AFTER:
            parts = [t, self.request_id, self.msg_id, self.cost_ms, _b(self.success), self.keys,
                     self.context_code, self.ts, self.group]  # fmt: skip
        elif t == END_TRANSACTION:
            parts = [t, self.ts, self.region, self.group, self.topic, self.msg_id, self.tags,
                     self.keys, self.store_host, self.msg_type, self.tx_id, self.tx_state,
                     _b(self.from_check)]  # fmt: skip
        elif t == RECALL:
            parts = [t, self.ts, self.region, self.group, self.topic, self.msg_id,
                     _b(self.success)]  # fmt: skip
        else:
            parts = list(self.raw) or [t]
        return FIELD_SEP.join(_clean(p) for p in parts) + RECORD_END


def _b(value: bool) -> str:
    return "true" if value else "false"


def _clean(value: object) -> str:
    """A field never contains a separator (it would shift every later field)."""
    text = str(value)
    if FIELD_SEP in text or RECORD_END in text:
        text = text.replace(FIELD_SEP, " ").replace(RECORD_END, " ")
    return text


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0


def _decode_one(f: list[str]) -> TraceRecord:
    t = f[0]
    g = f + [""] * 16  # short records (older clients) read as empty fields

    if t == PUB:
        return TraceRecord(t, ts=_int(g[1]), region=g[2], group=g[3], topic=g[4], msg_id=g[5],
                           tags=g[6], keys=g[7], store_host=g[8], body_len=_int(g[9]),
                           cost_ms=_int(g[10]), msg_type=_int(g[11]), offset_msg_id=g[12],
                           success=g[13] != "false", raw=f)  # fmt: skip
    if t == SUB_BEFORE:
        return TraceRecord(t, ts=_int(g[1]), region=g[2], group=g[3], request_id=g[4],
                           msg_id=g[5], retry_times=_int(g[6]), keys=g[7], raw=f)  # fmt: skip
    if t == SUB_AFTER:
        return TraceRecord(t, request_id=g[1], msg_id=g[2], cost_ms=_int(g[3]),
                           success=g[4] != "false", keys=g[5], context_code=_int(g[6]),
                           ts=_int(g[7]), group=g[8], raw=f)  # fmt: skip
    if t == END_TRANSACTION:
        return TraceRecord(t, ts=_int(g[1]), region=g[2], group=g[3], topic=g[4], msg_id=g[5],
                           tags=g[6], keys=g[7], store_host=g[8], msg_type=_int(g[9]),
                           tx_id=g[10], tx_state=g[11], from_check=g[12] == "true",
                           raw=f)  # fmt: skip
    if t == RECALL:
        return TraceRecord(t, ts=_int(g[1]), region=g[2], group=g[3], topic=g[4], msg_id=g[5],
                           success=g[6] != "false", raw=f)  # fmt: skip
    return TraceRecord(t, ts=_int(g[1]), raw=f)


def decode_records(body: bytes | str) -> list[TraceRecord]:
    """Every record of one trace message's body (empty records skipped)."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes | bytearray) else body
    return [_decode_one(r.split(FIELD_SEP)) for r in text.split(RECORD_END) if r.strip()]


def encode_records(records: list[TraceRecord]) -> bytes:
    return "".join(r.encode() for r in records).encode()


def offset_msg_id(host: str, port: int, physical_offset: int) -> str:
    """RocketMQ's offset message id: store host IPv4, port and CommitLog offset, in hex."""
    try:
        ip = socket.inet_aton(host)
    except OSError:
        ip = b"\x00\x00\x00\x00"
    return (ip + struct.pack(">iq", port, physical_offset)).hex().upper()


def timeline(records: list[TraceRecord], msg_id: str) -> list[TraceRecord]:
    """The records of one message in the order they happened (Pub first on a tie)."""
    order = {PUB: 0, END_TRANSACTION: 1, RECALL: 1, SUB_BEFORE: 2, SUB_AFTER: 3, DLQ: 4}
    mine = [r for r in records if r.msg_id == msg_id]
    return sorted(mine, key=lambda r: (r.ts, order.get(trace_label(r), 9)))


def trace_label(r: TraceRecord) -> str:
    """The record's type as a timeline shows it: ``DLQ`` for a Pub into a dead-letter topic."""
    return DLQ if r.type == PUB and r.topic.startswith(DLQ_PREFIX) else r.type


def trace_details(r: TraceRecord) -> str:
    """The fields of a record worth a column of their own in a timeline, as text."""
    if r.type == PUB and r.topic.startswith(DLQ_PREFIX):
        return (f"dead-lettered to {r.topic} (group {r.group or '-'}) keys={r.keys or '-'} "
                f"bytes={r.body_len} store={r.store_host} offsetMsgId={r.offset_msg_id}")  # fmt: skip
    if r.type == RECALL:
        return f"topic={r.topic} " + ("recalled" if r.success else "recall failed")
    if r.type == PUB:
        return (f"topic={r.topic} tags={r.tags or '-'} keys={r.keys or '-'} bytes={r.body_len} "
                f"store={r.store_host} offsetMsgId={r.offset_msg_id}")  # fmt: skip
    if r.type == SUB_BEFORE:
        return f"request={r.request_id} retry={r.retry_times}"
    if r.type == SUB_AFTER:
        return f"request={r.request_id}"
    if r.type == END_TRANSACTION:
        return f"topic={r.topic} state={r.tx_state} from_check={str(r.from_check).lower()}"
    return " ".join(r.raw[1:])

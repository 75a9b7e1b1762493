"""The message model and the properties codec.

Properties travel and rest as RocketMQ encodes them: ``name\\x01value\\x02`` repeated, UTF-8.
System properties use RocketMQ's names (TAGS, KEYS, UNIQ_KEY, ...); KEYS holds several keys
separated by a space. A message's tag hash (stored in the ConsumeQueue) is :func:`tag_hash`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import crc32c
import numpy as np

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
KEY_SEPARATOR = " "

PROPERTY_TAGS = "TAGS"
PROPERTY_KEYS = "KEYS"
PROPERTY_UNIQ_KEY = "UNIQ_CLIENT_MESSAGE_ID_KEYIDX"
PROPERTY_DELAY_LEVEL = "DELAY"
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
PROPERTY_TIMER_OUT_MS = "TIMER_OUT_MS"
"""On a delivered delayed message: the due time (epoch ms) it was scheduled for."""
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_SHARDING_KEY = "__SHARDINGKEY"
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_PRODUCER_ID = "PRODUCER_ID"
"""Idempotent producers (orbitmq.broker.idempotence): on a send's first message, the
producer's id, the send's first sequence on its queue and how many messages it holds."""
PROPERTY_PRODUCER_SEQ = "PRODUCER_SEQ"
PROPERTY_PRODUCER_COUNT = "PRODUCER_COUNT"

DELIVERY_PROPERTIES = frozenset(
    {
        PROPERTY_DELAY_LEVEL,
        PROPERTY_TIMER_DELIVER_MS,
        PROPERTY_TIMER_DELAY_MS,
        PROPERTY_TIMER_DELAY_SEC,
        PROPERTY_TIMER_OUT_MS,
        PROPERTY_REAL_TOPIC,
        PROPERTY_REAL_QUEUE_ID,
        PROPERTY_TRANSACTION_PREPARED,
        PROPERTY_PRODUCER_GROUP,
    }
)
"""What schedules or holds back one delivery (the delay, the timer's fields, a transaction's
real topic and queue, its prepared flag and producer group). A copy of a message (a retry, a
dead letter, a resend) never carries them on; a client never sees them as user properties."""

# RocketMQ sends the unique key as UNIQ_KEY; keep the short alias the documents use.
UNIQ_KEY = PROPERTY_UNIQ_KEY

# System flags (sys_flag field of a stored record), RocketMQ's bit values.
SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
SYSFLAG_TRANSACTION_PREPARED = 0x4
SYSFLAG_TRANSACTION_COMMIT = 0x8
SYSFLAG_TRANSACTION_ROLLBACK = 0xC
SYSFLAG_COMPRESSION_ZSTD = 0x100  # OrbitMQ: body compressed with zstd (with SYSFLAG_COMPRESSED)


def encode_properties(props: Mapping[str, str]) -> bytes:
    """Encode properties as ``k\\x01v\\x02...``; names and values may not contain \\x01 or \\x02."""
    if not props:
        return b""
    return "".join(
        f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}" for k, v in props.items()
    ).encode()


def decode_properties(data: bytes | memoryview) -> dict[str, str]:
    """Decode ``k\\x01v\\x02...``. Malformed pairs (no \\x01) are skipped, never raised on."""
    if not data:
        return {}
    text = bytes(data).decode("utf-8", "replace")
    out: dict[str, str] = {}
    for pair in text.split(PROPERTY_SEPARATOR):
        name, sep, value = pair.partition(NAME_VALUE_SEPARATOR)
        if sep:
            out[name] = value
    return out


def property_value(props: bytes, needle: bytes) -> bytes | None:
    """The raw value of one property; ``needle`` is ``b"NAME\\x01"``. A name only counts at
    the start of the properties or right after a ``\\x02`` separator."""
    at = props.find(needle)
    while at > 0 and props[at - 1] != 0x02:
        at = props.find(needle, at + 1)
    if at < 0:
        return None
    begin = at + len(needle)
    end = props.find(b"\x02", begin)
    return props[begin : end if end >= 0 else len(props)]


@lru_cache(maxsize=65536)
def tag_hash(tag: str | None) -> int:
    """The 64-bit tag code kept in the ConsumeQueue: CRC32C of the UTF-8 tag, 0 for no tag."""
    if not tag:
        return 0
    return int(crc32c.crc32c(tag.encode()))


def split_keys(keys: str | None) -> list[str]:
    return [k for k in keys.split(KEY_SEPARATOR) if k] if keys else []


@dataclass(slots=True)
class Message:
    """What a producer sends: a topic, a body, and optional tag, keys and user properties."""

    topic: str
    body: bytes
    tags: str | None = None
    keys: Sequence[str] = ()
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0

    def set_delay_level(self, level: int) -> Message:
        """Deliver after delay level ``level`` (1..18 by default: 1s 5s 10s 30s 1m ... 2h;
        0 = no delay; above the last level means the last). Returns the message."""
        self.properties[PROPERTY_DELAY_LEVEL] = str(int(level))
        return self

    def set_deliver_time_ms(self, epoch_ms: int) -> Message:
        """Deliver at ``epoch_ms`` (a time not in the future: at once). Returns the message."""
        self.properties[PROPERTY_TIMER_DELIVER_MS] = str(int(epoch_ms))
        return self

    def set_delay_ms(self, delay_ms: int) -> Message:
        """Deliver ``delay_ms`` after the broker stores it. Returns the message."""
        self.properties[PROPERTY_TIMER_DELAY_MS] = str(int(delay_ms))
        return self

    def system_properties(self) -> dict[str, str]:
        """User properties plus TAGS and KEYS, as they are stored."""
        props = dict(self.properties)
        if self.tags:
            props[PROPERTY_TAGS] = self.tags
        if self.keys:
            props[PROPERTY_KEYS] = KEY_SEPARATOR.join(self.keys)
        return props


@dataclass(slots=True)
class MessageBatch:
    """Messages for one (topic, queue), columnar, as the store appends them.

    Columnar because the append path works per batch: shared fields are stored once, and the
    per-message columns are plain lists the encoder walks in one loop. ``properties`` holds each
    message's properties already encoded (see :func:`encode_properties`), as they arrive off the
    wire, so the store never re-encodes them.
    """

    topic: str
    queue_id: int
    bodies: list[bytes]
    properties: list[bytes]
    flag: int = 0
    sys_flag: int = 0
    born_timestamp_ms: int = 0
    born_host: tuple[str, int] = ("127.0.0.1", 0)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0

    def __len__(self) -> int:
        return len(self.bodies)

    @classmethod
    def of(
        cls,
        topic: str,
        queue_id: int,
        messages: Iterable[Message | bytes],
        **shared: object,
    ) -> MessageBatch:
        """Build a batch from Message objects or bare bodies (a convenience for tests and tools)."""
        bodies: list[bytes] = []
        props: list[bytes] = []
        for m in messages:
            if isinstance(m, Message):
                bodies.append(m.body)
                props.append(encode_properties(m.system_properties()))
            else:
                bodies.append(m)
                props.append(b"")
        return cls(topic, queue_id, bodies, props, **shared)  # type: ignore[arg-type]


def find_all(block: bytes, needle: bytes) -> np.ndarray:
    """Every offset of ``needle`` in ``block``, vectorised: candidates are the positions of the
    needle's first byte, narrowed one byte at a time. No Python work per occurrence, which is
    what searching the properties of a whole batch at once needs."""
    n = len(needle)
    if n == 0 or len(block) < n:
        return np.empty(0, dtype=np.int64)
    if len(block) < 2048:  # a few messages: bytes.find beats numpy's fixed cost
        hits: list[int] = []
        at = block.find(needle)
        while at >= 0:
            hits.append(at)
            at = block.find(needle, at + 1)
        return np.array(hits, dtype=np.int64)
    raw = np.frombuffer(block, dtype=np.uint8)
    cand = np.flatnonzero(raw[: len(raw) - n + 1] == needle[0])
    for k in range(1, n):
        if not len(cand):
            break
        cand = cand[raw[cand + k] == needle[k]]
    return cand.astype(np.int64, copy=False)

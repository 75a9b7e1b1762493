"""Receipt handles: the opaque strings a Pop consumer gets with each message and acks with.

A handle is 36 bytes, base64url (48 characters, no padding)::

    off size
      0    1  VERSION      1
      1    1  FLAGS        bit 0: the message was served from the pop retry topic
      2    8  CK_ID        u64, the checkpoint the message belongs to
     10    2  INDEX        u16, its position in the checkpoint
     12    2  QUEUE_ID     u16
     14    8  QUEUE_OFFSET i64
     22    6  DEADLINE_MS  u48, end of its invisible time
     28    8  MAC          HMAC-SHA256(secret, bytes 0..27 + group + 0x00 + topic)[:8]

The MAC is keyed by a random secret the broker keeps next to its store
(``config/pop.secret``), and covers the consumer group and the topic the consumer popped. So a
handle made up or changed by anyone, shown to another broker, or acked for another group or
topic, fails the MAC and is INVALID, while a handle that passes it was certainly issued here:
if its checkpoint is no longer open it is EXPIRED (acked, replaced or revived), never
"unknown". The broker's identity is the key itself (a store has one secret), which keeps the
handle small: a pop of 1024 messages carries its handles in the frame header, which is
limited to 64 KiB.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from orbitmq.common.errors import ConfigError, ReceiptHandleInvalidError
from orbitmq.common.files import write_atomically

HANDLE_VERSION = 1
FLAG_RETRY = 0x1
_PAYLOAD = struct.Struct(">BBQHHq6s")
_MAC_SIZE = 8
HANDLE_BYTES = _PAYLOAD.size + _MAC_SIZE  # 36
HANDLE_CHARS = HANDLE_BYTES * 4 // 3  # 48
_HANDLE_RE = re.compile(r"[A-Za-z0-9_-]+", re.ASCII)
SECRET_SIZE = 32


@dataclass(frozen=True, slots=True)
class ReceiptHandle:
    ck_id: int
    index: int
    queue_id: int
    offset: int
    deadline_ms: int
    retry: bool = False
    """Served from the pop retry topic rather than the popped topic itself."""


class HandleCodec:
    """Makes and checks handles with one broker's secret."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("the receipt handle secret must be at least 16 bytes")
        self._secret = secret

    def _mac(self, payload: bytes, group: str, topic: str) -> bytes:
        msg = payload + group.encode() + b"\x00" + topic.encode()
        return hmac.new(self._secret, msg, hashlib.sha256).digest()[:_MAC_SIZE]

    def encode(self, handle: ReceiptHandle, group: str, topic: str) -> str:
        """``topic`` is the topic the consumer popped (and will ack with)."""
        payload = _PAYLOAD.pack(
            HANDLE_VERSION,
            FLAG_RETRY if handle.retry else 0,
            handle.ck_id,
            handle.index,
            handle.queue_id,
            handle.offset,
            handle.deadline_ms.to_bytes(6, "big"),
        )
        raw = payload + self._mac(payload, group, topic)
        return base64.urlsafe_b64encode(raw).decode("ascii")

    def decode(self, text: object, group: str, topic: str) -> ReceiptHandle:
        """The handle, or ReceiptHandleInvalidError saying why it is not one of ours."""
        if not isinstance(text, str):
            raise ReceiptHandleInvalidError("receipt handle must be a string")
        if len(text) != HANDLE_CHARS:
            raise ReceiptHandleInvalidError(
                f"receipt handle is {len(text)} characters, not {HANDLE_CHARS}: malformed"
            )
        if not _HANDLE_RE.fullmatch(text):  # one spelling per handle: no "+", "/" or "="
            raise ReceiptHandleInvalidError("receipt handle is not base64url: malformed")
        try:
            raw = base64.urlsafe_b64decode(text)
        except (binascii.Error, ValueError):  # pragma: no cover - the pattern rules it out
            raise ReceiptHandleInvalidError("receipt handle is not base64url: malformed") from None
        payload, mac = raw[: _PAYLOAD.size], raw[_PAYLOAD.size :]
        version, flags, ck_id, index, queue_id, offset, deadline = _PAYLOAD.unpack(payload)
        if version != HANDLE_VERSION:
            raise ReceiptHandleInvalidError(f"receipt handle version {version} is unknown")
        if not hmac.compare_digest(self._mac(payload, group, topic), mac):
            raise ReceiptHandleInvalidError(
                f"receipt handle was not issued by this broker for group {group!r} and "
                f"topic {topic!r} (forged, damaged, or meant for another broker/group/topic)"
            )
        if flags & ~FLAG_RETRY or offset < 0:
            raise ReceiptHandleInvalidError("receipt handle has unknown flags")  # pragma: no cover
        return ReceiptHandle(
            ck_id, index, queue_id, offset, int.from_bytes(deadline, "big"), bool(flags & 1)
        )


def load_or_create_secret(path: Path) -> bytes:
    """The broker's secret: made once (random), then read at every start."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        pass
    else:
        if len(data) != SECRET_SIZE:
            # A new secret would silently void every open checkpoint: refuse instead.
            raise ConfigError(f"{path} is damaged ({len(data)} bytes, not {SECRET_SIZE})")
        return data
    secret = os.urandom(SECRET_SIZE)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, secret)
    os.chmod(path, 0o600)
    return secret

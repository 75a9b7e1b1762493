"""Receipt handles the proxy gives gRPC clients: which broker to ack at, and the broker's handle.

A RocketMQ 5 client only echoes the receipt handle it got (AckMessage, ChangeInvisibleDuration,
ForwardMessageToDeadLetterQueue) and sends it to the proxy, not to a broker. So the proxy's
handle must say where the message came from; it carries:

    o1:<CommitLog offset, hex>:<broker handle>:<broker name>

* ``o1`` — format version.
* the message's CommitLog offset on that broker: ForwardMessageToDeadLetterQueue copies the
  message to the DLQ with CONSUMER_SEND_MSG_BACK, which names a message by it.
* the broker's own Pop handle (48 base64url characters, docs/pop.md): the broker checks it
  (HMAC over group and topic), so the proxy needs no secret and keeps no state for plain
  receives; any proxy of a cluster can take the ack.
* the broker name last, so it may contain any character; the proxy resolves it to the master's
  address through the NameServer routes (brokers may move; names do not).

The proxy checks only the shape here (:class:`MalformedHandleError`); whether the handle is
current is the broker's answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from orbitmq.common.errors import ReceiptHandleInvalidError

__all__ = ["MAX_HANDLE_CHARS", "MalformedHandleError", "ProxyHandle", "decode", "encode"]

VERSION = "o1"
MAX_HANDLE_CHARS = 512
_HEX = re.compile(r"[0-9a-f]{1,16}")
_BROKER_HANDLE = re.compile(r"[A-Za-z0-9_-]{1,128}")


class MalformedHandleError(ReceiptHandleInvalidError):
    """The text is not a handle this proxy (or any proxy of the cluster) made."""


@dataclass(frozen=True, slots=True)
class ProxyHandle:
    broker_name: str
    physical_offset: int
    broker_handle: str

    def text(self) -> str:
        return encode(self.broker_name, self.physical_offset, self.broker_handle)


def encode(broker_name: str, physical_offset: int, broker_handle: str) -> str:
    return f"{VERSION}:{physical_offset:x}:{broker_handle}:{broker_name}"


def decode(text: object) -> ProxyHandle:
    """The parts of a handle; MalformedHandleError (RECEIPT_HANDLE_INVALID) saying why not."""
    if not isinstance(text, str) or not text:
        raise MalformedHandleError("the receipt handle is empty")
    if len(text) > MAX_HANDLE_CHARS:
        raise MalformedHandleError(f"the receipt handle is {len(text)} characters long")
    parts = text.split(":", 3)
    if len(parts) != 4 or parts[0] != VERSION:
        raise MalformedHandleError("not a receipt handle issued by this service")
    _, offset, handle, broker = parts
    if not _HEX.fullmatch(offset) or not _BROKER_HANDLE.fullmatch(handle) or not broker:
        raise MalformedHandleError("the receipt handle is damaged")
    return ProxyHandle(broker, int(offset, 16), handle)

"""What the broker fills in on a send before it appends: a unique message id (UNIQ_KEY) for
every message that came without one, and the sender's address recorded as BORN_HOST.

Producers set their ids, so the usual case is one substring search over the whole properties
block; numpy only for batches over 16 messages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from orbitmq.common.ids import default_generator
from orbitmq.common.message import find_all, property_value
from orbitmq.common.native import NATIVE
from orbitmq.protocol.messages import SendBody

if TYPE_CHECKING:
    from orbitmq.net.connection import Connection

__all__ = ["ensure_ids", "peer_host"]

_UNIQ = b"UNIQ_CLIENT_MESSAGE_ID_KEYIDX\x01"
_HAS_EACH: Callable[[list[bytes], bytes], bool] | None = getattr(NATIVE, "has_each", None)
"""``_native.has_each``: the usual case's check in one C call (an older build lacks it)."""


def ensure_ids(send: SendBody) -> list[str] | None:
    """Give every message without a unique id (UNIQ_KEY) one. Returns every message's id when
    any was assigned here, None when all arrived with their own (the usual case: producers set
    them), which is found with one substring search over all the properties at once."""
    block = send.properties_block
    starts = send.properties_starts
    n = len(send.properties)
    if n <= 16:  # up to 16 messages, each with its id: no arrays needed
        has_each = _HAS_EACH
        if has_each is not None:
            if has_each(send.properties, _UNIQ):
                return None
        elif all(property_value(p, _UNIQ) for p in send.properties):
            return None
    pos = find_all(block, _UNIQ)
    has = np.zeros(n, dtype=bool)
    if len(pos):
        rec = np.searchsorted(starts, pos, side="right") - 1
        ends = starts + send.properties_lengths
        safe = np.maximum(rec, 0)
        raw = np.frombuffer(block, dtype=np.uint8)
        named = (pos == starts[safe]) | (raw[np.maximum(pos - 1, 0)] == 2)
        ok = (rec >= 0) & (pos < ends[safe]) & named
        has[rec[ok]] = True
    if has.all():
        return None
    props = send.properties
    ids: list[str] = []
    fresh = iter(default_generator.next_ids(int((~has).sum())))
    for i, present in enumerate(has.tolist()):
        if present:
            value = property_value(props[i], _UNIQ)
            ids.append(value.decode("utf-8", "replace") if value is not None else "")
        else:
            new_id = next(fresh)
            props[i] = props[i] + _UNIQ + new_id.encode() + b"\x02"
            ids.append(new_id)
    return ids


def peer_host(conn: Connection | None) -> tuple[str, int]:
    """The sender's address, recorded as BORN_HOST (RocketMQ records the producer's socket)."""
    if conn is None:
        return ("0.0.0.0", 0)
    host, _, port = conn.peer.rpartition(":")
    return (host, int(port)) if port.isdigit() else ("0.0.0.0", 0)

"""The copies a COMMIT appends to the real topic, and the restart check that counts the ones a
crash left stored (docs/transactions.md, "Exactly-once commit"). The functions run on a reader
thread, through the store bridge; the half's record comes from the SystemLog."""

from __future__ import annotations

import dataclasses

from orbitmq.broker.transaction.half import STRIPPED_ON_COMMIT, TX_TYPE_MASK
from orbitmq.broker.transaction.state import Half
from orbitmq.common.errors import MessageIllegalError, ProtocolError
from orbitmq.common.message import SYSFLAG_TRANSACTION_COMMIT, MessageBatch, encode_properties
from orbitmq.common.record import StoredMessage, decode
from orbitmq.protocol.messages import decode_send_body
from orbitmq.store.message_store import GetStatus, MessageStore

SCAN_CHUNK = 1024


def copy_of(msg: StoredMessage, half: Half) -> MessageBatch:
    """The committed message(s): the half's body and properties, in its real topic and queue,
    normal messages (transaction type COMMIT, no TRAN_MSG), pointing back at the half. A half
    batch gives all its packed messages, each with its own properties as sent (validated at
    send, so no per-message work here)."""
    if half.batch_size:
        try:
            send = decode_send_body(msg.body)
        except ProtocolError as exc:  # validated at send: only a damaged record gets here
            raise MessageIllegalError(
                f"half batch {half.msg_id} at {half.phys} does not unpack: {exc}"
            ) from None
        bodies: list[bytes] = send.bodies  # type: ignore[assignment]  # views, appended as is
        properties = send.properties
    else:
        props = {k: v for k, v in msg.properties.items() if k not in STRIPPED_ON_COMMIT}
        bodies, properties = [msg.body], [encode_properties(props)]
    return MessageBatch(
        half.topic,
        half.queue_id,
        bodies,
        properties,
        flag=msg.flag,
        sys_flag=(msg.sys_flag & ~TX_TYPE_MASK) | SYSFLAG_TRANSACTION_COMMIT,
        born_timestamp_ms=msg.born_timestamp_ms,
        born_host=msg.born_host,
        reconsume_times=msg.reconsume_times,
        prepared_transaction_offset=half.phys,
    )


def copies_of(raw: bytes, half: Half) -> MessageBatch:
    """On a reader thread (a half batch is unpacked): the commit's copies of the half whose
    record is ``raw``."""
    return copy_of(decode(raw), half)


def tail(batch: MessageBatch, start: int) -> MessageBatch:
    return dataclasses.replace(
        batch, bodies=batch.bodies[start:], properties=batch.properties[start:]
    )


def count_copies(store: MessageStore, half: Half) -> int:
    """On a reader thread: how many of the commit's copies are in the real queue (from its
    floor on)? They were one append, so they are consecutive there, and a crash keeps a prefix
    of them: counting is enough to know which are missing."""
    store.wait_for_dispatch()
    want = max(1, half.batch_size)
    found = 0
    offset = half.commit_floor
    while offset < store.max_offset(half.topic, half.queue_id):
        res = store.get_messages(half.topic, half.queue_id, offset, SCAN_CHUNK, 16 * 1024 * 1024)
        if res.status is GetStatus.FOUND:
            for view in res.messages:
                if decode(view).prepared_transaction_offset == half.phys:
                    found += 1
                    if found == want:
                        return found
                elif found:
                    return found  # the run of copies ended
        if res.next_begin_offset <= offset:
            break
        offset = res.next_begin_offset
    return found

"""Child of the encrypted-store crash test: open an encrypted store, append in SYNC_FLUSH,
report each acknowledged batch, until SIGKILLed.

``python -m tests.crash.sealed_appender STORE KEYFILE RUN`` (repository root as working
directory). Lines on stdout, each one ``os.write`` (atomic on a pipe)::

    READY <writer epoch>
    ACK <seq> <queue> <first queue offset> <count>

Message i of batch seq of run r has the body ``r/seq/i|`` followed by filler, so the parent
regenerates and checks every acknowledged message byte for byte.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from orbitmq.common.message import Message, MessageBatch
from orbitmq.store.config import FlushDiskType
from orbitmq.store.message_store import MessageStore
from orbitmq.testing import small_store_config

TOPIC = "Sealed"
QUEUES = 2
SEGMENT_SIZE = 256 * 1024 + 64 * 1024


def config(store: Path, key_file: str) -> object:
    return small_store_config(
        store,
        mapped_file_size_commit_log=SEGMENT_SIZE,
        max_message_size=64 * 1024,
        consume_queue_entries_per_file=256,
        flush_disk_type=FlushDiskType.SYNC_FLUSH,
        flush_interval_consume_queue_ms=100,
        encrypt_at_rest=True,
        encryption_key_file=key_file,
    )


def body(run: int, seq: int, i: int) -> bytes:
    return f"{run}/{seq}/{i}|".encode() + bytes([65 + (seq + i) % 26]) * (50 + (seq * 7 + i) % 900)


def batch(run: int, seq: int) -> MessageBatch:
    n = 1 + seq % 5
    msgs = [Message(TOPIC, body(run, seq, i), tags=f"t{i % 2}") for i in range(n)]
    return MessageBatch.of(TOPIC, seq % QUEUES, msgs)


def main() -> None:
    store_path, key_file, run = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    store = MessageStore(config(store_path, key_file))  # type: ignore[arg-type]
    store.open()
    assert store.sealer is not None
    os.write(1, f"READY {store.sealer.epoch.value}\n".encode())
    seq = 0
    while True:
        res = store.put(batch(run, seq))
        os.write(1, f"ACK {seq} {res.queue_id} {res.first_queue_offset} {res.count}\n".encode())
        seq += 1


if __name__ == "__main__":
    main()

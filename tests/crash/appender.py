"""The child program of the crash tests: open a store, append from several threads, report.

Run as ``python -m tests.crash.appender --store DIR --mode sync|async --seed N --round R``
with the repository root as the working directory, or as ``... --standby`` and then the same
arguments as a JSON list on stdin. It never exits on its own: the parent SIGKILLs it. Lines on stdout, each written with one ``os.write`` (atomic on a pipe below
PIPE_BUF, so a kill never leaves half a line)::

    OPENING                                     about to call MessageStore.open()
    READY <json RecoveryReport summary>         open() returned; appending starts
    ACK <thread> <seq> <topic> <queue> <first queue offset> <count> <end offset>
    CLOSING / CLOSED                            with --close-after: around MessageStore.close()
    ERROR <text>                                something failed; the child exits 1

An ACK is written only after ``put()`` returned, i.e. after the store acknowledged the batch
(in SYNC_FLUSH: after its fsync). The batch itself is not sent: the parent regenerates it from
(seed, round, thread, seq) with :func:`batch_spec`, and every body starts with its identity
``round/thread/seq/index|``, so any record found in the store can be checked byte for byte.

This module is also imported by the tests for :func:`batch_spec`, :func:`crash_config` and
:func:`parse_ident`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from orbitmq.common.message import Message, MessageBatch
from orbitmq.store.config import FlushDiskType, StoreConfig
from orbitmq.store.message_store import MessageStore
from orbitmq.store.recovery import RecoveryReport
from orbitmq.testing import small_store_config

KiB = 1024
SEGMENT_SIZE = 1024 * KiB + 64 * KiB
MAX_MESSAGE_SIZE = 64 * KiB
TOPICS = ("CrashA", "CrashB", "Crash_C")
QUEUES = 3
TAGS = (None, "TagA", "TagB", "Tag-é")


def crash_config(path: Path, mode: str, checkpoint_ms: int = 100) -> StoreConfig:
    """Small files so CommitLog, ConsumeQueue and IndexFile roll often."""
    return small_store_config(
        path,
        mapped_file_size_commit_log=SEGMENT_SIZE,
        max_message_size=MAX_MESSAGE_SIZE,
        consume_queue_entries_per_file=128,
        max_hash_slot_num=512,
        max_index_num=2048,
        flush_disk_type=FlushDiskType.SYNC_FLUSH if mode == "sync" else FlushDiskType.ASYNC_FLUSH,
        flush_interval_commit_log_ms=20,
        flush_interval_consume_queue_ms=checkpoint_ms,
        clean_resource_interval_ms=3_600_000,
    )


def no_disk_pressure() -> float:
    """Disk usage as retention sees it: a full CI disk must not turn into refused appends."""
    return 10.0


@dataclass(frozen=True, slots=True)
class BatchSpec:
    topic: str
    queue_id: int
    messages: list[Message]


def _body_size(rng: random.Random) -> int:
    roll = rng.random()
    if roll < 0.75:
        return rng.randint(1, 400)
    if roll < 0.93:
        return rng.randint(400, 12 * KiB)  # many of these cross 4 KiB pages
    return rng.randint(12 * KiB, MAX_MESSAGE_SIZE)


def batch_spec(seed: int, round_no: int, thread: int, seq: int) -> BatchSpec:
    """The batch a writer sends as its ``seq``-th: the same in every process."""
    rng = random.Random(f"orbitmq-crash/{seed}/{round_no}/{thread}/{seq}")
    topic = rng.choice(TOPICS)
    queue_id = rng.randrange(QUEUES)
    count = rng.randint(1, 64) if rng.random() < 0.5 else rng.randint(1, 8)
    messages = []
    for i in range(count):
        ident = f"{round_no}/{thread}/{seq}/{i}|".encode()
        size = _body_size(rng)
        body = ident + rng.randbytes(max(0, size - len(ident)))
        keys = [f"k{round_no}.{thread}.{seq}.{i}"]
        if rng.random() < 0.2:
            keys.append("hot")
        props = {"u": str(rng.randrange(1000))} if rng.random() < 0.3 else {}
        messages.append(Message(topic, body, tags=rng.choice(TAGS), keys=keys, properties=props))
    return BatchSpec(topic, queue_id, messages)


def parse_ident(body: bytes) -> tuple[int, int, int, int]:
    """(round, thread, seq, index) from a body written by :func:`batch_spec`."""
    head = body.split(b"|", 1)[0]
    r, t, s, i = head.split(b"/")
    return int(r), int(t), int(s), int(i)


def report_summary(report: RecoveryReport) -> dict[str, object]:
    return {
        "clean": report.clean,
        "scanned_from": report.scanned_from,
        "end_offset": report.end_offset,
        "records_scanned": report.records_scanned,
        "redispatched": report.redispatched,
        "cq_dropped": report.consume_queue_entries_dropped,
        "index_dropped": report.index_entries_dropped,
        "n_cuts": len(report.cuts),
        "bytes_cut": report.bytes_cut,
        # Only the first few, so a READY line stays below PIPE_BUF.
        "cuts": [[c.file, c.offset, c.length, c.reason[:80]] for c in report.cuts[:8]],
        "problems": [p[:120] for p in report.problems[:8]],
        "duration_s": round(report.duration_s, 4),
    }


_out_lock = threading.Lock()


def emit(line: str) -> None:
    data = (line + "\n").encode()
    assert len(data) < 4096, "a line must stay below PIPE_BUF to be written atomically"
    with _out_lock:
        os.write(1, data)


def _writer(
    store: MessageStore, seed: int, round_no: int, thread: int, stop: threading.Event
) -> None:
    try:
        seq = 0
        while not stop.is_set():
            spec = batch_spec(seed, round_no, thread, seq)
            result = store.put(MessageBatch.of(spec.topic, spec.queue_id, spec.messages))
            emit(
                f"ACK {thread} {seq} {spec.topic} {spec.queue_id} "
                f"{result.first_queue_offset} {result.count} {result.end_offset}"
            )
            seq += 1
    except BaseException as exc:  # noqa: BLE001 - any failure is reported to the parent
        emit(f"ERROR thread {thread}: {type(exc).__name__}: {exc}"[:4000])
        os._exit(1)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--standby"]:
        # Started ahead of time, imports done: wait for the arguments as one JSON line, so
        # the parent can check a store while the next child is already warm.
        line = sys.stdin.readline()
        if not line:
            return
        argv = [str(a) for a in json.loads(line)]
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--mode", choices=("sync", "async"), required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--round", type=int, required=True)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--checkpoint-ms", type=int, default=100)
    parser.add_argument("--no-append", action="store_true", help="open, report, then idle")
    parser.add_argument(
        "--close-after", type=float, default=None, help="stop writing and close() after this long"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    store = MessageStore(
        crash_config(args.store, args.mode, args.checkpoint_ms), disk_usage=no_disk_pressure
    )
    emit("OPENING")
    try:
        report = store.open()
    except BaseException as exc:  # noqa: BLE001 - any failure is reported to the parent
        emit(f"ERROR open: {type(exc).__name__}: {exc}"[:4000])
        os._exit(1)
    emit("READY " + json.dumps(report_summary(report)))
    stop = threading.Event()
    writers = [
        threading.Thread(
            target=_writer, args=(store, args.seed, args.round, thread, stop), daemon=True
        )
        for thread in range(0 if args.no_append else args.threads)
    ]
    for w in writers:
        w.start()
    if args.close_after is not None:
        time.sleep(args.close_after)
        stop.set()
        for w in writers:
            w.join()
        emit("CLOSING")
        store.close()
        emit("CLOSED")
    while True:  # wait for SIGKILL
        time.sleep(3600)


if __name__ == "__main__":
    main()

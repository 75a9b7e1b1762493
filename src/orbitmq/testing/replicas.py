"""What the replicas of a broker group hold, read from their stores once the processes are
stopped: the second half of a fault test, beside :mod:`orbitmq.testing.checker`.

- :func:`read_store` drains every queue of some topics from one store, as the checker's
  ``Delivered`` list: run :func:`orbitmq.testing.checker.check` against *each* replica to prove
  every acknowledged message is on every copy, not only on the one a client reads.
- :func:`compare_replicas` says where the CommitLogs of two or more stores differ (CRC32 per
  MiB, below the smallest max offset: a slave may lag by the last unacknowledged bytes, never
  differ).

Each store is opened (recovery runs, as at a broker restart) and closed again; never call these
on a store a running broker holds.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from orbitmq.protocol.messages import decode_records
from orbitmq.store.config import StoreConfig
from orbitmq.store.message_store import MessageStore
from orbitmq.testing.checker import Delivered, ReadBack, identify

__all__ = ["compare_replicas", "opened", "read_store"]

MiB = 1024 * 1024


@contextlib.contextmanager
def opened(path: Path, **store: Any) -> Iterator[MessageStore]:
    """The store at ``path`` (``store``: its StoreConfig sizes), opened for the block, its
    whole log readable: a replica keeps its confirm offset across restarts and serves nothing
    above it (store/confirm.py), but a check asks what the copy *holds* (what a new master
    would confirm), so the kept confirm offset is lifted here, and forgotten at close."""
    ms = MessageStore(StoreConfig(store_path=path, **store))
    ms.open()
    ms.set_confirm_offset(None)
    try:
        yield ms
    finally:
        ms.close()


def read_store(store: MessageStore, topics: Iterable[str], broker_name: str) -> ReadBack:
    """Every message of ``topics`` the store's ConsumeQueues reach, with its identity."""
    out = ReadBack()
    store.wait_for_dispatch()
    for topic in topics:
        for qid in store.queue_ids(topic):
            offset, hi = store.min_offset(topic, qid), store.max_offset(topic, qid)
            while offset < hi:
                got = store.get_messages(topic, qid, offset, 512, 16 * MiB)
                records = decode_records(b"".join(bytes(p) for p in got.body_parts))
                if not records:
                    out.gaps.append(f"{broker_name} {topic}/{qid}: nothing at {offset} < {hi}")
                    break
                for m in records:
                    ident = identify(m)
                    if ident is None:
                        out.foreign += 1
                        continue
                    out.delivered.append(
                        Delivered(ident[0], ident[1], topic, broker_name, qid, m.queue_offset,
                                  m.msg_id or "")
                    )  # fmt: skip
                offset = max(got.next_begin_offset, records[-1].queue_offset + 1)
    return out


def _read(store: MessageStore, lo: int, hi: int) -> bytes:
    out = bytearray()
    pos = lo
    while pos < hi:
        loc = store.commit_log.view_at(pos)
        if loc is None:
            raise ValueError(f"CommitLog offset {pos} is not readable")
        view, at, size = loc
        n = min(size - at, hi - pos)
        out += view[at : at + n]
        pos += n
    return bytes(out)


def compare_replicas(stores: Mapping[str, MessageStore]) -> list[str]:
    """Where the CommitLogs differ below the smallest max offset (empty: byte-identical there),
    one line per differing MiB; the offsets of each, for the report, come first."""
    ends = {name: (s.commit_log.min_offset, s.commit_log.max_offset) for name, s in stores.items()}
    if len(stores) < 2:
        return []
    lo = max(a for a, _b in ends.values())
    hi = min(b for _a, b in ends.values())
    problems: list[str] = []
    pos = lo
    while pos < hi:
        upto = min(pos - pos % MiB + MiB, hi)
        chunks = {name: zlib.crc32(_read(s, pos, upto)) for name, s in stores.items()}
        if len(set(chunks.values())) > 1:
            problems.append(f"CommitLog differs in [{pos}, {upto}): crc32 {chunks}")
        pos = upto
    return problems

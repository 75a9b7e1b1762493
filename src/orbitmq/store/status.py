"""What a store answers beside reads and writes: the degraded parts with their causes, its
counters (runtime info and metrics read them) and the key lookup. Kept apart from MessageStore
so that class stays about reading and writing; it takes the parts, never the store class (no
import cycle)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from orbitmq.common.errors import TierUnavailableError
from orbitmq.common.record import StoredMessage
from orbitmq.store.supervise import ServiceHealth

if TYPE_CHECKING:
    from orbitmq.store.tier.service import TierService


def degraded(
    services: list[ServiceHealth], dispatcher: Any, retention: Any, commit_log: Any
) -> dict[str, str]:
    """Parts: the background services (dispatcher, flusher, checkpoint, retention), the index
    (keys not indexed while it cannot be written), the disk (writes refused above
    ``disk_space_warning_level_ratio``) and the CommitLog (fenced after a failed fsync: reopen
    the store to recover)."""
    out: dict[str, str] = {}
    for h in services:
        if h.degraded is not None:
            out[h.name] = h.degraded
    if dispatcher.index_failure is not None:
        out["index"] = f"{dispatcher.index_skipped} keys not indexed: " + dispatcher.index_failure
    if retention.disk_full:
        out["disk"] = f"{retention.disk_ratio:.0f}% used: writes refused"
    if commit_log.fenced:
        out["commitlog"] = f"fenced: {commit_log.fenced}"
    return out


def store_stats(store: Any) -> dict[str, int]:
    """The store's counters (``store`` is a MessageStore)."""
    log, dispatcher = store.commit_log, store.dispatcher
    tier = store.tier.stats() if getattr(store, "tier", None) is not None else {}
    return tier | {
        "commit_log_min_offset": log.min_offset,
        "commit_log_max_offset": log.max_offset,
        "commit_log_flushed_offset": log.flushed_offset,
        "dispatch_offset": dispatcher.reput_offset,
        "dispatch_lag_bytes": log.max_offset - dispatcher.reput_offset,
        "queues": len(store.queues.queues),
        "fsyncs": store.flusher.fsync_count,
        "index_skipped": dispatcher.index_skipped,
        "read_errors": store.read_errors,
        "service_failures": sum(h.failures for h in store.services()),
        "disk_used_bytes": store.retention.disk_used_bytes,  # cached by the retention run
    }


def messages_by_key(
    index: Any,
    get_message: Callable[[int], StoredMessage | None],
    topic: str,
    key: str,
    max_num: int,
    begin_ms: int,
    end_ms: int,
    tier: TierService | None = None,
) -> list[StoredMessage]:
    """Messages of ``topic`` whose KEYS contain ``key`` or whose unique id is ``key``: the
    IndexFile's candidates (hash collisions included) checked against the records, then, while
    fewer than ``max_num``, the tier's key indexes (data whose local index is gone)."""
    found: list[StoredMessage] = []
    if index is not None:
        found = _local_by_key(index, get_message, topic, key, max_num, begin_ms, end_ms)
    if tier is None or len(found) >= max_num:
        return found
    seen = {m.physical_offset for m in found}
    try:
        return found + tier.by_key(topic, key, max_num - len(found), begin_ms, end_ms, seen)
    except TierUnavailableError:
        if found:
            return found  # what the disk holds now; the tier's part when it is back
        raise


def _local_by_key(
    index: Any,
    get_message: Callable[[int], StoredMessage | None],
    topic: str,
    key: str,
    max_num: int,
    begin_ms: int,
    end_ms: int,
) -> list[StoredMessage]:
    found: list[StoredMessage] = []
    for phy in index.query(topic, key, max_num * 2, begin_ms, end_ms):
        msg = get_message(phy)
        if msg is None or msg.topic != topic:
            continue
        if key in msg.keys or msg.msg_id == key:
            found.append(msg)
            if len(found) >= max_num:
                break
    return found

"""Records of the metadata log (system topic :data:`METADATA_TOPIC`, queue 0): the codec.

Why a log and not RocketMQ's periodic pull (``SlaveSynchronize``, every 10 s): a change that is
a record in the CommitLog replicates with the data, in the data's order, under the same ack
rule and the same truncation, so a replica holding CommitLog offset X holds every metadata
change logged before X, and a topic created a moment before a master dies is not lost.

One CommitLog message per :class:`Envelope`: who wrote it (broker id, master epoch) and an
ordered list of changes. A change is the new state of one thing, never a delta of it
(upsert or delete a topic or a group, a group's offsets for some queues, a whole small file),
so applying a record twice, or an old one again during a replay, converges to the same state.
JSON (msgspec, a tagged union on ``k``), so an operator can read a record with any tool.
:func:`decode_envelope` raises :class:`MetadataRecordError` on anything malformed (the applier
skips and counts it; it never stops the dispatch of what follows).

A snapshot is ``SnapshotBegin(id)``, the writer's whole state as ordinary put changes (over as
many envelopes as it takes), ``SnapshotEnd(id)``: a replica that saw the begin deletes, at the
end, every topic, group and offset group the snapshot did not name (a master writes one when
it takes office, and every ``metadata_snapshot_interval_s``: see journal.py).
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from orbitmq.protocol.bodies import TopicConfig
from orbitmq.protocol.group_config import SubscriptionGroupConfig

METADATA_TOPIC = "rmq_sys_METADATA_LOG"
"""RocketMQ's lower-case ``rmq_sys_`` naming, as the revive log and the timer topic."""
FORMAT_VERSION = 1
MAX_ENVELOPE_BYTES = 256 * 1024
"""An envelope is cut before it passes this (far below any max_message_size)."""
REPLICATED_FILES = frozenset(
    {"pop.secret", "pop_revive.json", "timer_checkpoint.json", "transaction.json"}
)
"""The service files of ``<store>/config`` a master logs when it writes them (FilePut): the
only names a replica writes, so a record can never name another path."""
TAG = "metadata"


class MetadataRecordError(ValueError):
    """A metadata record that cannot be decoded or applied (skipped and counted)."""


class TopicPut(msgspec.Struct, tag="topic_put", tag_field="k", kw_only=True):
    config: TopicConfig


class TopicDel(msgspec.Struct, tag="topic_del", tag_field="k", kw_only=True):
    """The topic, its queues on this broker and every group's offsets in it are gone."""

    topic: str


class GroupPut(msgspec.Struct, tag="group_put", tag_field="k", kw_only=True):
    config: SubscriptionGroupConfig


class GroupDel(msgspec.Struct, tag="group_del", tag_field="k", kw_only=True):
    group: str


class Offsets(msgspec.Struct, tag="offsets", tag_field="k", kw_only=True):
    """A group's offsets for some queues, ``(topic, queue_id, offset)``; ``replace``: the group's
    table is exactly these (and the following Offsets of the same group in the snapshot)."""

    group: str
    entries: list[tuple[str, int, int]]
    replace: bool = False


class OffsetsDelGroup(msgspec.Struct, tag="offsets_del_group", tag_field="k", kw_only=True):
    group: str


class FilePut(msgspec.Struct, tag="file_put", tag_field="k", kw_only=True):
    """A service file of ``<store>/config`` (one of :data:`REPLICATED_FILES`), whole."""

    name: str
    data: bytes


class SnapshotBegin(msgspec.Struct, tag="snapshot_begin", tag_field="k", kw_only=True):
    snapshot_id: int


class SnapshotEnd(msgspec.Struct, tag="snapshot_end", tag_field="k", kw_only=True):
    snapshot_id: int


Change = (
    TopicPut
    | TopicDel
    | GroupPut
    | GroupDel
    | Offsets
    | OffsetsDelGroup
    | FilePut
    | SnapshotBegin
    | SnapshotEnd
)


class Envelope(msgspec.Struct, kw_only=True):
    v: int
    writer: int
    """The broker id of the master that logged it (it applied the changes before logging)."""
    epoch: int
    """That master's epoch when it logged it."""
    changes: list[Change]


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Envelope)


def encode_envelopes(
    writer: int, epoch: int, changes: list[Change], max_bytes: int = MAX_ENVELOPE_BYTES
) -> list[bytes]:
    """The changes, in order, as few envelopes as fit ``max_bytes`` each (a single change
    larger than that gets an envelope of its own: offsets are cut by the caller)."""
    out: list[bytes] = []
    batch: list[Change] = []
    size = 0
    for change in changes:
        n = len(_encoder.encode(change)) + 1
        if batch and size + n > max_bytes:
            out.append(_encoder.encode(Envelope(v=FORMAT_VERSION, writer=writer, epoch=epoch,
                                                changes=batch)))  # fmt: skip
            batch, size = [], 0
        batch.append(change)
        size += n
    if batch:
        out.append(_encoder.encode(Envelope(v=FORMAT_VERSION, writer=writer, epoch=epoch,
                                            changes=batch)))  # fmt: skip
    return out


def decode_envelope(body: bytes | memoryview) -> Envelope:
    """The envelope in a record body; MetadataRecordError if it is not one this version reads."""
    try:
        env = _decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise MetadataRecordError(f"not a metadata record: {exc}") from exc
    if env.v != FORMAT_VERSION:
        raise MetadataRecordError(f"metadata record version {env.v} is unknown")
    return env


def offset_changes(
    offsets: dict[str, dict[str, dict[int, int]]], chunk: int = 2000, replace: bool = False
) -> list[Change]:
    """A table ``group -> topic -> queue -> offset`` as Offsets changes of at most ``chunk``
    entries (``replace`` on each group's first one)."""
    out: list[Change] = []
    for group in sorted(offsets):
        entries = [
            (topic, q, o)
            for topic, queues in sorted(offsets[group].items())
            for q, o in sorted(queues.items())
        ]
        first = True
        for i in range(0, max(1, len(entries)), chunk):
            out.append(Offsets(group=group, entries=entries[i : i + chunk],
                               replace=replace and first))  # fmt: skip
            first = False
    return out


class Journal(Protocol):
    """What the managers call after a change they made (and saved): log it if this broker is
    a master (the journal decides; a slave's or a single broker's journal drops it)."""

    active: bool
    """Logging (this broker is a master that took office)."""

    def record(self, change: Change) -> None:
        """Log ``change`` soon (the writer is woken)."""
        ...

    def record_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Log a consumer offset within ``metadata_offset_log_interval_ms`` (coalesced)."""
        ...

    async def sync(self) -> None:
        """Return once everything recorded before this call is logged and replicated as the
        replication mode asks (raises what the append or the replication wait raised)."""
        ...

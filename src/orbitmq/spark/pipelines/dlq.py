"""The dead-letter reprocessing job (:func:`dlq_reprocess`): a consumer group's dead-letter
queue read in batch, the bodies fixed by a Spark expression, each message sent back to the
topic it was first sent to (with :data:`PROPERTY_REPROCESSED_FROM` naming the dead letter)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from orbitmq.common.errors import ClientError, ConfigError
from orbitmq.common.message import (
    DELIVERY_PROPERTIES,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
)
from orbitmq.protocol.consumer import (
    DLQ_GROUP_TOPIC_PREFIX,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_POP_CK,
    PROPERTY_RETRY_TOPIC,
)
from orbitmq.protocol.group_config import (
    PROPERTY_DLQ_ORIGIN_MESSAGE_ID,
    PROPERTY_DLQ_ORIGIN_TOPIC,
    PROPERTY_DLQ_REASON,
)
from orbitmq.spark.pipelines.running import FORMAT, read_batch

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = [
    "PROPERTY_REPROCESSED_FROM",
    "DlqResult",
    "dlq_frame",
    "dlq_reprocess",
    "dlq_topic",
    "ensure_dlq_readable",
]


PROPERTY_REPROCESSED_FROM = "REPROCESSED_FROM"
"""On a message :func:`dlq_reprocess` sent back: the id of the dead-lettered message (the
sink gives the resent message a new id; this keeps the trail)."""

_BOOKKEEPING = tuple(
    sorted(
        DELIVERY_PROPERTIES
        | {
            PROPERTY_TAGS,
            PROPERTY_KEYS,
            PROPERTY_RETRY_TOPIC,
            PROPERTY_ORIGIN_MESSAGE_ID,
            PROPERTY_DLQ_ORIGIN_TOPIC,
            PROPERTY_DLQ_ORIGIN_MESSAGE_ID,
            PROPERTY_DLQ_REASON,
            PROPERTY_POP_CK,
            PROPERTY_UNIQ_KEY,
            PROPERTY_REPROCESSED_FROM,
            "TRAN_BATCH",
        }
    )
)
"""Properties that described a delivery (retries, the DLQ, timers, transactions), travel in
their own columns (tags, keys) or that the sink sets itself (the message id): not sent back."""


def dlq_topic(group: str) -> str:
    return f"{DLQ_GROUP_TOPIC_PREFIX}{group}"


async def _grant_read(namesrv: str, topic: str, wait_s: float) -> bool:
    """Add read permission to ``topic`` on every broker holding it; wait until the
    NameServers route reads to it. False if the topic does not exist (no dead letter yet)."""
    from orbitmq.client import AsyncAdminClient
    from orbitmq.client.route import TopicRouteNotFoundError
    from orbitmq.protocol.bodies import PERM_READ, TopicConfig

    async with AsyncAdminClient(namesrv) as admin:
        try:
            if await admin.queues(topic):
                return True
        except TopicRouteNotFoundError:
            return False
        route = await admin.topic_route(topic)
        for bd in route.broker_datas:
            addr = bd.master_addr()
            if addr is None:
                continue
            for cfg in await admin.topic_configs(addr):
                if cfg.topic_name == topic and not cfg.perm & PERM_READ:
                    fields = {f: getattr(cfg, f) for f in cfg.__struct_fields__}
                    fields["perm"] = cfg.perm | PERM_READ
                    await admin.update_topic(TopicConfig(**fields), broker_addr=addr)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if await admin.queues(topic):
                return True
            await _sleep(0.2)
        raise ClientError(
            f"read permission on {topic} was granted but the NameServers still route no reads "
            f"to it after {wait_s:.0f}s; retry in a moment"
        )


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)


def ensure_dlq_readable(namesrv: str, group: str, *, wait_s: float = 40.0) -> bool:
    """Make ``%DLQ%<group>`` readable by the connector (a DLQ is created write-only, so that
    consumers cannot drain it by mistake; Spark reads by pulling). This is the change
    ``orbitmq topic update -t %DLQ%<group> --perm RW`` makes. False: the group has no DLQ."""
    from orbitmq.net.loop import run

    return run(_grant_read(namesrv, dlq_topic(group), wait_s))


async def _queue_ends(namesrv: str, topic: str) -> dict[str, int]:
    from orbitmq.client import AsyncAdminClient

    async with AsyncAdminClient(namesrv) as admin:
        return {
            f"{q.broker_name}/{q.queue_id}": await admin.max_offset(q)
            for q in await admin.queues(topic)
        }


def _dlq_has_new(namesrv: str, group: str, start: Mapping[str, int]) -> bool:
    """Whether the DLQ holds anything at or after ``start`` (queues it leaves out: from 0)."""
    from orbitmq.net.loop import run

    ends = run(_queue_ends(namesrv, dlq_topic(group)))
    return any(end > max(0, start.get(key, 0)) for key, end in ends.items())


def dlq_frame(
    spark: SparkSession,
    *,
    namesrv: str,
    group: str,
    starting_offsets: str = "earliest",
) -> DataFrame:
    """The group's dead letters in batch, with what reprocessing needs next to the source
    columns: ``origin_topic`` (where it was first sent), ``origin_msg_id``, ``reason`` and
    ``body`` (the value as UTF-8 text)."""
    from pyspark.sql import functions as F

    props = F.col("properties")
    frame = read_batch(spark, namesrv, dlq_topic(group), starting_offsets=starting_offsets)
    return frame.select(
        "*",
        F.coalesce(props[PROPERTY_DLQ_ORIGIN_TOPIC], props[PROPERTY_RETRY_TOPIC]).alias(
            "origin_topic"
        ),
        F.coalesce(
            props[PROPERTY_DLQ_ORIGIN_MESSAGE_ID],
            props[PROPERTY_ORIGIN_MESSAGE_ID],
            F.col("msg_id"),
        ).alias("origin_msg_id"),
        props[PROPERTY_DLQ_REASON].alias("reason"),
        F.col("value").cast("string").alias("body"),
    )


def _start_offsets(starting_offsets: str) -> dict[str, dict[str, int]]:
    """The offsets JSON a run started from (empty for ``earliest``), to carry queues that had
    nothing new into the next run's offsets."""
    text = starting_offsets.strip()
    if text.lower() in ("earliest", "latest", ""):
        return {}
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"starting offsets: not earliest or JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ConfigError("starting offsets: JSON must be an object of topics")
    return {str(t): {str(q): int(o) for q, o in dict(qs).items()} for t, qs in doc.items()}


@dataclass(frozen=True, slots=True)
class DlqResult:
    """What :func:`dlq_reprocess` did."""

    read: int
    """Dead letters read (copies, before the filter and the one-per-id rule)."""
    resent: dict[str, int] = field(default_factory=dict)
    """Messages sent back per original topic (would be sent, on a dry run)."""
    skipped_no_origin: int = 0
    """Copies that name no original topic (nowhere to send them)."""
    next_offsets: str = ""
    """``startingOffsets`` JSON for the next run, to reprocess only newer dead letters."""

    @property
    def total(self) -> int:
        return sum(self.resent.values())


def dlq_reprocess(
    spark: SparkSession,
    *,
    namesrv: str,
    group: str,
    fix: Callable[[Column], Column] | str | None = None,
    where: Column | str | None = None,
    starting_offsets: str = "earliest",
    dry_run: bool = False,
    grant_read: bool = True,
    sink_options: Mapping[str, str] | None = None,
) -> DlqResult:
    """Send the group's dead letters back to their original topics, fixed.

    ``fix`` makes the new body from the old one: a function of the ``body`` column (text), or
    a Spark SQL expression over ``body`` such as ``"replace(body, 'amout', 'amount')"``; None
    sends the body unchanged (binary bodies stay byte for byte). ``where`` (a Column or SQL
    condition over the :func:`dlq_frame` columns) chooses which dead letters to resend. Each
    message id is sent once per run even if it was dead-lettered twice. Tags, keys and user
    properties travel with the message; retry and DLQ bookkeeping does not.

    A batch write is at-least-once, and the DLQ keeps its copies: run again with
    ``starting_offsets=result.next_offsets`` to reprocess only what arrived since.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    if grant_read and not ensure_dlq_readable(namesrv, group):
        return DlqResult(read=0)
    start = _start_offsets(starting_offsets).get(dlq_topic(group))
    if start is not None and not _dlq_has_new(namesrv, group, start):
        return DlqResult(read=0, next_offsets=starting_offsets)  # no Spark job for nothing
    frame = dlq_frame(spark, namesrv=namesrv, group=group, starting_offsets=starting_offsets)
    # One read of the DLQ for the counts, the offsets and the write: pinned in memory (or on
    # disk), so dead letters arriving meanwhile cannot make the numbers disagree.
    frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        read = frame.count()
        ends = frame.groupBy("broker", "queue_id").agg(F.max("queue_offset").alias("last"))
        offsets = _start_offsets(starting_offsets)
        per_queue = offsets.setdefault(dlq_topic(group), {})
        for row in ends.collect():
            per_queue[f"{row['broker']}/{row['queue_id']}"] = int(row["last"]) + 1
        chosen = frame
        if where is not None:
            chosen = chosen.where(F.expr(where) if isinstance(where, str) else where)
        no_origin = chosen.where(F.col("origin_topic").isNull()).count()
        chosen = chosen.where(F.col("origin_topic").isNotNull()).dropDuplicates(["origin_msg_id"])
        if fix is None:
            value = F.col("value")
        else:
            fixed = F.expr(fix) if isinstance(fix, str) else fix(F.col("body"))
            value = fixed.cast("string").cast("binary")
        from orbitmq.spark import commit

        sink_marks = (
            commit.PROPERTY_QUERY,
            commit.PROPERTY_BATCH,
            commit.PROPERTY_ATTEMPT,
            commit.PROPERTY_MARKER_TOPIC,
        )
        dropped = (*_BOOKKEEPING, *sink_marks)
        bookkeeping = F.array(*[F.lit(p) for p in dropped])
        kept = F.map_filter("properties", lambda k, _v: ~F.array_contains(bookkeeping, k))
        trail = F.create_map(F.lit(PROPERTY_REPROCESSED_FROM), F.col("origin_msg_id"))
        out = chosen.select(
            value.alias("value"),
            F.col("origin_topic").alias("topic"),
            F.col("key"),
            F.col("tags"),
            F.map_concat(kept, trail).alias("properties"),
        )
        counts = {r["topic"]: int(r["count"]) for r in out.groupBy("topic").count().collect()}
        if not dry_run and counts:
            writer = out.write.format(FORMAT).mode("append").option("namesrv", namesrv)
            for key, val in (sink_options or {}).items():
                writer = writer.option(key, val)
            writer.save()
        return DlqResult(
            read=read,
            resent=dict(sorted(counts.items())),
            skipped_no_origin=no_origin,
            next_offsets=json.dumps(offsets, sort_keys=True) if per_queue else starting_offsets,
        )
    finally:
        frame.unpersist()

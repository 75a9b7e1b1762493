"""Scrape-time gauges of the RocketMQ 5 family for transactions, timers, Pop revive and the
store's backlogs (the counters are :class:`~orbitmq.broker.rocketmq_metrics.RocketMQMetrics`').

Names and labels follow RocketMQ 5 (``BrokerMetricsConstant``, ``PopMetricsConstant``,
``DefaultStoreMetricsConstant``); gauges in milliseconds get the ``_milliseconds`` unit suffix
RocketMQ's Prometheus exporter appends, as the consumer-latency gauges here do:

- ``rocketmq_half_messages{topic}``: half (prepared) messages not yet committed or rolled back;
- ``rocketmq_timer_enqueue_lag`` / ``_latency_milliseconds``: timer-topic entries stored but not
  yet loaded into the timer index, and how long the oldest of them has waited;
- ``rocketmq_timer_dequeue_lag`` / ``_latency_milliseconds``: timers due and not yet delivered,
  and how far behind its due time the oldest of them is;
- ``rocketmq_pop_revive_lag{queue_id}`` / ``rocketmq_pop_revive_latency_milliseconds``: Pop
  checkpoints past their deadline and not yet revived, and the oldest one's delay;
- ``rocketmq_pop_offset_buffer_size`` (messages popped and not yet acked or revived) and
  ``rocketmq_pop_checkpoint_buffer_size`` (open checkpoints);
- ``rocketmq_storage_flush_behind_bytes`` / ``rocketmq_storage_dispatch_behind_bytes``;
- ``rocketmq_storage_message_reserve_time_milliseconds{storage_type="local",
  storage_medium="disk"}``: age of the oldest message the local store still keeps (the store
  time of the first record at the CommitLog's min offset: RocketMQ's ``getEarliestMessageTime``),
  absent while the store holds no message, as in RocketMQ; with tiered storage also one series
  per tiered queue, ``{storage_type="tiered", storage_medium="blob", topic, queue_id}``, the age
  of the oldest record the tier holds of it (RocketMQ's tiered store exports the same).

The collector takes plain callables (each service's own ``*_gauges()``), so it imports no
service and sits with the other scrape-time collectors in the broker's layers. Callables run on
the metrics HTTP thread and read copies of the services' tables.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from orbitmq.common.record import MAGIC, PREFIX, STORE_TIMESTAMP, STORE_TIMESTAMP_OFFSET

Gauges = Callable[[], Mapping[str, int]]

_SIMPLE = (
    ("timer", "enqueue_lag", "rocketmq_timer_enqueue_lag", "Timer entries not yet loaded"),
    ("timer", "enqueue_latency_ms", "rocketmq_timer_enqueue_latency_milliseconds",
     "Wait of the oldest timer entry not yet loaded, ms"),
    ("timer", "dequeue_lag", "rocketmq_timer_dequeue_lag", "Timers due and not yet delivered"),
    ("timer", "dequeue_latency_ms", "rocketmq_timer_dequeue_latency_milliseconds",
     "Delay of the oldest due timer not yet delivered, ms"),
    ("pop", "offset_buffer", "rocketmq_pop_offset_buffer_size",
     "Messages popped and not yet acked or revived"),
    ("pop", "checkpoint_buffer", "rocketmq_pop_checkpoint_buffer_size", "Open Pop checkpoints"),
)  # fmt: skip


class ServiceGaugeCollector(Collector):
    def __init__(
        self,
        base: tuple[str, str, str],
        *,
        half_messages: Callable[[], Mapping[str, int]],
        timer: Gauges,
        pop: Gauges,
        store: Callable[[], Mapping[str, Any]],
    ) -> None:
        """``base``: (cluster, node_type, node_id). ``half_messages``: topic -> pending
        halves; ``timer``/``pop``: the keys of ``_SIMPLE``; ``pop`` also ``revive_lag`` and
        ``revive_latency_ms``; ``store``: :func:`store_backlogs`."""
        self.base = base
        self.sources = {"timer": timer, "pop": pop, "store": store}
        self.half_messages = half_messages

    def collect(self) -> Iterator[Metric]:
        base = list(self.base)
        names = ["cluster", "node_type", "node_id"]
        values = {k: dict(f()) for k, f in self.sources.items()}
        halves = GaugeMetricFamily(
            "rocketmq_half_messages", "Half messages not yet decided", labels=[*names, "topic"]
        )
        for topic, n in sorted(self.half_messages().items()):
            halves.add_metric([*base, topic], n)
        yield halves
        for source, key, name, doc in _SIMPLE:
            fam = GaugeMetricFamily(name, doc, labels=names)
            fam.add_metric(base, values[source].get(key, 0))
            yield fam
        pop = values["pop"]
        for key, name, doc in (
            ("revive_lag", "rocketmq_pop_revive_lag", "Pop checkpoints due and not yet revived"),
            ("revive_latency_ms", "rocketmq_pop_revive_latency_milliseconds",
             "Delay of the oldest due Pop checkpoint not yet revived, ms"),
        ):  # fmt: skip
            fam = GaugeMetricFamily(name, doc, labels=[*names, "queue_id"])
            fam.add_metric([*base, "0"], pop.get(key, 0))  # one revive queue
            yield fam
        store = values["store"]
        for key, name, doc in (
            ("flush_behind", "rocketmq_storage_flush_behind_bytes", "CommitLog bytes not flushed"),
            ("dispatch_behind", "rocketmq_storage_dispatch_behind_bytes",
             "CommitLog bytes not yet dispatched to queues and indexes"),
        ):  # fmt: skip
            fam = GaugeMetricFamily(name, doc, labels=[*names, "storage_type"])
            fam.add_metric([*base, "local"], store.get(key, 0))
            yield fam
        reserve = GaugeMetricFamily(
            "rocketmq_storage_message_reserve_time_milliseconds",
            "Age of the oldest message kept in the store, ms",
            labels=[*names, "storage_type", "storage_medium"],
        )
        if "reserve_time_ms" in store:
            reserve.add_metric([*base, "local", "disk"], store["reserve_time_ms"])
        node = dict(zip(names, base, strict=True))
        for (topic, queue_id), age in sorted(store.get("tier_reserve_ms", {}).items()):
            labels = {**node, "storage_type": "tiered", "storage_medium": "blob", "topic": topic,
                      "queue_id": str(queue_id)}  # fmt: skip
            reserve.samples.append(Sample(reserve.name, labels, age))
        yield reserve


def store_backlogs(store: Any, now_ms: int | None = None) -> dict[str, Any]:
    """``flush_behind`` and ``dispatch_behind`` bytes of a MessageStore, and with ``now_ms``
    its ``reserve_time_ms`` when it holds a message and, with a tier, ``tier_reserve_ms``
    ((topic, queue) -> age of the oldest record the tier holds)."""
    log = store.commit_log
    out: dict[str, Any] = {
        "flush_behind": max(0, log.max_offset - log.flushed_offset),
        "dispatch_behind": max(0, log.max_offset - store.dispatcher.reput_offset),
    }
    earliest = earliest_message_ms(store) if now_ms is not None else None
    if earliest is not None and now_ms is not None:
        out["reserve_time_ms"] = max(0, now_ms - earliest)
    tier = getattr(store, "tier", None)
    if tier is not None and now_ms is not None:
        out["tier_reserve_ms"] = {k: max(0, now_ms - t) for k, t in tier.oldest_kept().items()}
    return out


def earliest_message_ms(store: Any) -> int | None:
    """Store time of the oldest record the CommitLog holds (None if it holds none). A segment
    starts with a record (fillers only end one), so this is the record at the min offset."""
    log = store.commit_log
    low = log.min_offset
    if low >= log.max_offset:
        return None
    loc = log.view_at(low)
    if loc is None:
        return None
    view, at, size = loc
    if at + STORE_TIMESTAMP_OFFSET + STORE_TIMESTAMP.size > size:
        return None
    if PREFIX.unpack_from(view, at)[1] != MAGIC:
        return None
    return int(STORE_TIMESTAMP.unpack_from(view, at + STORE_TIMESTAMP_OFFSET)[0])

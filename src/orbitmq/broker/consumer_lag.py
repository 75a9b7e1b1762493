"""The RocketMQ 5 gauges computed at scrape time: consumer lag per (topic, consumer_group) in
messages and in time, consumer and producer connections, and the broker's topic and group
counts and storage size.

Lag definitions (RocketMQ 5's ``ConsumerLagCalculator``), summed over a topic's queues:

- ``inflight`` = messages handed out but not committed: last pulled offset - committed offset
  for pull consumers, plus the Pop messages not yet acked;
- ``ready`` = messages not handed out yet: max offset - max(last pulled, committed);
- ``lag`` = ready + inflight;
- ``lag_latency`` = now - store time of the oldest uncommitted message (the message at the
  committed offset), the largest over the queues; ``queueing_latency`` the same for the oldest
  ready message. A queue with nothing pending contributes 0.

For a Pop group the "committed" offset of the offset table is where the next Pop starts, so
its in-flight count comes from the Pop state alone. The work is one ConsumeQueue entry and one
record header read per queue with a backlog, on the scrape thread (never the event loop).

Labels as RocketMQ's ``buildLagAttributes``: ``is_retry`` is "true" for the group's retry
topics. A Pop group's retry topic (``%RETRY%<group>+<topic>``) is reported under the topic it
retries, beside that topic's own series (RocketMQ's ``isRetry`` result); a push group's
``%RETRY%<group>`` keeps its name (RocketMQ skips it; here its backlog stays visible).
``is_system`` is :func:`~orbitmq.broker.rocketmq_metrics.is_system` of topic and group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from orbitmq.broker.consumer_manager import ConsumerManager
from orbitmq.broker.offset_manager import ConsumerOffsetManager
from orbitmq.broker.rocketmq_metrics import RocketMQMetrics, is_system
from orbitmq.broker.topic_manager import TopicConfigManager
from orbitmq.common.clock import Clock
from orbitmq.protocol.consumer import POP_RETRY_SEPARATOR, retry_topic
from orbitmq.store.message_store import MessageStore
from orbitmq.store.reader import store_time

InflightSource = Callable[[str, str, int], int]
"""``inflight(group, topic, queue_id)``: Pop messages handed out and not acked."""


@dataclass(slots=True)
class GroupLag:
    """One (topic, consumer_group)'s lag, summed over its queues on this broker."""

    topic: str
    group: str
    retry: bool = False
    ready: int = 0
    inflight: int = 0
    lag_latency_ms: int = 0
    queueing_latency_ms: int = 0

    @property
    def lag(self) -> int:
        return self.ready + self.inflight


def _labelled(topic: str, group: str) -> tuple[str, bool]:
    """(topic label, is_retry) of one of ``group``'s offset-table topics."""
    own_retry = retry_topic(group)
    if topic.startswith(own_retry + POP_RETRY_SEPARATOR):
        return topic[len(own_retry) + len(POP_RETRY_SEPARATOR) :], True
    return topic, topic == own_retry


class ConsumerLagCollector(Collector):
    """Yields ``rocketmq_consumer_*`` gauges and the broker-wide counts at each scrape."""

    def __init__(
        self,
        rmq: RocketMQMetrics,
        store: MessageStore,
        topics: TopicConfigManager,
        offsets: ConsumerOffsetManager,
        groups: Callable[[], int],
        clock: Clock,
        inflight: InflightSource | None = None,
        consumers: ConsumerManager | None = None,
    ) -> None:
        self.rmq = rmq
        self.consumers = consumers
        self.store = store
        self.topics = topics
        self.offsets = offsets
        self.group_count = groups
        self.clock = clock
        self.inflight = inflight

    def _time_at(self, topic: str, queue_id: int, offset: int) -> int | None:
        cq = self.store.queues.get(topic, queue_id)
        if cq is None or not cq.min_offset <= offset < cq.max_offset:
            return None
        return store_time(self.store.commit_log, cq.entry(offset))

    def lags(self) -> list[GroupLag]:
        """Every (topic, group) with a committed offset on this broker."""
        now = self.clock.now_ms()
        out: list[GroupLag] = []
        pulled = self.rmq.pulled
        for group in self.offsets.groups():
            for topic, queues in sorted(self.offsets.offsets(group).items()):
                if self.topics.get(topic) is None:
                    continue
                label, retry = _labelled(topic, group)
                g = GroupLag(label, group, retry)
                for queue_id, committed in sorted(queues.items()):
                    high = self.store.max_offset(topic, queue_id)
                    low = self.store.min_offset(topic, queue_id)
                    committed = max(committed, low)
                    handed = max(pulled.get((group, topic, queue_id), committed), committed)
                    handed = min(handed, high)
                    pop = self.inflight(group, topic, queue_id) if self.inflight else 0
                    g.inflight += handed - committed + pop
                    g.ready += max(0, high - handed)
                    if committed < high:
                        t = self._time_at(topic, queue_id, committed)
                        if t is not None:
                            g.lag_latency_ms = max(g.lag_latency_ms, now - t)
                    if handed < high:
                        t = self._time_at(topic, queue_id, handed)
                        if t is not None:
                            g.queueing_latency_ms = max(g.queueing_latency_ms, now - t)
                out.append(g)
        return out

    def _lags_retried(self) -> list[GroupLag]:
        """``lags()``, read again if the event loop changed a table while this thread copied
        it (a dict changing size mid-iteration); the copies are small, a retry is cheap."""
        for _ in range(4):
            try:
                return self.lags()
            except RuntimeError:
                continue
        return self.lags()

    def collect(self) -> Iterator[Metric]:
        base = list(self.rmq.base)
        names = ["cluster", "node_type", "node_id"]
        lag_labels = [*names, "topic", "consumer_group", "is_retry", "is_system"]
        fams = {
            "lag": GaugeMetricFamily(
                "rocketmq_consumer_lag_messages", "Messages not yet consumed", labels=lag_labels
            ),
            "inflight": GaugeMetricFamily(
                "rocketmq_consumer_inflight_messages",
                "Messages handed out and not yet committed or acked",
                labels=lag_labels,
            ),
            "ready": GaugeMetricFamily(
                "rocketmq_consumer_ready_messages",
                "Messages ready and not yet handed out",
                labels=lag_labels,
            ),
            "lag_latency": GaugeMetricFamily(
                "rocketmq_consumer_lag_latency_milliseconds",
                "Age of the oldest message not yet consumed, ms",
                labels=lag_labels,
            ),
            "queueing_latency": GaugeMetricFamily(
                "rocketmq_consumer_queueing_latency_milliseconds",
                "Age of the oldest message not yet handed out, ms",
                labels=lag_labels,
            ),
        }
        for g in self._lags_retried():
            flags = ["true" if g.retry else "false", is_system(g.topic, g.group)]
            labels = [*base, g.topic, g.group, *flags]
            fams["lag"].add_metric(labels, g.lag)
            fams["inflight"].add_metric(labels, g.inflight)
            fams["ready"].add_metric(labels, g.ready)
            fams["lag_latency"].add_metric(labels, g.lag_latency_ms)
            fams["queueing_latency"].add_metric(labels, g.queueing_latency_ms)
        yield from fams.values()
        yield self._connections(base, names)
        yield self._producers(base, names)
        for name, doc, value in (
            ("rocketmq_topic_number", "Topics on this broker", len(self.topics.topics)),
            ("rocketmq_consumer_group_number", "Consumer groups known", self.group_count()),
            (
                "rocketmq_storage_size",
                "Bytes the store's files occupy on disk",
                self.store.retention.disk_used_bytes,
            ),
        ):
            extra = ["storage_type"] if name == "rocketmq_storage_size" else []
            fam = GaugeMetricFamily(name, doc, labels=[*names, *extra])
            fam.add_metric([*base, *(["local"] if extra else [])], value)
            yield fam

    def _connections(self, base: list[str], names: list[str]) -> GaugeMetricFamily:
        """``rocketmq_consumer_connections``: online members by group, language, version and
        consume mode (push, pull, pop), as their heartbeats say; language and version in lower
        case, ``protocol_type="remoting"`` and ``is_system`` of the group, as RocketMQ 5's
        ``BrokerMetricsManager`` labels them."""
        fam = GaugeMetricFamily(
            "rocketmq_consumer_connections",
            "Online consumer group members",
            labels=[*names, "consumer_group", "language", "version", "consume_mode",
                    "protocol_type", "is_system"],
        )  # fmt: skip
        counts: dict[tuple[str, str, str, str], int] = {}
        if self.consumers is not None:
            for group, g in list(self.consumers.groups.items()):
                for m in list(g.members.values()):
                    key = (group, m.language.lower(), m.version.lower(), m.consume_type.lower())
                    counts[key] = counts.get(key, 0) + 1
        for key, n in sorted(counts.items()):
            fam.add_metric([*base, *key, "remoting", is_system("", key[0])], n)
        return fam

    def _producers(self, base: list[str], names: list[str]) -> GaugeMetricFamily:
        """``rocketmq_producer_connections``: producers heartbeating to this broker, one per
        (producer group, client) as RocketMQ's ProducerManager counts them, by language and
        version (lower case, as RocketMQ writes them) and ``protocol_type="remoting"``."""
        fam = GaugeMetricFamily(
            "rocketmq_producer_connections", "Producers heartbeating to this broker",
            labels=[*names, "language", "version", "protocol_type"],
        )  # fmt: skip
        counts: dict[tuple[str, str], int] = {}
        if self.consumers is not None:
            for members in list(self.consumers.producers.values()):
                for p in list(members.values()):
                    key = (p.language.lower(), p.version.lower())
                    counts[key] = counts.get(key, 0) + 1
        for key, n in sorted(counts.items()):
            fam.add_metric([*base, *key, "remoting"], n)
        return fam

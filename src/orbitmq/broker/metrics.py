"""The broker's Prometheus metrics (one registry per broker, so tests can run several)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from orbitmq.broker.heap import GcCollector
from orbitmq.broker.rocketmq_metrics import RocketMQMetrics
from orbitmq.broker.watermark import ProcessorWatermark

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)


class BrokerMetrics:
    def __init__(self, cluster: str = "DefaultCluster", node_id: str = "broker-a") -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.rmq = RocketMQMetrics(cluster, node_id)
        """The RocketMQ 5 family (``rocketmq_*``, broker/rocketmq_metrics.py), fed per batch."""
        r.register(self.rmq)
        self.watermark = ProcessorWatermark(self.rmq.base)
        """Requests in progress per RocketMQ processor (the Dispatcher counts them)."""
        r.register(self.watermark)
        self.requests = Counter("orbitmq_broker_requests", "Requests by code", ["code"], registry=r)
        self.errors = Counter(
            "orbitmq_broker_errors", "Error responses by response code", ["code"], registry=r
        )
        self.messages_in = Counter("orbitmq_broker_messages_in", "Messages stored", registry=r)
        self.bytes_in = Counter("orbitmq_broker_bytes_in", "Body bytes stored", registry=r)
        self.messages_out = Counter("orbitmq_broker_messages_out", "Messages pulled", registry=r)
        self.bytes_out = Counter("orbitmq_broker_bytes_out", "Record bytes pulled", registry=r)
        self.send_latency = Histogram(
            "orbitmq_broker_send_seconds",
            "Send handling time incl. append and (SYNC_FLUSH) fsync",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.append_latency = Histogram(
            "orbitmq_store_append_seconds", "Store append time", buckets=LATENCY_BUCKETS, registry=r
        )
        self.flush_latency = Histogram(
            "orbitmq_store_flush_seconds",
            "CommitLog fsync time (group commit in SYNC_FLUSH, background in ASYNC_FLUSH)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.dispatch_lag = Gauge(
            "orbitmq_store_dispatch_lag_bytes", "CommitLog bytes not yet dispatched", registry=r
        )
        self.disk_ratio = Gauge("orbitmq_store_disk_used_percent", "Disk use, percent", registry=r)
        self.disk_bytes = Gauge(
            "orbitmq_store_disk_used_bytes",
            "Blocks the store's files occupy, in bytes (as of the last retention run)",
            registry=r,
        )
        self.topics = Gauge("orbitmq_broker_topics", "Topics on this broker", registry=r)
        self.queues = Gauge("orbitmq_store_queues", "ConsumeQueues", registry=r)
        self.connections = Gauge("orbitmq_broker_connections", "Open connections", registry=r)
        self.fsyncs = Gauge("orbitmq_store_fsyncs", "CommitLog fsyncs so far", registry=r)
        self.held_pulls = Gauge("orbitmq_broker_long_polls", "Pulls waiting", registry=r)
        # Consumer groups.
        self.consumer_groups = Gauge(
            "orbitmq_broker_consumer_groups", "Consumer groups with online members", registry=r
        )
        self.consumers = Gauge(
            "orbitmq_broker_consumers", "Online consumer group members", registry=r
        )
        self.queue_locks = Gauge(
            "orbitmq_broker_queue_locks", "Queue locks held by orderly consumers", registry=r
        )
        self.offset_commits = Counter(
            "orbitmq_broker_offset_commits", "Consumer offsets committed durably", registry=r
        )
        self.membership_changes = Counter(
            "orbitmq_broker_membership_changes",
            "Consumers joining or leaving groups, by how",
            ["event"],
            registry=r,
        )
        self.messages_sent_back = Counter(
            "orbitmq_broker_messages_sent_back",
            "Messages copied to a retry topic (CONSUMER_SEND_MSG_BACK)",
            registry=r,
        )
        self.filtered_out = Counter(
            "orbitmq_broker_sql_filtered_out",
            "Records read for a pull but not served because its SQL92 filter rejected them",
            registry=r,
        )
        r.register(GcCollector())  # GC pauses of this process (docs/operations.md)


HealthSource = Callable[[], tuple[Mapping[str, int], Mapping[str, str]]]
"""Returns (failures so far per service, cause per degraded part)."""


class HealthCollector(Collector):
    """Supervision at scrape time: ``orbitmq_service_failures{service}`` (failed turns of each
    background service since start) and ``orbitmq_degraded{part}`` (1 while a part is
    degraded: a failing service, the index, the disk, a fenced CommitLog)."""

    def __init__(self, source: HealthSource) -> None:
        self.source = source

    def collect(self) -> Iterator[GaugeMetricFamily]:
        failures, degraded = self.source()
        f = GaugeMetricFamily(
            "orbitmq_service_failures",
            "Failed turns of each supervised background service since start",
            labels=["service"],
        )
        for name, count in sorted(failures.items()):
            f.add_metric([name], count)
        yield f
        d = GaugeMetricFamily(
            "orbitmq_degraded", "1 while this part of the broker is degraded", labels=["part"]
        )
        for name in sorted(degraded):
            d.add_metric([name], 1)
        yield d


class TierCollector(Collector):
    """Tiered storage at scrape time (docs/tiered-storage.md): ``orbitmq_tier_available`` (0
    while the object store cannot be reached), ``orbitmq_tier_errors_total`` (failed upload
    turns), ``orbitmq_tier_upload_lag_messages`` and ``orbitmq_tier_upload_lag_seconds`` (the
    age of the oldest record not uploaded), ``orbitmq_tier_uploaded_bytes_total`` and
    ``orbitmq_tier_gap_messages_total`` (offsets lost to deletion before upload: only when the
    operator allowed it)."""

    def __init__(self, stats: Callable[[], dict[str, int]]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily]:
        s = self.stats()
        for name, key, scale, doc in (
            ("available", "tier_available", 1, "1 while the tier's object store is reachable"),
            ("errors_total", "tier_errors", 1, "Failed tier upload turns since start"),
            ("upload_lag_messages", "tier_upload_lag_messages", 1, "Messages not uploaded"),
            ("upload_lag_seconds", "tier_upload_lag_ms", 1000, "Oldest upload wait"),
            ("uploaded_bytes_total", "tier_uploaded_bytes", 1, "Bytes uploaded since start"),
            ("gap_messages_total", "tier_gap_messages", 1, "Offsets deleted before upload"),
        ):
            yield GaugeMetricFamily(f"orbitmq_tier_{name}", doc, value=s.get(key, 0) / scale)

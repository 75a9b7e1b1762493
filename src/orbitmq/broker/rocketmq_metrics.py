"""The RocketMQ 5 metric family (``rocketmq_*``), exported beside ``orbitmq_*`` on the broker's
Prometheus endpoint so RocketMQ's public Grafana dashboards and alert rules work unchanged.

Names, types and labels follow RocketMQ 5's ``BrokerMetricsConstant`` as its Prometheus
exporter writes them (units appended: ``rocketmq_consumer_lag_latency_milliseconds``); every
series carries ``cluster``, ``node_type`` ("broker") and ``node_id`` (the broker name), as
RocketMQ's do.

Why plain dicts and not prometheus_client Counters: the send and pull paths count once per
batch, on the event loop, with a dict increment keyed by (topic, ...); prometheus_client takes a
lock and a ``labels()`` lookup per call. The message-size histogram is filled per batch with
one numpy ``searchsorted`` over the batch's body lengths. Everything is turned into metric
families only at scrape time (:meth:`RocketMQMetrics.collect`, on the HTTP server's thread: the
dicts are copied with ``d.copy()``, atomic under the GIL). The consumer-lag gauges are
computed at scrape time too, by :class:`orbitmq.broker.consumer_lag.ConsumerLagCollector`.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

import numpy as np
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import DiskFullError, FlushTimeoutError
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.consumer import is_system_group

MESSAGE_SIZE_BUCKETS = (1024, 4096, 16384, 65536, 262144, 1048576, 4194304)
"""Bytes, RocketMQ's ``rocketmq_message_size`` buckets (1 KiB ... 4 MiB)."""
RPC_LATENCY_BUCKETS = (1, 3, 5, 10, 25, 50, 100, 500, 1000, 3000)
"""Milliseconds, RocketMQ's ``rocketmq_rpc_latency`` buckets."""

FINISH_LATENCY_BUCKETS = (10, 100, 1000, 5000, 10000, 60000, 300000, 3600000)
"""Milliseconds from a half message's store to its commit or rollback."""
POP_SCAN_BUCKETS = (1, 10, 100, 1000, 2000, 3000)
"""Milliseconds, RocketMQ's ``rocketmq_pop_buffer_scan_time_consume`` buckets."""

SYSTEM_TOPIC_PREFIXES = ("rmq_sys_", "RMQ_SYS_", "SCHEDULE_TOPIC", "TBW102", "OFFSET_MOVED_EVENT",
                         "TRANS_CHECK_MAX_TIME_TOPIC", "BenchmarkTest", "SELF_TEST_TOPIC")  # fmt: skip
"""RocketMQ's ``TopicValidator.isSystemTopic`` (its system topic set and ``rmq_sys_``), plus
OrbitMQ's own system topics (revive log, timer, half and op topics, trace), all of them
``RMQ_SYS_*`` or ``rmq_sys_*``."""

MESSAGE_TYPES = ("normal", "fifo", "transaction", "delay")


def put_status(exc: BaseException | None) -> str:
    """RocketMQ's PutMessageStatus name for a write's outcome (the ``put_status`` label)."""
    if exc is None:
        return "PUT_OK"
    if isinstance(exc, FlushTimeoutError):
        return "FLUSH_DISK_TIMEOUT"
    if isinstance(exc, DiskFullError):
        return "SERVICE_NOT_AVAILABLE"
    return "UNKNOWN_ERROR"


def code_name(codes: type[RequestCode] | type[ResponseCode], code: int) -> str:
    """A request or response code as RocketMQ's ``RemotingHelper.get{Request,Response}CodeDesc``
    writes it in ``rocketmq_rpc_latency``: the constant's name in lower case
    (``send_message``, ``success``), the number for a code without a name."""
    try:
        return codes(code).name.lower()
    except ValueError:
        return str(code)


def is_system(topic: str, group: str = "") -> str:
    """The ``is_system`` label: "true" for a system topic or a system group (RocketMQ's
    ``BrokerMetricsManager.isSystem``), else "false" (OTel writes booleans so)."""
    system = topic.startswith(SYSTEM_TOPIC_PREFIXES) or is_system_group(group)
    return "true" if system else "false"


class _Histogram:
    """Bucket counts (non-cumulative, +Inf last) and the sum for one label set."""

    __slots__ = ("counts", "total")

    def __init__(self, n: int) -> None:
        self.counts = [0] * (n + 1)
        self.total = 0.0


def _buckets(bounds: tuple[float, ...], h: _Histogram) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    acc = 0
    for bound, count in zip(bounds, h.counts, strict=False):
        acc += count
        out.append((str(float(bound)), acc))
    out.append(("+Inf", acc + h.counts[-1]))
    return out


class RocketMQMetrics(Collector):
    """Counters and histograms of the ``rocketmq_*`` family, fed per batch by the broker."""

    def __init__(self, cluster: str, node_id: str, node_type: str = "broker") -> None:
        self.base = (cluster, node_type, node_id)
        self.messages_in: dict[tuple[str, str], int] = {}
        self.bytes_in: dict[tuple[str, str], int] = {}
        self.sizes: dict[tuple[str, str], _Histogram] = {}
        self.messages_out: dict[tuple[str, str, bool], int] = {}
        """(topic, group, is_retry) -> messages delivered."""
        self.bytes_out: dict[tuple[str, str, bool], int] = {}
        self.dlq: dict[tuple[str, str], int] = {}
        self.rpc: dict[tuple[int, int, bool], _Histogram] = {}
        self.suspended: set[int] = set()
        """``id()`` of the request frames being held by long polling (a pull or a Pop waiting
        for messages): their answer is recorded with ``is_long_polling="true"``."""
        self._size_edges = np.asarray(MESSAGE_SIZE_BUCKETS, dtype=np.int64)
        self.tx_commit: dict[str, int] = {}
        self.tx_rollback: dict[str, int] = {}
        self.tx_finish: dict[str, _Histogram] = {}
        self.revive_in: dict[tuple[str, str, str, str], int] = {}
        self.revive_out: dict[tuple[str, str, str, str], int] = {}
        self.revive_retry: dict[tuple[str, str, str], int] = {}
        """(group, topic, put status) -> revived messages written to a pop retry topic."""
        self.pop_scan = _Histogram(len(POP_SCAN_BUCKETS))
        self.pulled: dict[tuple[str, str, int], int] = {}
        """(group, topic, queue) -> next offset a pull handed out (for the in-flight gauge)."""

    # ------------------------------------------------------------------ hot path (per batch)

    def on_send(
        self,
        topic: str,
        message_type: str,
        lengths: np.ndarray | Sequence[int],
        total: int | None = None,
    ) -> None:
        """A stored batch: ``lengths`` holds its body lengths (one entry per message; a list
        or numpy), ``total`` their sum when the caller has it."""
        key = (topic, message_type)
        n = len(lengths)
        if total is None:
            total = int(sum(lengths.tolist() if isinstance(lengths, np.ndarray) else lengths))
        self.messages_in[key] = self.messages_in.get(key, 0) + n
        self.bytes_in[key] = self.bytes_in.get(key, 0) + total
        h = self.sizes.get(key)
        if h is None:
            h = self.sizes[key] = _Histogram(len(MESSAGE_SIZE_BUCKETS))
        if n == 1:
            h.counts[bisect.bisect_left(MESSAGE_SIZE_BUCKETS, total)] += 1
        elif n <= 16:  # a few messages: bisect each, cheaper than numpy's fixed cost
            counts = h.counts
            for length in lengths.tolist() if isinstance(lengths, np.ndarray) else lengths:
                counts[bisect.bisect_left(MESSAGE_SIZE_BUCKETS, length)] += 1
        else:
            idx = np.searchsorted(self._size_edges, lengths, side="left")
            for i, c in enumerate(np.bincount(idx, minlength=len(h.counts)).tolist()):
                h.counts[i] += c
        h.total += total

    def on_out(self, topic: str, group: str, count: int, nbytes: int, retry: bool = False) -> None:
        """Messages handed to a consumer group (a pull or a Pop answer); ``retry``: they come
        from a retry topic (``is_retry``; for a Pop, ``topic`` is the popped topic)."""
        if not count:
            return
        key = (topic, group, retry)
        self.messages_out[key] = self.messages_out.get(key, 0) + count
        self.bytes_out[key] = self.bytes_out.get(key, 0) + nbytes

    def on_pull(self, group: str, topic: str, queue_id: int, next_offset: int) -> None:
        """Where a group's pull of a queue stopped (in flight = this - committed offset)."""
        self.pulled[(group, topic, queue_id)] = next_offset

    def on_dlq(self, topic: str, group: str, count: int = 1) -> None:
        """Messages of ``topic`` moved to ``group``'s dead-letter queue."""
        key = (topic, group)
        self.dlq[key] = self.dlq.get(key, 0) + count

    def on_rpc(
        self, request_code: int, response_code: int, millis: float, long_polling: bool = False
    ) -> None:
        """One request answered, with its handling time (``long_polling``: it was held)."""
        key = (request_code, response_code, long_polling)  # made text only at scrape time
        h = self.rpc.get(key)
        if h is None:
            h = self.rpc[key] = _Histogram(len(RPC_LATENCY_BUCKETS))
        h.counts[bisect.bisect_left(RPC_LATENCY_BUCKETS, millis)] += 1
        h.total += millis

    def on_end_transaction(self, topic: str, committed: bool, latency_ms: int) -> None:
        """A half message of ``topic`` committed or rolled back ``latency_ms`` after it was
        stored (``rocketmq_{commit,rollback}_messages_total``, ``_finish_message_latency``)."""
        table = self.tx_commit if committed else self.tx_rollback
        table[topic] = table.get(topic, 0) + 1
        h = self.tx_finish.get(topic)
        if h is None:
            h = self.tx_finish[topic] = _Histogram(len(FINISH_LATENCY_BUCKETS))
        h.counts[bisect.bisect_left(FINISH_LATENCY_BUCKETS, latency_ms)] += 1
        h.total += latency_ms

    def on_revive_in(self, group: str, topic: str, kind: str, status: str, count: int) -> None:
        """Pop records of (group, topic) written to the revive log (``kind``: CK or ACK;
        ``status``: the PutMessageStatus name of the write), RocketMQ's labels."""
        key = (group, topic, kind, status)
        self.revive_in[key] = self.revive_in.get(key, 0) + count

    def on_revive_out(self, group: str, topic: str, kind: str, count: int) -> None:
        """Pop checkpoints of (group, topic) taken out by revive (``kind``: CK), from revive
        queue 0 (OrbitMQ has one)."""
        key = (group, topic, "0", kind)
        self.revive_out[key] = self.revive_out.get(key, 0) + count

    def on_revive_retry(self, group: str, topic: str, status: str, count: int) -> None:
        """Revived Pop messages written to ``group``'s pop retry topic (``topic``: the popped
        queue's topic, as RocketMQ's checkpoint names it; ``status``: a PutMessageStatus name)."""
        key = (group, topic, status)
        self.revive_retry[key] = self.revive_retry.get(key, 0) + count

    def on_pop_scan(self, millis: float) -> None:
        """One pass of the reviver over the open Pop checkpoints (revive what is due, compact
        what is stale): RocketMQ's PopBufferMergeService scan."""
        h = self.pop_scan
        h.counts[bisect.bisect_left(POP_SCAN_BUCKETS, millis)] += 1
        h.total += millis

    def forget_group(self, group: str) -> None:
        """A deleted group: drop its pull positions (its counters stay, as counters do)."""
        for key in [k for k in list(self.pulled) if k[0] == group]:
            self.pulled.pop(key, None)

    # ------------------------------------------------------------------ scrape

    def collect(self) -> Iterator[Metric]:
        base = list(self.base)
        names = ["cluster", "node_type", "node_id"]
        sys_label = ["is_system"]
        for name, doc, table in (
            ("rocketmq_messages_in", "Messages stored", self.messages_in),
            ("rocketmq_throughput_in", "Body bytes stored", self.bytes_in),
        ):
            fam = CounterMetricFamily(
                name, doc, labels=[*names, "topic", "message_type", *sys_label]
            )
            for (topic, mtype), value in sorted(table.copy().items()):
                fam.add_metric([*base, topic, mtype, is_system(topic)], value)
            yield fam
        for name, doc, out in (
            ("rocketmq_messages_out", "Messages delivered", self.messages_out),
            ("rocketmq_throughput_out", "Bytes delivered", self.bytes_out),
        ):
            fam = CounterMetricFamily(
                name, doc, labels=[*names, "topic", "consumer_group", *sys_label, "is_retry"]
            )
            for (topic, group, retry), value in sorted(out.copy().items()):
                labels = [topic, group, is_system(topic, group), "true" if retry else "false"]
                fam.add_metric([*base, *labels], value)
            yield fam
        fam = CounterMetricFamily(
            "rocketmq_send_to_dlq_messages", "Messages dead-lettered",
            labels=[*names, "topic", "consumer_group", *sys_label],
        )  # fmt: skip
        for (topic, group), value in sorted(self.dlq.copy().items()):
            fam.add_metric([*base, topic, group, is_system(topic, group)], value)
        yield fam
        for name, doc, one in (
            ("rocketmq_commit_messages", "Half messages committed", self.tx_commit),
            ("rocketmq_rollback_messages", "Half messages rolled back", self.tx_rollback),
        ):
            fam = CounterMetricFamily(name, doc, labels=[*names, "topic"])
            for topic, value in sorted(one.copy().items()):
                fam.add_metric([*base, topic], value)
            yield fam
        for name, doc, kinds, extra in (
            ("rocketmq_pop_revive_in_message", "Records written to the revive log",
             self.revive_in, ["consumer_group", "topic", "revive_message_type", "put_status"]),
            ("rocketmq_pop_revive_out_message", "Checkpoints taken out by revive",
             self.revive_out, ["consumer_group", "topic", "queue_id", "revive_message_type"]),
        ):  # fmt: skip
            fam = CounterMetricFamily(name, doc, labels=[*names, *extra])
            for key, value in sorted(kinds.copy().items()):
                fam.add_metric([*base, *key], value)
            yield fam
        revived = CounterMetricFamily(
            "rocketmq_pop_revive_retry_messages", "Revived messages put to a pop retry topic",
            labels=[*names, "consumer_group", "topic", "put_status"],
        )  # fmt: skip
        for retried, value in sorted(self.revive_retry.copy().items()):
            revived.add_metric([*base, *retried], value)
        yield revived
        scan = HistogramMetricFamily(
            "rocketmq_pop_buffer_scan_time_consume_milliseconds",
            "Time of one reviver pass over the open Pop checkpoints, milliseconds",
            labels=names,
        )
        pop_scan = self.pop_scan
        if sum(pop_scan.counts):
            scan.add_metric(base, _buckets(POP_SCAN_BUCKETS, pop_scan), sum_value=pop_scan.total)
        yield scan
        finish = HistogramMetricFamily(
            "rocketmq_finish_message_latency",
            "Half message store to commit or rollback, milliseconds",
            labels=[*names, "topic"],
        )
        for topic, h in sorted(self.tx_finish.copy().items()):
            finish.add_metric(
                [*base, topic], _buckets(FINISH_LATENCY_BUCKETS, h), sum_value=h.total
            )
        yield finish
        sizes = HistogramMetricFamily(
            "rocketmq_message_size",
            "Body size of stored messages, bytes",
            labels=[*names, "topic", "message_type", "is_system"],
        )
        for (topic, mtype), h in sorted(self.sizes.copy().items()):
            sizes.add_metric(
                [*base, topic, mtype, is_system(topic)],
                _buckets(MESSAGE_SIZE_BUCKETS, h),
                sum_value=h.total,
            )
        yield sizes
        rpc = HistogramMetricFamily(
            "rocketmq_rpc_latency",
            "Request handling time on the broker, milliseconds",
            labels=[*names, "protocol_type", "request_code", "response_code", "is_long_polling",
                    "result"],
        )  # fmt: skip
        for (req, resp, held), h in sorted(self.rpc.copy().items()):
            codes = [code_name(RequestCode, req), code_name(ResponseCode, resp)]
            rpc.add_metric(
                [*base, "remoting", *codes, "true" if held else "false", "success"],
                _buckets(RPC_LATENCY_BUCKETS, h),
                sum_value=h.total,
            )
        yield rpc

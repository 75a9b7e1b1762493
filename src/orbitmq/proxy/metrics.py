"""The proxy's Prometheus metrics, RocketMQ 5 names (``ProxyMetricsConstant`` and the RPC
latency of ``RemotingMetricsConstant``), on its own endpoint (``[proxy] metrics_port``):

- ``rocketmq_proxy_up{proxy_mode}``: 1 while the proxy serves (``cluster``: it reaches brokers
  through the NameServer, RocketMQ's cluster mode);
- ``rocketmq_rpc_latency{protocol_type="grpc", request_code, response_code}``: handling time of
  each gRPC call in milliseconds, by method name and the ``apache.rocketmq.v2.Code`` name of the
  answer's status (a streaming call: until its last message);
- ``rocketmq_producer_connections{language, version, protocol_type}`` and
  ``rocketmq_consumer_connections{consumer_group, language, version, consume_mode,
  protocol_type, is_system}``: clients with a session (their Settings' user agent, in lower
  case as RocketMQ writes it; consume_mode ``push``, ``pop`` (simple) or ``pull``;
  ``protocol_type="grpc"``; ``is_system`` of the group, as the broker's).

Every series carries ``cluster``, ``node_type`` ("proxy") and ``node_id`` (the proxy's
address), as RocketMQ's do. The wrappers time a call on the event loop with one dict update;
families are built at scrape time on the HTTP server's thread.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from orbitmq.protocol.consumer import is_system_group
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.sessions import ClientSession

RPC_LATENCY_BUCKETS = (1, 3, 5, 10, 25, 50, 100, 500, 1000, 3000)
"""Milliseconds, RocketMQ's ``rocketmq_rpc_latency`` buckets (as the broker's)."""
_CONSUME_MODE = {
    pb.PUSH_CONSUMER: "push",
    pb.LITE_PUSH_CONSUMER: "push",
    pb.SIMPLE_CONSUMER: "pop",
    pb.LITE_SIMPLE_CONSUMER: "pop",
    pb.PULL_CONSUMER: "pull",
}

_Resp = TypeVar("_Resp")


class ProxyMetrics(Collector):
    def __init__(self, cluster: str, node_id: str, proxy_mode: str = "cluster") -> None:
        self.base = (cluster, "proxy", node_id)
        self.proxy_mode = proxy_mode
        self.up = 0
        self.rpc: dict[tuple[str, str], list[float]] = {}
        """(method, code name) -> non-cumulative bucket counts (+Inf last), then the sum."""
        self.sessions: Callable[[], Iterable[ClientSession]] = tuple
        self.registry = CollectorRegistry()
        self.registry.register(self)

    def on_rpc(self, method: str, code: str, millis: float) -> None:
        h = self.rpc.get((method, code))
        if h is None:
            h = self.rpc[(method, code)] = [0.0] * (len(RPC_LATENCY_BUCKETS) + 2)
        h[bisect.bisect_left(RPC_LATENCY_BUCKETS, millis)] += 1
        h[-1] += millis

    def unary(
        self, method: str, call: Callable[[Any, Any], Awaitable[_Resp]]
    ) -> Callable[[Any, Any], Awaitable[_Resp]]:
        """``call`` timed (its answer's status names the response code)."""

        async def timed(request: Any, context: Any) -> _Resp:
            began = time.perf_counter()
            code = "INTERNAL_ERROR"  # cancelled or raised: no answer went out
            try:
                resp = await call(request, context)
                code = _code_of(resp)
                return resp
            finally:
                self.on_rpc(method, code, (time.perf_counter() - began) * 1000)

        return timed

    def streaming(
        self, method: str, call: Callable[[Any, Any], AsyncIterator[_Resp]]
    ) -> Callable[[Any, Any], AsyncIterator[_Resp]]:
        """``call`` timed until its last message (the first status names the code)."""

        async def timed(request: Any, context: Any) -> AsyncIterator[_Resp]:
            began = time.perf_counter()
            code = ""
            try:
                async for item in call(request, context):
                    if not code and item.HasField("status"):  # type: ignore[attr-defined]
                        code = _code_of(item)
                    yield item
            finally:
                self.on_rpc(method, code or "INTERNAL_ERROR", (time.perf_counter() - began) * 1000)

        return timed

    def collect(self) -> Iterator[Metric]:
        base = list(self.base)
        names = ["cluster", "node_type", "node_id"]
        up = GaugeMetricFamily(
            "rocketmq_proxy_up", "1 while serving", labels=[*names, "proxy_mode"]
        )
        up.add_metric([*base, self.proxy_mode], self.up)
        yield up
        rpc = HistogramMetricFamily(
            "rocketmq_rpc_latency",
            "gRPC call handling time on the proxy, milliseconds",
            labels=[*names, "protocol_type", "request_code", "response_code"],
        )
        for (method, code), h in sorted(self.rpc.copy().items()):
            acc, buckets = 0.0, []
            for bound, count in zip(RPC_LATENCY_BUCKETS, h, strict=False):
                acc += count
                buckets.append((str(float(bound)), acc))
            buckets.append(("+Inf", acc + h[-2]))
            rpc.add_metric([*base, "grpc", method, code], buckets, sum_value=h[-1])
        yield rpc
        yield from self._connections(base, names)

    def _connections(self, base: list[str], names: list[str]) -> Iterator[Metric]:
        producers: dict[tuple[str, str], int] = {}
        consumers: dict[tuple[str, str, str, str], int] = {}
        for s in list(self.sessions()):
            settings = s.settings
            if settings is None:
                continue
            ua = settings.user_agent
            lang = pb.Language.Name(ua.language) if ua.language in pb.Language.values() else "?"
            lang, version = lang.lower(), ua.version.lower()
            kind = settings.client_type
            if kind == pb.PRODUCER:
                producers[(lang, version)] = producers.get((lang, version), 0) + 1
            elif kind in _CONSUME_MODE:
                ckey = (s.group or "", lang, version, _CONSUME_MODE[kind])
                consumers[ckey] = consumers.get(ckey, 0) + 1
        fam = GaugeMetricFamily(
            "rocketmq_producer_connections", "Producers with a session",
            labels=[*names, "language", "version", "protocol_type"],
        )  # fmt: skip
        for key, n in sorted(producers.items()):
            fam.add_metric([*base, *key, "grpc"], n)
        yield fam
        fam = GaugeMetricFamily(
            "rocketmq_consumer_connections", "Consumers with a session",
            labels=[*names, "consumer_group", "language", "version", "consume_mode",
                    "protocol_type", "is_system"],
        )  # fmt: skip
        for group_key, n in sorted(consumers.items()):
            fam.add_metric(
                [*base, *group_key, "grpc", "true" if is_system_group(group_key[0]) else "false"], n
            )
        yield fam


_CODE_NAMES = {int(number): name for name, number in pb.Code.items()}
"""Code names by number, built once: ``pb.Code.values()`` builds a list on every call."""


def _code_of(resp: Any) -> str:
    code = int(resp.status.code)
    return _CODE_NAMES.get(code) or str(code)

"""The proxy's Prometheus endpoint (``metrics_port``): RocketMQ 5's proxy names and labels
after real gRPC calls (proxy/metrics.py)."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.grpc_v2 import service_pb2 as svc
from tests.harness import ProcessCluster
from tests.proxy.conftest import ProxyEnv, endpoints_pb, proxy_env_fixture
from tests.proxy.test_producer_rpcs import message, send

env = proxy_env_fixture({"PxMetrics": "NORMAL"}, proxy_options={"metrics_port": 0, "cluster": "PC"})


def scrape(env: ProxyEnv) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    port = env.proxy.metrics_port
    assert port
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def find(samples: dict[Any, float], name: str, **labels: str) -> float | None:
    want = set(labels.items())
    hits = [v for (n, ls), v in samples.items() if n == name and want <= set(ls)]
    assert len(hits) <= 1, (name, labels, hits)
    return hits[0] if hits else None


async def test_proxy_up_rpc_latency_and_connections(env: ProxyEnv, stub: Any) -> None:
    base = {"cluster": "PC", "node_type": "proxy", "node_id": env.endpoint}
    for _ in range(2):
        resp = await send(stub, message("PxMetrics"))
        assert resp.status.code == pb.Code.OK, resp.status
    missing = await stub.QueryRoute(
        svc.QueryRouteRequest(topic=pb.Resource(name="PxNoSuchTopic"),
                              endpoints=endpoints_pb(env.endpoint)),
        timeout=10,
    )  # fmt: skip
    assert missing.status.code == pb.Code.TOPIC_NOT_FOUND
    pull = svc.PullMessageRequest(
        group=pb.Resource(name="GM"), offset=0, batch_size=8,
        message_queue=pb.MessageQueue(topic=pb.Resource(name="PxMetrics"), id=0,
                                      broker=pb.Broker(name="broker-a")),
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
    )  # fmt: skip
    pulled = [r async for r in stub.PullMessage(pull, timeout=10)]
    code = pb.Code.Name(next(r.status.code for r in pulled if r.HasField("status")))
    assert env.proxy.ctx is not None
    sessions = env.proxy.ctx.sessions
    sessions.touch("prod-1").settings = pb.Settings(
        client_type=pb.PRODUCER, user_agent=pb.UA(language=pb.PYTHON, version="5.0.1")
    )
    sessions.touch("cons-1").settings = pb.Settings(
        client_type=pb.SIMPLE_CONSUMER, user_agent=pb.UA(language=pb.JAVA, version="5.0.7"),
        subscription=pb.Subscription(group=pb.Resource(name="GM")),
    )  # fmt: skip
    got = await asyncio.to_thread(scrape, env)
    assert find(got, "rocketmq_proxy_up", proxy_mode="cluster", **base) == 1
    rpc = {"protocol_type": "grpc", **base}
    assert find(got, "rocketmq_rpc_latency_count", request_code="SendMessage",
                response_code="OK", **rpc) == 2  # fmt: skip
    assert find(got, "rocketmq_rpc_latency_count", request_code="QueryRoute",
                response_code="TOPIC_NOT_FOUND", **rpc) == 1  # fmt: skip
    assert find(got, "rocketmq_rpc_latency_bucket", request_code="SendMessage",
                response_code="OK", le="+Inf", **rpc) == 2  # fmt: skip
    assert find(got, "rocketmq_rpc_latency_count", request_code="PullMessage",
                response_code=code, **rpc) == 1  # a streaming call, until its end  # fmt: skip
    # RocketMQ 5's label sets (lower-case language, the protocol, is_system of the group)
    assert find(got, "rocketmq_producer_connections", language="python", version="5.0.1",
                protocol_type="grpc") == 1  # fmt: skip
    assert find(got, "rocketmq_consumer_connections", consumer_group="GM", language="java",
                version="5.0.7", consume_mode="pop", protocol_type="grpc",
                is_system="false") == 1  # fmt: skip


def test_orbitmq_proxy_metrics_port_announces_its_endpoint(tmp_path: Path) -> None:
    """``orbitmq proxy --metrics-port 0``: the ready line names the endpoint, which serves
    rocketmq_proxy_up 1."""
    c = ProcessCluster(tmp_path)
    try:
        # No NameServer needed to serve: the proxy resolves routes on demand.
        proxy = c.proxy(["127.0.0.1:1"], "--metrics-port", "0", "--tls", "off")
        urls = [
            w.partition("=")[2] for w in proxy.ready_line.split() if w.startswith("proxy_metrics=")
        ]
        assert len(urls) == 1, proxy.ready_line
        text = urllib.request.urlopen(urls[0], timeout=10).read().decode()
        ups = [s for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "rocketmq_proxy_up"]  # fmt: skip
        assert [(s.labels["node_type"], s.value) for s in ups] == [("proxy", 1.0)]
    finally:
        c.stop_all()

"""The overview and topic pages show each broker's storage reserve time (age of the oldest
message it keeps) and its queued requests, from the broker's runtime info, through
Starlette's test client against a real broker."""

from __future__ import annotations

import asyncio
import re
import time

import pytest
from starlette.testclient import TestClient

from orbitmq.console.app import create_app
from orbitmq.console.config import ConsoleConfig
from orbitmq.console.views import broker_figures, fmt_age
from tests.console.conftest import TOPIC, Cluster, send

pytestmark = pytest.mark.timeout(60)


def test_figures_from_runtime_info() -> None:
    fig = broker_figures({"message_reserve_time_ms": 9_000_000, "processor_queued":
                          {"send": 3, "pull": 0, "admin": 1}})  # fmt: skip
    assert fig["reserve"] == "2.5 h" and fig["reserve_ms"] == 9_000_000
    assert fig["queued"] == 4 and fig["queued_detail"] == "send 3, admin 1"
    empty = broker_figures({})  # an older broker, or one that did not answer
    assert empty["reserve"] == "-" and empty["queued"] is None
    assert fmt_age(1500) == "1.5 s" and fmt_age(3 * 86_400_000) == "3.0 d"


async def test_overview_and_topic_pages_show_reserve_time_and_queues(cluster: Cluster) -> None:
    first_sent = int(time.time() * 1000)
    await send(cluster, 4)
    await asyncio.sleep(0.3)
    config = ConsoleConfig(
        namesrv_addrs=(cluster.namesrv,), port=0, audit_log=str(cluster.tmp / "audit.jsonl")
    )

    def run() -> None:
        with TestClient(create_app(config)) as web:
            for path in ("/", f"/topics/{TOPIC}"):
                page = web.get(path)
                assert page.status_code == 200, path
                seen = int(time.time() * 1000)
                m = re.search(r'data-reserve-ms="(\d+)">([^<]+)<', page.text)
                assert m, (path, page.text)
                # the age of the first message sent, not of the newest one
                assert 300 <= int(m.group(1)) <= seen - first_sent + 50, (path, m.group(1))
                assert m.group(2).endswith(" s") or m.group(2).endswith(" ms")
            overview = web.get("/").text
            # a count (the console's poller may have a request in flight; the exact figure
            # is tests/broker/test_rmq_broker_gauges.py's)
            assert re.search(r'data-queued="\d+">\d+<', overview), overview
            assert "Brokers of this topic" in web.get(f"/topics/{TOPIC}").text

    await asyncio.to_thread(run)

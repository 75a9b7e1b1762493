"""The console in a real headless Chromium (Debian's `chromium`, driven by Python Playwright
through `executable_path`; `make browser` installs it): live lag on a group page grows within
2 s after 1,000 sends with no consumer and returns to 0 within 2 s after the group catches up;
the chart follows; a write without the CSRF token is refused. Skipped, with the reason, where
Chromium or Playwright is absent."""

from __future__ import annotations

import asyncio
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from orbitmq.console.app import create_app
from orbitmq.console.config import ConsoleConfig
from tests.console.conftest import GROUP, Cluster, commit_all, send

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(
        CHROMIUM is None, reason="Debian's chromium is not installed (make browser)"
    ),
]
playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")


class Served:
    def __init__(self, config: ConsoleConfig) -> None:
        import uvicorn

        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.server = uvicorn.Server(
            uvicorn.Config(create_app(config), log_level="warning", lifespan="on")
        )
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)


def _browser() -> Iterator[Any]:
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=["--disable-gpu", "--no-first-run"]
        )
        try:
            yield browser
        finally:
            browser.close()


async def test_live_lag_chart_and_csrf_in_chromium(cluster: Cluster) -> None:
    await send(cluster, 4)
    await commit_all(cluster, 4)
    served = await asyncio.to_thread(
        Served,
        ConsoleConfig(
            namesrv_addrs=(cluster.namesrv,),
            audit_log=str(cluster.tmp / "a.jsonl"),
            poll_interval_ms=300,
        ),
    )
    loop = asyncio.get_running_loop()
    try:

        def run() -> tuple[float, float, int]:
            for browser in _browser():
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.goto(f"http://127.0.0.1:{served.port}/groups/{GROUP}")
                page.wait_for_function(
                    "document.getElementById('lag').textContent.trim() === '0'", timeout=10_000
                )
                asyncio.run_coroutine_threadsafe(send(cluster, 1000, prefix="burst"), loop).result(
                    120
                )
                start = time.monotonic()
                page.wait_for_function(
                    "parseInt(document.getElementById('lag').textContent) >= 1000", timeout=10_000
                )
                grow = time.monotonic() - start
                points = page.evaluate("window.lagChart.data[1].filter(v => v >= 1000).length")
                start = time.monotonic()
                asyncio.run_coroutine_threadsafe(commit_all(cluster, 1004), loop).result(30)
                page.wait_for_function(
                    "document.getElementById('lag').textContent.trim() === '0'", timeout=10_000
                )
                drain = time.monotonic() - start
                status = page.evaluate(
                    "fetch('/topics', {method: 'POST', body: new URLSearchParams({name: 'no-token'})}).then(r => r.status)"
                )
                assert status == 403
                token_status = page.evaluate(
                    "fetch('/topics', {method: 'POST', headers: {'X-CSRF-Token': document.querySelector('meta[name=csrf-token]').content}, body: new URLSearchParams({name: 'with-token', queues: '1'})}).then(r => r.status)"
                )
                assert token_status == 200
                return grow, drain, points
            raise AssertionError("no browser")

        grow, drain, points = await asyncio.to_thread(run)
        print(
            f"lag shown {grow:.2f} s after the sends finished; 0 shown {drain:.2f} s after the commit"
        )
        # the page follows the poller (300 ms here) and one SSE hop
        assert points >= 1
        assert grow <= 2.0 and drain <= 2.0
    finally:
        await asyncio.to_thread(served.stop)


async def test_dlq_resend_in_chromium(cluster: Cluster) -> None:
    """A message a group gave up on (0 retries) is on the DLQ page, found by its key (the
    page's key search); resent
    after the confirmation, a healthy group receives it (same keys, body and unique id); the
    resend is audited and the row then says it was resent before."""
    from orbitmq.client import AsyncSimpleConsumer, Message
    from orbitmq.client.consumer.config import SimpleConfig
    from orbitmq.client.consumer_types import ConsumeFromWhere
    from orbitmq.protocol.group_config import SubscriptionGroupConfig

    ns = [cluster.namesrv]
    await cluster.admin.update_group_config(
        SubscriptionGroupConfig(group_name="failing", retry_max_times=0)
    )

    def simple(group: str, where: ConsumeFromWhere) -> AsyncSimpleConsumer:
        cfg = SimpleConfig(await_duration_s=0.5, consume_from_where=where)
        return AsyncSimpleConsumer(ns, group, cfg, subscriptions={"orders": "*"})

    failing = simple("failing", ConsumeFromWhere.FIRST_OFFSET)
    healthy = simple("healthy", ConsumeFromWhere.LAST_OFFSET)
    served = None
    try:
        await healthy.start()
        await healthy.receive(16, 15.0)  # positions the new group at the end
        sent = await cluster.producer.send(Message("orders", b"poison", keys=["dead-key"]))
        first: list[Any] = []
        deadline = time.monotonic() + 10
        while not first and time.monotonic() < deadline:  # the healthy group takes it at once
            first = await healthy.receive(4, 15.0)
        assert [m.message.msg_id for m in first] == [sent.msg_id]
        await healthy.ack(first[0])
        await failing.start()
        got: list[Any] = []
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            got = await failing.receive(4, 1.0)  # never acked: dead-lettered when it expires
        assert [m.message.msg_id for m in got] == [sent.msg_id]
        for _ in range(100):  # bounded: 1 s invisible + a revive turn
            if await cluster.admin.dlq_messages("failing"):
                break
            await asyncio.sleep(0.1)
        audit = cluster.tmp / "dlq-audit.jsonl"
        served = await asyncio.to_thread(
            Served, ConsoleConfig(namesrv_addrs=(cluster.namesrv,), audit_log=str(audit))
        )
        port = served.port

        def run() -> tuple[str, bool]:
            for browser in _browser():
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.on("dialog", lambda d: d.accept())  # the confirmation
                page.goto(f"http://127.0.0.1:{port}/dlq")
                page.fill("input[name=group]", "failing")  # found by its key
                page.fill("input[name=key]", "dead-key")
                page.click("form[action='/dlq'] button")
                page.wait_for_url("**key=dead-key**", timeout=10_000)
                assert page.locator("tr.dead").count() == 1
                row = page.locator("tr.dead", has_text="dead-key")
                row.locator("input[name=pick]").check()
                page.click("#resend")
                page.wait_for_url("**result=resent+1+of+1**", timeout=10_000)
                again = page.locator("tr.dead", has_text="dead-key").inner_text()
                return again, "resent before" in again
            raise AssertionError("no browser")

        text, marked = await asyncio.to_thread(run)
        assert marked, text
        received: list[Any] = []
        deadline = time.monotonic() + 5
        while not received and time.monotonic() < deadline:
            received = await healthy.receive(4, 15.0)
        assert [m.message.msg_id for m in received] == [sent.msg_id]
        assert received[0].message.body == b"poison" and received[0].message.keys == ["dead-key"]
        assert "dlq_resend" in audit.read_text() and sent.msg_id in audit.read_text()
    finally:
        await failing.close()
        await healthy.close()
        if served is not None:
            await asyncio.to_thread(served.stop)

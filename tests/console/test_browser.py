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

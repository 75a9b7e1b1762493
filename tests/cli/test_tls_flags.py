"""`orbitmq --tls-ca ...` reaches a TLS-only cluster; without the flags, or with only the
system roots (the client verifies by default), it is refused."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orbitmq.broker.controller import BrokerController
from orbitmq.cli.main import app
from orbitmq.namesrv.config import NamesrvConfig
from orbitmq.namesrv.controller import NamesrvController
from orbitmq.net.client import set_default_ssl_context
from orbitmq.testing import small_broker_config
from tests.net.pki import Ca


@pytest.fixture
def tls_cluster(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A TLS-required NameServer and broker on a loop of their own thread: (address, CA)."""
    ca = Ca.make(tmp_path)
    cert, key = ca.issue(tmp_path, "localhost", ip="127.0.0.1")
    tls = {"tls_mode": "required", "tls_cert_file": str(cert), "tls_key_file": str(key)}
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    ns = NamesrvController(NamesrvConfig(port=0, **tls))  # type: ignore[arg-type]

    async def start() -> BrokerController:
        await ns.start()
        broker = BrokerController(
            small_broker_config(
                tmp_path / "store",
                namesrv_addrs=(ns.address,),
                tls_outbound=True,
                tls_ca_file=str(ca.file),
                **tls,
            )
        )
        await broker.start()
        for _ in range(100):
            if ns.routes.broker_count:
                break
            await asyncio.sleep(0.05)
        return broker

    broker = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    try:
        yield ns.address, ca.file
    finally:
        set_default_ssl_context(None)

        async def stop() -> None:
            await broker.stop()
            await ns.stop()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_cli_tls_flags(tls_cluster: tuple[str, Path]) -> None:
    addr, ca = tls_cluster
    runner = CliRunner(env={"COLUMNS": "250"})
    ok = runner.invoke(app, ["--tls-ca", str(ca), "cluster", "list", "-n", addr])
    assert ok.exit_code == 0, ok.output
    assert "broker-a" in ok.output  # the broker's own stats came over TLS too
    set_default_ssl_context(None)
    plain = runner.invoke(app, ["cluster", "list", "-n", addr])
    assert plain.exit_code == 1
    unverified = runner.invoke(app, ["--tls", "cluster", "list", "-n", addr])
    assert unverified.exit_code == 1
    assert "CERTIFICATE_VERIFY_FAILED" in unverified.output

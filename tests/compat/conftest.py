"""A real OrbitMQ (NameServer, broker, gRPC proxy: three processes on 127.0.0.1, free ports,
data in the module's temporary folder) and a way to run the official RocketMQ 5 Python client
against it in a subprocess (see ``client_driver.py`` for the scenario format).

Each client run gets its own HOME inside the temporary folder: the client writes its log to
``$HOME/logs/rocketmq_python/rocketmq_client.log``, and nothing lands outside the test's folder.
When a run fails, that log, the driver's stderr and the proxy's log are shown.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from orbitmq.client import BlockingAdminClient
from orbitmq.protocol.group_config import SubscriptionGroupConfig
from tests.harness import ProcessCluster, ServerProcess

DRIVER = Path(__file__).with_name("client_driver.py")
CLIENT_LOG = Path("logs", "rocketmq_python", "rocketmq_client.log")
RUN_TIMEOUT_S = 60.0

TX_TIMEOUT_MS = 1000
TX_CHECK_INTERVAL_MS = 300
"""Short transaction check-back timings for the tests' broker (defaults: 6 s and 30 s)."""


class ClientRunFailed(AssertionError):
    pass


@dataclass
class Orbit:
    """The running OrbitMQ of a test module."""

    base: Path
    cluster: ProcessCluster
    namesrv: str
    broker: ServerProcess
    proxy: ServerProcess
    admin: BlockingAdminClient
    runs: int = 0
    extra_proxies: list[ServerProcess] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return self.proxy.address

    def topic(self, name: str, message_type: str = "NORMAL", queues: int = 4) -> str:
        """Create a topic of a message type (the proxy advertises it as the queues' accepted
        type) and wait until the NameServer routes it."""
        self.admin.create_topic(
            name, read_queue_nums=queues, write_queue_nums=queues, message_type=message_type
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                route = self.admin.topic_route(name)
                if route.queue_datas:
                    return name
            except Exception:  # noqa: BLE001 - not routed yet
                pass
            time.sleep(0.1)
        raise AssertionError(f"topic {name} is not routed")

    def group_config(self, group: str, **fields: Any) -> None:
        self.admin.update_group_config(SubscriptionGroupConfig(group_name=group, **fields))

    def run(
        self,
        steps: list[dict[str, Any]],
        *,
        endpoint: str | None = None,
        ak: str = "",
        sk: str = "",
        timeout: float = RUN_TIMEOUT_S,
        allow_failure: bool = False,
    ) -> dict[str, Any]:
        """Run a scenario with the official client; returns the driver's output. Fails the test
        with the client's log when the driver failed (unless ``allow_failure``)."""
        running = self.start_run(steps, endpoint=endpoint, ak=ak, sk=sk)
        return running.finish(timeout, allow_failure=allow_failure)

    def start_run(
        self,
        steps: list[dict[str, Any]],
        *,
        endpoint: str | None = None,
        ak: str = "",
        sk: str = "",
    ) -> ClientRun:
        """Start a scenario and return at once (a test can crash servers meanwhile); the
        caller must :meth:`ClientRun.finish` it."""
        self.runs += 1
        home = self.base / f"client-home-{self.runs}"
        home.mkdir()
        scenario = {"endpoint": endpoint or self.endpoint, "ak": ak, "sk": sk, "steps": steps}
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "COV_"))}
        env.update(HOME=str(home), PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
        path = home / "scenario.json"
        path.write_text(json.dumps(scenario))
        with path.open("rb") as stdin:
            proc = subprocess.Popen(
                [sys.executable, str(DRIVER)],
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=home,
                env=env,
            )
        return ClientRun(self, proc, home, steps)

    def diagnostics(self, home: Path, stderr: bytes | None) -> str:
        log = home / CLIENT_LOG
        client_log = log.read_text(errors="replace")[-6000:] if log.exists() else "(no log)"
        proxy_log = self.proxy.log()[-4000:]
        return (
            f"--- client stderr ---\n{(stderr or b'').decode(errors='replace')[-3000:]}\n"
            f"--- client log ({CLIENT_LOG}) ---\n{client_log}\n"
            f"--- proxy log ---\n{proxy_log}"
        )

    def start_proxy(self, *args: str) -> ServerProcess:
        """Another proxy process in front of the same cluster (the proxy is stateless)."""
        proc = _proxy(self.cluster, self.namesrv, list(args))
        self.extra_proxies.append(proc)
        return proc


@dataclass
class ClientRun:
    """A scenario running in its own process (see :meth:`Orbit.start_run`)."""

    orbit: Orbit
    proc: subprocess.Popen[bytes]
    home: Path
    steps: list[dict[str, Any]]

    def finish(
        self, timeout: float = RUN_TIMEOUT_S, *, allow_failure: bool = False
    ) -> dict[str, Any]:
        try:
            stdout, stderr = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, stderr = self.proc.communicate()
            raise ClientRunFailed(
                f"official client run took over {timeout} s\n"
                + self.orbit.diagnostics(self.home, stderr)
            ) from None
        lines = stdout.decode(errors="replace").strip().splitlines()
        try:
            out: dict[str, Any] = json.loads(lines[-1])
        except (IndexError, json.JSONDecodeError):
            raise ClientRunFailed(
                f"driver exited {self.proc.returncode} without results\n"
                + self.orbit.diagnostics(self.home, stderr)
            ) from None
        out["home"] = str(self.home)
        out["client_log"] = self.home / CLIENT_LOG
        if "failed" in out and not allow_failure:
            step = self.steps[out["failed"]]
            raise ClientRunFailed(
                f"step {out['failed']} {step} failed: {out['error']}\n{out.get('traceback', '')}\n"
                + self.orbit.diagnostics(self.home, stderr)
            )
        return out


def _proxy(
    cluster: ProcessCluster, namesrv: str, extra: list[str], *, start: bool = True
) -> ServerProcess:
    return cluster.proxy([namesrv], *extra, start=start)


@contextlib.contextmanager
def running_orbit(base: Path) -> Iterator[Orbit]:
    """NameServer, broker and proxy as three processes in ``base``, stopped at the end."""
    cluster = ProcessCluster(base)
    admin: BlockingAdminClient | None = None
    try:
        ns = cluster.namesrv()
        # Short check-back timings (the check-back test would otherwise wait 6 s plus up to
        # 30 s) and topic message types enforced.
        checks = {
            "transaction_timeout_ms": TX_TIMEOUT_MS,
            "transaction_check_interval_ms": TX_CHECK_INTERVAL_MS,
            "enforce_topic_message_type": True,
        }
        broker = cluster.broker(
            "broker-a", [ns.address], store=base / "broker-a", settings={"broker": checks},
            start=False,
        )  # fmt: skip
        proxy = _proxy(cluster, ns.address, [], start=False)
        cluster.start_all([broker, proxy])  # the proxy needs only the NameServer to start
        admin = BlockingAdminClient(ns.address)
        yield Orbit(base, cluster, ns.address, broker, proxy, admin)
    finally:
        if admin is not None:
            admin.close()
        cluster.stop_all()


def need_official_client() -> None:
    if importlib.util.find_spec("rocketmq") is None:  # found, not imported: see the docstring
        pytest.skip("the official client (rocketmq-python-client, dev extra) is not installed")


@pytest.fixture(scope="module")
def orbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Orbit]:
    need_official_client()
    with running_orbit(tmp_path_factory.mktemp("compat")) as orbit:
        yield orbit


_names = itertools.count(1)


def unique(prefix: str) -> str:
    """A name not used before in this session (each test has its own topics and groups)."""
    return f"{prefix}{next(_names)}"

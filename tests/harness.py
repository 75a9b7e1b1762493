"""Real server processes for integration and crash tests: :class:`ProcessCluster`.

Each server runs the documented way, ``python -m orbitmq <role> --port 0 ...`` on 127.0.0.1; a
broker reads a TOML file (``--config``, written next to its log) with its settings and a small
store (:data:`orbitmq.testing.SMALL_STORE` shapes, the sizes below). It announces
``orbitmq <role> ready <role>=<host:port> ...`` on stdout and is stopped by PID (SIGTERM, then
SIGKILL) when the test ends, whether it passed or not. Logs go to a file in the test's temp
folder and are printed when a server fails to start.

It stays with the tests rather than in :mod:`orbitmq.testing`: it runs the repository's own
child programs (``child``), from the repository folder, and reads pipes with ``select`` (POSIX
only); a library user wants the in-process :func:`orbitmq.testing.run_broker` instead.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from orbitmq.testing import settings_toml

REPO = Path(__file__).resolve().parents[1]

PROCESS_STORE: Mapping[str, Any] = {
    "mapped_file_size_commit_log": 64 * 1024 * 1024,
    "max_hash_slot_num": 4096,
    "max_index_num": 65536,
    "consume_queue_entries_per_file": 16384,
}
"""A process broker's store files: tests make hundreds of queues, so small files (RocketMQ's
sizes take 400 MiB for the first IndexFile and 6 MiB per queue); same code paths."""

_SETTINGS_ENV = ("ORBITMQ_CONFIG", "ORBITMQ_NAMESRV_", "ORBITMQ_BROKER_", "ORBITMQ_STORE_",
                 "ORBITMQ_PROXY_", "ORBITMQ_MQTT_")  # fmt: skip
"""Settings a server would read from the test run's own environment: not passed on."""


def _ready_address(rest: str) -> str:
    """What a ready line names: the first ``key=value``'s value, or its first word."""
    first = rest.split()[0] if rest.split() else ""
    return first.partition("=")[2] if "=" in first else first


class ServerProcess:
    def __init__(
        self, role: str, args: list[str], log_path: Path, *, module: str | None = None
    ) -> None:
        self.role = role
        self.args = args
        self.log_path = log_path
        self.module = module or "orbitmq"
        """What runs as ``python -m``; it prints ``orbitmq <role> ready <address> ...``."""
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""
        self.ready_line = ""
        """The whole ``orbitmq <role> ready ...`` line (every ``key=value`` it announced)."""

    def start(self, timeout: float = 30.0) -> ServerProcess:
        self.launch()
        return self.wait_ready(timeout)

    def launch(self) -> ServerProcess:
        """Start the process without waiting for it (see :meth:`wait_ready` and start_all)."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        env = {k: v for k, v in os.environ.items() if not k.startswith(_SETTINGS_ENV)}
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module, *self.args],
            stdout=subprocess.PIPE,
            stderr=log,
            cwd=REPO,
            env=env,
        )
        log.close()
        return self

    def wait_ready(self, timeout: float = 30.0) -> ServerProcess:
        """Wait for the ready line of a launched process; stop it and raise if none comes."""
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        prefix = f"orbitmq {self.role} ready "
        fd = self.proc.stdout.fileno()  # raw reads with select: the timeout holds even if the
        pending = b""  # child hangs silently (a blocking readline would wait forever)
        while (remaining := deadline - time.monotonic()) > 0:
            if not select.select([fd], [], [], remaining)[0]:
                break
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            *lines, pending = (pending + chunk).split(b"\n")
            for raw in lines:
                line = raw.decode(errors="replace")
                if line.startswith(prefix):
                    self.address = _ready_address(line[len(prefix) :])
                    self.ready_line = line
                    return self
        self.stop()
        raise RuntimeError(
            f"{self.role} did not start; log:\n{self.log_path.read_text(errors='replace')[-4000:]}"
        )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def restart(self, timeout: float = 30.0) -> ServerProcess:
        """Start the stopped (or killed) server again with the same arguments, on the port it
        had (its store, for a broker, is the same folder), so clients keep its address."""
        assert not self.running, "stop or kill it first"
        if self.address and "--port" in self.args:
            at = self.args.index("--port") + 1
            self.args[at] = self.address.rpartition(":")[2]
        return self.start(timeout)

    def kill(self) -> None:
        """SIGKILL: no cleanup, as a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (a clean shutdown), SIGKILL if it does not exit in time."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


class ProcessCluster:
    """Starts NameServers, Brokers and proxies as processes and stops every one of them at the
    end (the in-process fakes of tests/client are ``FakeCluster``)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.procs: list[ServerProcess] = []

    def namesrv(self, *, start: bool = True) -> ServerProcess:
        """A NameServer on a free port (``start=False``: not started yet, see start_all)."""
        n = sum(p.role == "namesrv" for p in self.procs)
        proc = ServerProcess(
            "namesrv",
            ["namesrv", "--host", "127.0.0.1", "--port", "0"],
            self.base / f"namesrv{n}.log",
        )
        self.procs.append(proc)
        return proc.start() if start else proc

    def broker(
        self,
        name: str,
        namesrvs: list[str],
        *,
        flush: str = "ASYNC_FLUSH",
        store: Path | None = None,
        port: int = 0,
        settings: Mapping[str, Mapping[str, Any]] | None = None,
        start: bool = True,
    ) -> ServerProcess:
        """``python -m orbitmq broker --config <name>.toml --port N``: topics created on first
        use, a registration every second, a small store; ``settings`` adds to or overrides the
        file's tables (``{"broker": {"transaction_timeout_ms": 400}}``)."""
        tables: dict[str, dict[str, Any]] = {
            "broker": {
                "broker_name": name,
                "host": "127.0.0.1",
                "namesrv_addrs": list(namesrvs),
                "auto_create_topic": True,
                "register_interval_s": 1.0,
            },
            "store": {
                "store_path": str(store or self.base / name),
                "flush_disk_type": flush,
                **PROCESS_STORE,
            },
            # no MQTT listener unless a test asks (a restart with a fixed broker port would
            # otherwise try the default 1883)
            "mqtt": {"port": 0},
        }
        for table, values in (settings or {}).items():
            tables.setdefault(table, {}).update(values)
        config = self.base / f"{name}.toml"
        config.write_text(settings_toml(tables))
        args = ["broker", "--config", str(config), "--port", str(port)]
        proc = ServerProcess("broker", args, self.base / f"{name}.log")
        self.procs.append(proc)
        return proc.start() if start else proc

    def proxy(
        self, namesrvs: list[str], *args: str, name: str | None = None, start: bool = True
    ) -> ServerProcess:
        """``python -m orbitmq proxy --namesrv ... --port 0 <args>`` (cluster mode)."""
        n = sum(p.role == "proxy" for p in self.procs)
        argv = ["proxy", "--namesrv", ";".join(namesrvs), "--host", "127.0.0.1", "--port", "0"]
        proc = ServerProcess("proxy", [*argv, *args], self.base / f"{name or f'proxy{n}'}.log")
        self.procs.append(proc)
        return proc.start() if start else proc

    def child(
        self,
        role: str,
        module: str,
        args: list[str],
        *,
        name: str | None = None,
        start: bool = True,
    ) -> ServerProcess:
        """Any other program run as ``python -m <module> <args>`` (a test's consumer, say)
        that prints ``orbitmq <role> ready <id>``; stopped with the servers, before them.
        Its ``address`` is whatever its ready line names (a consumer's client id)."""
        n = sum(p.role == role for p in self.procs)
        log = self.base / f"{name or f'{role}{n}'}.log"
        proc = ServerProcess(role, list(args), log, module=module)
        self.procs.append(proc)
        return proc.start() if start else proc

    def start_all(self, procs: list[ServerProcess], timeout: float = 30.0) -> list[ServerProcess]:
        """Launch several servers at once (made with ``start=False``), then wait for each."""
        for proc in procs:
            proc.launch()
        for proc in procs:
            proc.wait_ready(timeout)
        return procs

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            with contextlib.suppress(Exception):
                proc.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ProcessCluster]:
    c = ProcessCluster(tmp_path)
    try:
        yield c
    finally:
        c.stop_all()

"""Real server processes for integration and crash tests.

Each server runs as ``python -m orbitmq.<role> --port 0 ...`` on 127.0.0.1, announces
``orbitmq <role> ready <host:port>`` on stdout, and is stopped by PID (SIGTERM, then SIGKILL)
when the test ends, whether it passed or not. Logs go to a file in the test's temp folder and
are printed when a server fails to start.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


SMALL_FILES = [
    "--store-option", "max_hash_slot_num=4096", "--store-option", "max_index_num=65536",
    "--store-option", "consume_queue_entries_per_file=16384",
]  # fmt: skip
"""Store files are preallocated; at RocketMQ's sizes one broker takes 400 MiB for its first
IndexFile and 6 MiB per queue. Tests make hundreds of queues: small files, same code paths."""


class ServerProcess:
    def __init__(
        self, role: str, args: list[str], log_path: Path, *, module: str | None = None
    ) -> None:
        self.role = role
        self.args = args
        self.log_path = log_path
        self.module = module or f"orbitmq.{role}"
        """What runs as ``python -m``; it prints ``orbitmq <role> ready <address>``."""
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""

    def start(self, timeout: float = 30.0) -> ServerProcess:
        self.launch()
        return self.wait_ready(timeout)

    def launch(self) -> ServerProcess:
        """Start the process without waiting for it (see :meth:`wait_ready` and start_all)."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        env = dict(os.environ, PYTHONUNBUFFERED="1")
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
                    self.address = line[len(prefix) :].split()[0]
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


class Cluster:
    """Starts NameServers and Brokers and stops every one of them at the end."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.procs: list[ServerProcess] = []

    def namesrv(self, *, start: bool = True) -> ServerProcess:
        """A NameServer on a free port (``start=False``: not started yet, see start_all)."""
        n = sum(p.role == "namesrv" for p in self.procs)
        proc = ServerProcess(
            "namesrv", ["--host", "127.0.0.1", "--port", "0"], self.base / f"namesrv{n}.log"
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
        extra: list[str] | None = None,
        start: bool = True,
    ) -> ServerProcess:
        args = [
            "--host", "127.0.0.1", "--port", str(port), "--name", name,
            "--namesrv", ";".join(namesrvs), "--store-path", str(store or self.base / name),
            "--flush", flush, "--auto-create-topic", "--register-interval", "1",
            "--segment-bytes", str(64 * 1024 * 1024), *SMALL_FILES, *(extra or []),
        ]  # fmt: skip
        proc = ServerProcess("broker", args, self.base / f"{name}.log")
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
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop_all()

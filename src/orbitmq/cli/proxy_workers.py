"""``orbitmq proxy --workers N``: N proxy processes sharing one port through SO_REUSEPORT.

Python's gRPC serves calls on one core per process (one event loop, one GIL); a stateless
proxy scales by process. This supervisor starts N ordinary ``orbitmq proxy`` processes with the
same options, ``--port P --workers 1`` and ``ORBITMQ_PROXY_REUSE_PORT=true``, so each one's gRPC
server (and TLS front) binds ``P`` with SO_REUSEPORT and the kernel spreads client connections
over them (connections, not calls: one client channel stays on one process). With port 0 it
first takes a free port on a bound, never listening, SO_REUSEPORT socket that it holds until
every worker listens. The supervisor itself imports no gRPC (the workers are separate
executables, not forks, so nothing of gRPC's runtime crosses a fork). It prints its ready line
once every worker is ready, forwards SIGINT/SIGTERM to the workers and waits for them; when a
worker dies, it stops the others and exits 1.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

from orbitmq.cli.runner import parse_ready_line

__all__ = ["READY_TIMEOUT_S", "run_workers"]

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


def _hold_free_port(host: str) -> tuple[socket.socket, int]:
    """A free port on ``host``, held by a bound SO_REUSEPORT socket that never listens."""
    bare = host.strip("[]") or "0.0.0.0"
    family = socket.AF_INET6 if ":" in bare else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((bare, 0))
    return sock, int(sock.getsockname()[1])


def _ready(proc: subprocess.Popen[bytes], deadline: float) -> dict[str, str] | None:
    """The endpoints of ``proc``'s ready line, None if it exits or stays silent."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    pending = b""
    while (left := deadline - time.monotonic()) > 0:
        if not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 4096)
        if not chunk:
            return None
        *lines, pending = (pending + chunk).split(b"\n")
        for raw in lines:
            found = parse_ready_line(raw.decode(errors="replace"), "proxy")
            if found is not None:
                return found
    return None


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def run_workers(
    worker_args: list[str],
    host: str,
    port: int,
    workers: int,
    announce: Callable[[dict[str, str]], None],
) -> int:
    """Run ``workers`` proxies (``orbitmq proxy *worker_args``) on ``host:port`` until a signal;
    the exit status (0 after a signal, 1 when a worker failed or did not start)."""
    held: socket.socket | None = None
    if port == 0:
        held, port = _hold_free_port(host)
    env = dict(os.environ, ORBITMQ_PROXY_REUSE_PORT="true", PYTHONUNBUFFERED="1")
    argv = [sys.executable, "-m", "orbitmq", "proxy", *worker_args]
    argv += ["--port", str(port), "--workers", "1"]  # the last occurrence of an option wins
    procs: list[subprocess.Popen[bytes]] = []
    stopping: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        stopping.append(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        for _ in range(workers):
            # One by one: those started before a failing Popen are still stopped below.
            procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, env=env))  # noqa: PERF401
        endpoints: dict[str, str] = {}
        for i, proc in enumerate(procs):
            found = _ready(proc, deadline)
            if found is None or stopping:
                if not stopping:
                    print(f"error: proxy worker {i} did not start", file=sys.stderr)
                return 0 if stopping else 1
            endpoints = found
        if held is not None:
            held.close()
            held = None
        endpoints["workers"] = str(workers)
        endpoints["pids"] = ",".join(str(p.pid) for p in procs)
        announce(endpoints)
        while not stopping:
            if any(p.poll() is not None for p in procs):
                dead = [p.pid for p in procs if p.poll() is not None]
                print(f"error: proxy worker(s) {dead} exited; stopping", file=sys.stderr)
                return 1
            time.sleep(0.2)
        return 0
    finally:
        _stop(procs)
        if held is not None:
            held.close()
        for s, handler in previous.items():
            signal.signal(s, handler)

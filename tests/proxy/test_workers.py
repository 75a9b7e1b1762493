"""``orbitmq proxy --workers N``: N processes on one port (SO_REUSEPORT), one ready line, all
stopped by a signal to the supervisor."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time

import pytest

from orbitmq.cli.runner import parse_ready_line

pytestmark = [pytest.mark.integration]


def _ready_line(proc: subprocess.Popen[bytes], timeout: float = 60.0) -> dict[str, str]:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not select.select([proc.stdout], [], [], deadline - time.monotonic())[0]:
            break
        line = proc.stdout.readline().decode()
        if not line:
            break
        found = parse_ready_line(line.strip(), "proxy")
        if found is not None:
            return found
    raise AssertionError("no ready line")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_workers_share_one_port_and_stop_together() -> None:
    # TLS permissive: the TLS front shares the port too (plain gRPC: tests/bench/test_bench_proxy).
    tls = "permissive"
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "orbitmq", "proxy", "--namesrv", "127.0.0.1:9",
            "--host", "127.0.0.1", "--port", "0", "--tls", tls, "--workers", "2",
            "--log-level", "WARNING",
        ],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    pids: list[int] = []
    try:
        ready = _ready_line(proc)
        assert ready["workers"] == "2"
        pids = [int(p) for p in ready["pids"].split(",")]
        assert len(set(pids)) == 2 and all(_alive(p) for p in pids)
        host, _, port = ready["proxy"].rpartition(":")
        owners = set()
        for pid in pids:  # each worker holds a listening socket on the same port
            inodes = {
                os.readlink(f"/proc/{pid}/fd/{fd}")
                for fd in os.listdir(f"/proc/{pid}/fd")
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
            }
            listening = _listening_inodes(int(port))
            if inodes & listening:
                owners.add(pid)
        assert owners == set(pids)
        with socket.create_connection((host, int(port)), timeout=5):
            pass
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in pids)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if proc.stdout is not None:
            proc.stdout.close()


def _listening_inodes(port: int) -> set[str]:
    """``socket:[inode]`` of every TCP socket listening on ``port`` (Linux /proc/net/tcp)."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.rpartition(":")[2], 16) == port:
                out.add(f"socket:[{inode}]")
    return out

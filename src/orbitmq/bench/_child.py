"""A server process a benchmark starts for itself: launched, awaited, measured, stopped by pid.

The benchmarks that bring their own NameServer/broker (``bench consume``, ``bench e2e``,
``bench timer``) run it as a child on 127.0.0.1 with free ports, read its
``orbitmq <role> ready ...`` line from stdout, and stop it with SIGTERM (then SIGKILL) when
they end, whatever happened.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from orbitmq.common.errors import ClientError

READY_TIMEOUT_S = 60.0


class ServerChild:
    def __init__(self, args: list[str], log_path: Path, ready_prefix: str) -> None:
        self.args = args
        self.log_path = log_path
        self.ready_prefix = ready_prefix
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = READY_TIMEOUT_S) -> str:
        """Launch ``python -m <args>`` and return the rest of its ready line."""
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", *self.args],
                stdout=subprocess.PIPE,
                stderr=log,
                env=dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200"),
            )
        line = self._wait_line(timeout)
        if line is None:
            self.stop()
            raise ClientError(
                f"the benchmark's {self.args[0]} did not start; its log:\n"
                + self.log_path.read_text(errors="replace")[-2000:]
            )
        return line

    def _wait_line(self, timeout: float) -> str | None:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        pending = b""
        while (remaining := deadline - time.monotonic()) > 0:
            if not select.select([fd], [], [], remaining)[0]:
                break
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            *lines, pending = (pending + chunk).split(b"\n")
            for raw in lines:
                text = raw.decode(errors="replace")
                if text.startswith(self.ready_prefix):
                    return text[len(self.ready_prefix) :]
        return None

    def memory_mb(self) -> dict[str, float]:
        """VmRSS / RssAnon / RssFile of the process, in MB."""
        assert self.proc is not None
        out: dict[str, float] = {}
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "RssAnon", "RssFile"):
                out[name] = int(rest.split()[0]) / 1024
        return out

    def stop(self, timeout: float = 60.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def process_cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of a running process (Linux /proc), None if unknown."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

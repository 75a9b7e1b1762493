"""Fixtures of the crash tests: the seed, the iteration count, and child processes.

Every child is started through the ``spawn`` fixture, which SIGKILLs (by PID) and reaps whatever
is still running at teardown, also when the test failed half-way.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

from tests.crash.appender import SEGMENT_SIZE

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_ITERATIONS = 30
NEAR_ROLL = 96 * 1024  # an ACK ending this close to a segment end (or start) means "rolling"


@dataclass(frozen=True, slots=True)
class Ack:
    """One acknowledged batch, as the child reported it."""

    thread: int
    seq: int
    topic: str
    queue_id: int
    first_queue_offset: int
    count: int
    end_offset: int


class Child:
    """One ``tests.crash.appender`` process; a reader thread parses its stdout as it comes."""

    def __init__(self, stderr_path: Path) -> None:
        """Start a child in standby: it imports everything, then waits for :meth:`go`."""
        self.args: list[str] = []
        self.stderr_path = stderr_path
        self._stderr: IO[bytes] = open(stderr_path, "wb")  # noqa: SIM115 - closed in reap()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.crash.appender", "--standby"],
                cwd=REPO_ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
            )
        except BaseException:
            self._stderr.close()
            raise
        self.started = time.monotonic()
        self.opening = threading.Event()
        self.ready = threading.Event()
        self.near_roll = threading.Event()
        self.closing = threading.Event()
        self.closed = threading.Event()
        self.eof = threading.Event()
        self.acks: list[Ack] = []
        self.ready_report: dict[str, Any] | None = None
        self.ready_after_s = -1.0  # from go() to READY
        self.open_s = -1.0  # from OPENING to READY: how long MessageStore.open() took
        self.errors: list[str] = []
        self.bad_lines: list[bytes] = []
        self._reaped = False
        self._opening_at = 0.0
        self._reader = threading.Thread(target=self._read, name="crash-child-reader", daemon=True)
        self._reader.start()

    def go(self, args: list[str]) -> None:
        """Hand the standby child its arguments: from here on it opens the store."""
        assert self.proc.stdin is not None
        self.args = args
        self.started = time.monotonic()
        self.proc.stdin.write((json.dumps(args) + "\n").encode())
        self.proc.stdin.close()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        out = self.proc.stdout
        assert out is not None
        try:
            for raw in out:
                if not raw.endswith(b"\n"):
                    self.bad_lines.append(raw)  # a torn line: writes are atomic, so never
                    continue
                self._parse(raw.decode().rstrip("\n"))
        finally:
            self.eof.set()

    def _parse(self, line: str) -> None:
        kind, _, rest = line.partition(" ")
        if kind == "ACK":
            t, s, topic, q, first, count, end = rest.split(" ")
            ack = Ack(int(t), int(s), topic, int(q), int(first), int(count), int(end))
            self.acks.append(ack)
            into = ack.end_offset % SEGMENT_SIZE
            if into > SEGMENT_SIZE - NEAR_ROLL or into < NEAR_ROLL // 4:
                self.near_roll.set()
        elif kind == "OPENING":
            self._opening_at = time.monotonic()
            self.opening.set()
        elif kind == "READY":
            self.ready_report = json.loads(rest)
            self.ready_after_s = time.monotonic() - self.started
            self.open_s = time.monotonic() - self._opening_at
            self.ready.set()
        elif kind == "CLOSING":
            self.closing.set()
        elif kind == "CLOSED":
            self.closed.set()
        elif kind == "ERROR":
            self.errors.append(rest)
        else:
            self.bad_lines.append(line.encode())

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """Wait for ``event``; False at once if the child's output ends first."""
        deadline = time.monotonic() + timeout
        while not event.is_set():
            if self.eof.is_set() or time.monotonic() > deadline:
                return event.is_set()
            event.wait(0.005)
        return True

    def kill(self) -> bool:
        """SIGKILL the child by PID and reap it. Returns whether it was still running."""
        alive = self.proc.poll() is None
        if alive:
            self.proc.kill()  # SIGKILL to self.proc.pid, no one else
        self.reap()
        return alive

    def reap(self) -> None:
        if self._reaped:
            return
        try:
            self.proc.wait(timeout=30)
        finally:
            self._reader.join(timeout=30)
            if self.proc.stdin is not None and not self.proc.stdin.closed:
                self.proc.stdin.close()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self._stderr.close()
            self._reaped = True

    def stderr_tail(self, limit: int = 3000) -> str:
        try:
            text = self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""
        return text[-limit:]

    def describe(self) -> str:
        return (
            f"child pid {self.pid} args {self.args} rc {self.proc.returncode} "
            f"errors {self.errors} bad lines {self.bad_lines[:3]}\n"
            f"stderr tail:\n{self.stderr_tail()}"
        )


Spawn = Callable[..., Child]


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawn]:
    """``spawn(store_dir, mode, seed, round_no, **flags)`` starts an appender child.

    One child is always kept warm in standby (Python and numpy imported), so starting the next
    one overlaps the parent's checks of the last. Every child, used or not, is SIGKILLed by PID
    and reaped at teardown.
    """
    children: list[Child] = []

    def warm() -> Child:
        child = Child(tmp_path / f"child-{len(children)}.stderr")
        children.append(child)
        return child

    standby: list[Child] = [warm()]

    def start(
        store: Path,
        mode: str,
        seed: int,
        round_no: int,
        *,
        threads: int = 4,
        checkpoint_ms: int = 100,
        no_append: bool = False,
        close_after: float | None = None,
    ) -> Child:
        args = [
            "--store", str(store), "--mode", mode, "--seed", str(seed), "--round", str(round_no),
            "--threads", str(threads), "--checkpoint-ms", str(checkpoint_ms),
        ]  # fmt: skip
        if no_append:
            args.append("--no-append")
        if close_after is not None:
            args += ["--close-after", str(close_after)]
        child = standby.pop()
        child.go(args)
        standby.append(warm())
        return child

    try:
        yield start
    finally:
        failures: list[BaseException] = []
        for child in children:
            try:
                child.kill()
            except BaseException as exc:  # noqa: BLE001 - kill the others first, then raise
                failures.append(exc)
        if failures:
            raise failures[0]


@pytest.fixture
def crash_seed() -> int:
    """ORBITMQ_SEED replays a run; otherwise a fresh seed, printed for the failure report."""
    env = os.environ.get("ORBITMQ_SEED")
    seed = int(env) if env else random.SystemRandom().randrange(2**32)
    print(f"crash test seed: ORBITMQ_SEED={seed}")
    return seed


@pytest.fixture
def crash_iterations() -> int:
    """Kill cycles per test: ORBITMQ_CRASH_ITERATIONS, else 30."""
    env = os.environ.get("ORBITMQ_CRASH_ITERATIONS")
    n = int(env) if env else DEFAULT_ITERATIONS
    if n < 1:
        raise ValueError("ORBITMQ_CRASH_ITERATIONS must be at least 1")
    return n

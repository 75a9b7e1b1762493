"""The official client through the proxy while servers crash: every acknowledged send survives.

Each test has its own NameServer, broker and proxy (it kills one of them). The official Python
client sends one message at a time through the proxy and records which sends were acknowledged;
meanwhile the broker or the proxy is SIGKILLed and started again on the same port (the broker on
the same store). Afterwards the topic is read natively, queue by queue: every acknowledged body
must be there, and sends must have been acknowledged again after the restart (the client and the
proxy found their way back without being restarted themselves).

The kill moment is random (seeded; the seed is printed, ``ORBITMQ_SEED`` replays it).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orbitmq.client import BlockingAdminClient
from tests.compat.conftest import Orbit, need_official_client, running_orbit, unique

pytestmark = [pytest.mark.compat, pytest.mark.integration, pytest.mark.crash]

SENDS = 600
INTERVAL_S = 0.02
DOWN_S = 1.0


@pytest.fixture
def own_orbit(tmp_path: Path) -> Iterator[Orbit]:
    need_official_client()
    with running_orbit(tmp_path) as orbit:
        yield orbit


@pytest.fixture
def rng() -> random.Random:
    seed = int(os.environ.get("ORBITMQ_SEED", random.randrange(1 << 30)))
    print(f"ORBITMQ_SEED={seed}")
    return random.Random(seed)


def stored_bodies(admin: BlockingAdminClient, topic: str) -> list[str]:
    bodies: list[str] = []
    for mq in admin.queues(topic):
        offset = admin.min_offset(mq)
        end = admin.max_offset(mq)
        while offset < end:
            got = admin.pull(mq, offset, max_nums=256)
            bodies.extend(m.body.decode() for m in got.messages)
            if got.next_begin_offset <= offset:
                break
            offset = got.next_begin_offset
    return bodies


def send_through_a_crash(orbit: Orbit, rng: random.Random, victim: str) -> None:
    topic = orbit.topic(unique("Crash"))
    steps = [
        {"op": "producer", "name": "p", "topics": [topic]},
        {"op": "send_each", "producer": "p", "topic": topic, "count": SENDS,
         "prefix": "m", "interval_s": INTERVAL_S},
    ]  # fmt: skip
    running = orbit.start_run(steps)
    try:
        time.sleep(rng.uniform(1.5, 3.0))  # client started and sending
        server = orbit.broker if victim == "broker" else orbit.proxy
        server.kill()
        killed_at = time.time()
        time.sleep(DOWN_S)
        server.restart()
        restarted_at = time.time()
    finally:
        out = running.finish(timeout=120)
    sent = out["results"][1]
    acked = {a["body"]: a for a in sent["acked"]}
    assert len(acked) + len(sent["failed"]) == SENDS
    assert any(a["at"] < killed_at for a in sent["acked"]), "nothing was sent before the kill"
    after = [a for a in sent["acked"] if a["at"] > restarted_at]
    assert after, f"no send succeeded after the {victim} came back: {sent['failed'][-3:]}"
    print(
        f"{victim}: {len(acked)} acked, {len(sent['failed'])} failed; first ack "
        f"{after[0]['at'] - restarted_at:.2f} s after the restart"
    )
    stored = stored_bodies(orbit.admin, topic)
    missing = sorted(set(acked) - set(stored))
    assert not missing, f"acknowledged but not stored after the {victim} crash: {missing[:10]}"


def test_broker_sigkill_loses_no_acknowledged_send(own_orbit: Orbit, rng: random.Random) -> None:
    send_through_a_crash(own_orbit, rng, "broker")


def test_proxy_sigkill_loses_no_acknowledged_send(own_orbit: Orbit, rng: random.Random) -> None:
    send_through_a_crash(own_orbit, rng, "proxy")

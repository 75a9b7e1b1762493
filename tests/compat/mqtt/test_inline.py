"""Delivery from the dispatch round (``Deliverer.on_arrival``): a publish reaches a parked
subscriber in the same loop pass as its append, and the two ways in (the round's records and
the session task's ConsumeQueue reads, taken when the window is full or the task is busy) keep
every message once and in order per MQTT topic."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.compat.mqtt.conftest import Client, MqttServer

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("qos", [1, 2])
def test_inline_and_read_paths_keep_order_and_count(tmp_path: Path, qos: int) -> None:
    server = MqttServer(tmp_path, receive_maximum=4)  # a small window: both paths are taken
    made: list[Client] = []
    try:
        sub = Client(server.port, 5)
        made.append(sub)
        sub.connect()
        sub.c.subscribe("inl/#", qos=qos)
        time.sleep(0.3)
        pub = Client(server.port, 5)
        made.append(pub)
        pub.connect()
        n = 300
        for i in range(n):  # paced so that the subscriber is often parked when one arrives
            pub.c.publish(f"inl/t{i % 3}", str(i).encode(), qos=qos).wait_for_publish(5)
        got = sub.wait_for(n, timeout=20)
        time.sleep(0.3)
        assert len(sub.messages) == n, f"{len(sub.messages)} of {n} (none twice, none lost)"
        per_topic: dict[str, list[int]] = {}
        for m in got:
            per_topic.setdefault(m.topic, []).append(int(m.payload))
        assert per_topic == {f"inl/t{k}": list(range(k, n, 3)) for k in range(3)}
        gateway, broker = server.gateway, server.broker
        assert gateway is not None and broker is not None
        assert gateway.ctx.hub.inline > 0, "no arrival was delivered from its dispatch round"
        assert broker.store.dispatcher.recent.served > 0
    finally:
        for c in made:
            c.close()
        server.close()

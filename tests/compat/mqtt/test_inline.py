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


def test_nothing_above_the_confirm_offset_is_delivered(tmp_path: Path) -> None:
    """Replication's confirm offset holds dispatch back: a publish the slaves do not have yet is
    not delivered (by either way in) until the offset covers it."""
    server = MqttServer(tmp_path)
    made: list[Client] = []
    try:
        broker = server.broker
        assert broker is not None
        sub = Client(server.port, 5)
        made.append(sub)
        sub.connect()
        sub.c.subscribe("held/#", qos=1)
        pub = Client(server.port, 5)
        made.append(pub)
        pub.connect()
        pub.c.publish("held/a", b"before", qos=0).wait_for_publish(5)
        assert [m.payload for m in sub.wait_for(1)] == [b"before"]
        store = broker.store
        server.run(lambda: store.set_confirm_offset(store.commit_log.max_offset))
        for i in range(5):
            pub.c.publish("held/a", str(i).encode(), qos=0).wait_for_publish(5)
        time.sleep(0.5)
        assert len(sub.messages) == 1, "delivered above the confirm offset"
        server.run(lambda: store.set_confirm_offset(None))
        got = sub.wait_for(6)
        assert [m.payload for m in got] == [b"before", b"0", b"1", b"2", b"3", b"4"]
    finally:
        for c in made:
            c.close()
        server.close()

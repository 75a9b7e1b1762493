from __future__ import annotations

import pytest

from tests.compat.mqtt.conftest import Client, MqttServer


@pytest.mark.parametrize("version", [4, 5])
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_publish_subscribe(
    server: MqttServer, clients: list[Client], version: int, qos: int
) -> None:
    sub = Client(server.port, version)
    clients.append(sub)
    sub.connect()
    sub.c.subscribe("plant/+/temp", qos=qos)
    import time

    time.sleep(0.3)
    pub = Client(server.port, version)
    clients.append(pub)
    pub.connect()
    for i in range(20):
        pub.c.publish(f"plant/line{i % 3}/temp", f"m{i}".encode(), qos=qos).wait_for_publish(5)
    pub.c.publish("plant/line1/pressure", b"x", qos=qos).wait_for_publish(5)
    got = sub.wait_for(20)
    assert sorted(m.payload for m in got) == sorted(f"m{i}".encode() for i in range(20))

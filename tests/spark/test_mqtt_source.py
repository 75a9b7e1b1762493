"""M8 for Spark: an MQTT publish to ``plant/line1/temp`` read by a Spark batch query of topic
``plant``, the MQTT topic visible (and filterable) as the ``MQTT_TOPIC`` property and the key."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from orbitmq.mqtt.mapping import MQTT_QOS, MQTT_TOPIC

pytestmark = pytest.mark.timeout(300)


def test_spark_reads_mqtt_publishes_with_their_topic(spark: Any, tmp_path: Path) -> None:
    pytest.importorskip("paho.mqtt.client")
    from tests.compat.mqtt.conftest import Client, MqttServer

    server = MqttServer(tmp_path)
    pub = None
    try:
        pub = Client(server.port, 5).connect()
        for i in range(3):
            pub.c.publish("plant/line1/temp", f"t{i}".encode(), 1).wait_for_publish(5)
            pub.c.publish("plant/line2/temp", b"other line", 1).wait_for_publish(5)
        time.sleep(1.2)  # the broker registers topic plant with the NameServer
        df = (
            spark.read.format("orbitmq")
            .option("namesrv", server.namesrv.address)
            .option("topic", "plant")
            .load()
        )
        rows = df.where(f"properties['{MQTT_TOPIC}'] = 'plant/line1/temp'").collect()
        assert sorted(r.value for r in rows) == [b"t0", b"t1", b"t2"]
        for r in rows:
            assert r.topic == "plant"
            assert r.key == b"plant/line1/temp"
            assert r.properties[MQTT_QOS] == "1"
        assert df.count() == 6
    finally:
        if pub is not None:
            pub.close()
        server.close()

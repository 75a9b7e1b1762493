"""MQTT and the native SDK on one store: a message sent natively to topic ``plant`` with the
MQTT_TOPIC property reaches MQTT subscribers of ``plant/+/temp``; an MQTT publish is read by a
native consumer with a SQL92 filter on MQTT_TOPIC."""

from __future__ import annotations

import time

import pytest

from orbitmq.client import ConsumeFromWhere, LitePullConfig, LitePullConsumer, Producer
from orbitmq.common.message import Message
from orbitmq.mqtt.mapping import MQTT_QOS, MQTT_TOPIC
from tests.compat.mqtt.conftest import Client, MqttServer

pytestmark = pytest.mark.timeout(90)


def test_native_send_reaches_mqtt_subscribers(server: MqttServer, clients: list[Client]) -> None:
    sub = Client(server.port, 5)
    clients.append(sub)
    sub.connect()
    sub.c.subscribe("plant/+/temp", 1)
    whole = Client(server.port, 4)
    clients.append(whole)
    whole.connect()
    whole.c.subscribe("plant", 1)  # a message without MQTT_TOPIC: its OrbitMQ topic name
    time.sleep(0.3)
    producer = Producer([server.namesrv.address])
    try:
        big = b"x" * 10_000  # compressed by the producer, inflated for MQTT
        producer.send(Message("plant", b"21.5", properties={MQTT_TOPIC: "plant/line1/temp"}))
        producer.send(Message("plant", big, properties={MQTT_TOPIC: "plant/line2/temp"}))
        producer.send(Message("plant", b"skip", properties={MQTT_TOPIC: "plant/line1/rpm"}))
        producer.send(Message("plant", b"bare"))
    finally:
        producer.close()
    sub.wait_for(2)
    time.sleep(0.3)
    # two MQTT topics, two queues: no order between them
    assert sorted((m.topic, m.payload) for m in sub.messages) == [
        ("plant/line1/temp", b"21.5"),
        ("plant/line2/temp", big),
    ]
    assert [(m.topic, m.payload) for m in whole.wait_for(1)] == [("plant", b"bare")]


def test_mqtt_publish_read_natively_with_sql92(server: MqttServer, clients: list[Client]) -> None:
    pub = Client(server.port, 5)
    clients.append(pub)
    pub.connect()
    pub.c.publish("plant/line1/temp", b"first", 1).wait_for_publish(5)  # creates topic plant
    time.sleep(1.2)  # the broker registers the new topic with the NameServer
    config = LitePullConfig(consume_from_where=ConsumeFromWhere.FIRST_OFFSET)
    consumer = LitePullConsumer([server.namesrv.address], "G_MQTT_SQL", config)
    consumer.subscribe("plant", f"{MQTT_TOPIC} = 'plant/line1/temp' AND {MQTT_QOS} = '1'", "SQL92")
    consumer.start()
    try:
        for i in range(5):
            pub.c.publish("plant/line1/temp", f"t{i}".encode(), 1).wait_for_publish(5)
            pub.c.publish("plant/line2/temp", b"other line", 1).wait_for_publish(5)
            pub.c.publish("plant/line1/temp", b"qos0", 0).wait_for_publish(5)
        bodies: list[bytes] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(bodies) < 6:
            for m in consumer.poll(1.0):
                bodies.append(m.body)
                assert m.message.properties[MQTT_TOPIC] == "plant/line1/temp"
        assert bodies == [b"first"] + [f"t{i}".encode() for i in range(5)]
    finally:
        consumer.close()


def test_mqtt_publish_read_by_a_kafka_consumer(server: MqttServer, clients: list[Client]) -> None:
    """M8: a Kafka consumer of topic ``plant`` (kafka-python, through the Kafka gateway on the
    same broker) reads MQTT publishes with key = MQTT topic and the MQTT properties as headers."""
    kafka = pytest.importorskip("kafka")
    from orbitmq.kafka.config import KafkaConfig
    from orbitmq.kafka.server import KafkaGateway

    pub = Client(server.port, 5)
    clients.append(pub)
    pub.connect()
    pub.c.publish("plant/line1/temp", b"21.5", 1).wait_for_publish(5)  # creates topic plant
    pub.c.publish("plant/line2/temp", b"19.0", 1).wait_for_publish(5)
    time.sleep(1.2)  # the broker registers the new topic with the NameServer
    gateway = KafkaGateway(KafkaConfig(namesrv_addrs=(server.namesrv.address,), port=0))
    server.call(gateway.start())
    consumer = None
    try:
        consumer = kafka.KafkaConsumer(
            "plant",
            bootstrap_servers=f"127.0.0.1:{gateway.port}",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            consumer_timeout_ms=1000,
        )
        got: dict[bytes, tuple[bytes | None, dict[str, bytes]]] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(got) < 2:
            for record in consumer.poll(timeout_ms=500).values():
                for r in record:
                    got[r.value] = (r.key, dict(r.headers))
        assert set(got) == {b"21.5", b"19.0"}
        key, headers = got[b"21.5"]
        assert key == b"plant/line1/temp"
        assert headers[MQTT_TOPIC] == b"plant/line1/temp"
        assert headers[MQTT_QOS] == b"1"
        assert got[b"19.0"][0] == b"plant/line2/temp"
    finally:
        if consumer is not None:
            consumer.close()
        server.call(gateway.stop())

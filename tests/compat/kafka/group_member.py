"""One consumer-group member as a process: `python group_member.py LIB BOOTSTRAP GROUP TOPIC`.

LIB is kafka-python, confluent or aiokafka. Prints one JSON line per event on stdout:
{"ready": LIB} once the library is imported, the consumer built and subscribed, before its first
poll (so a test can time the group's assignment apart from the process start);
{"assigned": [partitions]} whenever its assignment changes, {"p": partition, "o": offset}
per record (then its offset is committed synchronously; a commit refused during a rebalance is
ignored, as the record may come again to the partition's next owner). Runs until killed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys


def say(obj: object) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def kafka_python(bootstrap: str, group: str, topic: str) -> None:
    import kafka

    c = kafka.KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                            enable_auto_commit=False, session_timeout_ms=6000,
                            heartbeat_interval_ms=500, client_id="kafka-python")  # fmt: skip
    c.subscribe([topic])
    say({"ready": "kafka-python"})
    last: list[int] = []
    while True:
        polled = c.poll(timeout_ms=200)
        for tp, recs in polled.items():
            for r in recs:
                say({"p": r.partition, "o": r.offset})
                with contextlib.suppress(Exception):  # refused during a rebalance
                    c.commit({tp: kafka.OffsetAndMetadata(r.offset + 1, None, -1)})
        now = sorted(tp.partition for tp in c.assignment())
        if now != last:
            last = now
            say({"assigned": now})


def confluent(bootstrap: str, group: str, topic: str) -> None:
    import confluent_kafka

    c = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                  "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
                                  "client.id": "confluent"})  # fmt: skip
    c.subscribe([topic])
    say({"ready": "confluent"})
    last: list[int] = []
    while True:
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            say({"p": m.partition(), "o": m.offset()})
            with contextlib.suppress(confluent_kafka.KafkaException):  # refused in a rebalance
                c.commit(message=m, asynchronous=False)
        now = sorted(tp.partition for tp in c.assignment())
        if now != last:
            last = now
            say({"assigned": now})


async def aiokafka_member(bootstrap: str, group: str, topic: str) -> None:
    import aiokafka
    import aiokafka.errors

    c = aiokafka.AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                                  auto_offset_reset="earliest", enable_auto_commit=False,
                                  session_timeout_ms=6000, heartbeat_interval_ms=500,
                                  client_id="aiokafka")  # fmt: skip
    await c.start()
    # Subscribed only once started, so its join cannot begin before it says "ready".
    c.subscribe([topic])
    say({"ready": "aiokafka"})
    last: list[int] = []
    while True:
        batch = await c.getmany(timeout_ms=200)
        for tp, recs in batch.items():
            for r in recs:
                say({"p": r.partition, "o": r.offset})
                with contextlib.suppress(aiokafka.errors.KafkaError):  # refused in a rebalance
                    await c.commit({tp: r.offset + 1})
        now = sorted(tp.partition for tp in c.assignment())
        if now != last:
            last = now
            say({"assigned": now})


if __name__ == "__main__":
    lib, bootstrap, group, topic = sys.argv[1:5]
    if lib == "kafka-python":
        kafka_python(bootstrap, group, topic)
    elif lib == "confluent":
        confluent(bootstrap, group, topic)
    else:
        asyncio.run(aiokafka_member(bootstrap, group, topic))

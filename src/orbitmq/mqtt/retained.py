"""Retained messages: the last retained PUBLISH per MQTT topic, kept in a journal under the
store directory (``mqtt/retained.journal``) so they survive a restart.

A retained PUBLISH with a payload replaces its topic's message; one with an empty payload
deletes it (§3.3.1.3). The message is also stored as an ordinary OrbitMQ message (the retain
flag a property), so live subscribers and other protocols see it like any other; this store
only serves new subscriptions. A message whose 5.0 expiry passed is not sent and is dropped.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

from orbitmq.common.message import decode_properties
from orbitmq.mqtt.journal import Journal
from orbitmq.mqtt.mapping import MQTT_EXPIRY_AT, Outbound, outbound_from
from orbitmq.protocol.mqtt.topics import matches


class RetainedStore:
    def __init__(self, path: Path) -> None:
        self._journal = Journal(path)

    def load(self) -> int:
        return len(self._journal.load())

    def __len__(self) -> int:
        return len(self._journal.items)

    def put(self, mqtt_topic: str, payload: bytes, props: bytes) -> None:
        """``props``: the encoded OrbitMQ properties the message was stored with."""
        if not payload:
            self._journal.delete(mqtt_topic)
        else:
            entry = [base64.b64encode(payload).decode(), props.decode()]
            self._journal.put(mqtt_topic, entry)

    def get(self, mqtt_topic: str, now_ms: int) -> Outbound | None:
        raw = self._journal.items.get(mqtt_topic)
        if raw is None:
            return None
        props = decode_properties(raw[1].encode())
        expiry = props.get(MQTT_EXPIRY_AT, "")
        if expiry.isdigit() and int(expiry) <= now_ms:
            self._journal.delete(mqtt_topic)
            return None
        return outbound_from(mqtt_topic, base64.b64decode(raw[0]), props)

    def matching(self, topic_filter: str, now_ms: int) -> Iterator[Outbound]:
        for topic in list(self._journal.items):
            if matches(topic_filter, topic):
                msg = self.get(topic, now_ms)
                if msg is not None:
                    yield msg

    def close(self) -> None:
        self._journal.close()

"""Session: the server-side state of one MQTT client id, and how it is kept in the journal.

A session holds its subscriptions, a read position (next queue offset) per OrbitMQ
(topic, queue) it reads, the outbound messages in flight (by packet id: where the message is
in the store, or which retained topic it came from, its QoS and whether the PUBREL stage was
reached) and the inbound QoS 2 packet ids whose PUBREC was sent. A session with a non-zero
expiry interval is written to the journal as one JSON value whenever that state changes, before
the client is told anything that depends on it; so a broker restart (even SIGKILL) resumes it:
read positions, in-flight messages (resent with DUP, or their PUBREL), subscriptions and
exactly-once state for inbound QoS 2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orbitmq.protocol.mqtt.topics import parse_shared

NEVER = 0xFFFFFFFF
"""Session Expiry Interval meaning the session never expires (5.0 §3.1.2.11.2)."""


@dataclass(slots=True)
class SubOptions:
    filter: str
    """The filter as the client wrote it (``$share/g/f`` included)."""
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    sub_id: int | None = None

    @property
    def match_filter(self) -> str:
        shared = parse_shared(self.filter)
        return shared.filter if shared is not None else self.filter

    def to_json(self) -> list[Any]:
        return [self.filter, self.qos, self.no_local, self.retain_as_published, self.sub_id]

    @classmethod
    def from_json(cls, raw: list[Any]) -> SubOptions:
        return cls(str(raw[0]), int(raw[1]), bool(raw[2]), bool(raw[3]), raw[4])


@dataclass(slots=True)
class Inflight:
    """One outbound QoS 1/2 message awaiting its acknowledgement."""

    qos: int
    topic: str = ""
    """OrbitMQ topic/queue/offset of the stored message; empty topic: a retained one."""
    queue_id: int = 0
    offset: int = 0
    retained: str | None = None
    """The MQTT topic of a retained message sent on SUBSCRIBE."""
    group: str | None = None
    """The shared subscription (``$share/g/f``) it was dispatched by."""
    sub_ids: tuple[int, ...] = ()
    released: bool = False
    """PUBREC received, PUBREL sent: only PUBCOMP is awaited."""
    retain: bool = False

    def to_json(self) -> list[Any]:
        return [
            self.qos, self.topic, self.queue_id, self.offset, self.retained, self.group,
            list(self.sub_ids), self.released, self.retain,
        ]  # fmt: skip

    @classmethod
    def from_json(cls, raw: list[Any]) -> Inflight:
        return cls(
            int(raw[0]), str(raw[1]), int(raw[2]), int(raw[3]), raw[4], raw[5],
            tuple(int(x) for x in raw[6]), bool(raw[7]), bool(raw[8]),
        )  # fmt: skip


@dataclass(slots=True)
class Session:
    client_id: str
    expiry_s: int = 0
    subs: dict[str, SubOptions] = field(default_factory=dict)
    cursors: dict[str, int] = field(default_factory=dict)
    """``topic/queue_id`` -> next queue offset to read, for non-shared subscriptions."""
    inflight: dict[int, Inflight] = field(default_factory=dict)
    inbound_qos2: set[int] = field(default_factory=set)
    storing_qos2: dict[int, tuple[str, int, int]] = field(default_factory=dict)
    """Inbound QoS 2 ids being stored: packet id -> (topic, queue, queue end before). After a
    crash, a resend of one of them is stored only if that queue holds no record of it."""
    expires_at_ms: int | None = None
    """While no client is connected: when the session ends (None: connected, or never)."""
    version: int = 5

    @property
    def persistent(self) -> bool:
        return self.expiry_s > 0

    def to_json(self) -> dict[str, Any]:
        return {
            "expiry": self.expiry_s,
            "subs": [s.to_json() for s in self.subs.values()],
            "cursors": self.cursors,
            "inflight": {str(k): v.to_json() for k, v in self.inflight.items()},
            "in2": sorted(self.inbound_qos2),
            "storing2": {str(k): list(v) for k, v in self.storing_qos2.items()},
            "expires_at": self.expires_at_ms,
            "version": self.version,
        }

    @classmethod
    def from_json(cls, client_id: str, raw: dict[str, Any]) -> Session:
        subs = [SubOptions.from_json(s) for s in raw.get("subs", [])]
        return cls(
            client_id,
            int(raw.get("expiry", 0)),
            {s.filter: s for s in subs},
            {str(k): int(v) for k, v in raw.get("cursors", {}).items()},
            {int(k): Inflight.from_json(v) for k, v in raw.get("inflight", {}).items()},
            {int(x) for x in raw.get("in2", [])},
            {int(k): (str(v[0]), int(v[1]), int(v[2])) for k, v in raw.get("storing2", {}).items()},
            raw.get("expires_at"),
            int(raw.get("version", 5)),
        )


def cursor_key(topic: str, queue_id: int) -> str:
    return f"{topic}/{queue_id}"

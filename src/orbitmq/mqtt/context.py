"""GatewayContext: what the gateway's parts share, and the arrival hub that wakes readers.

Below every other gateway module (import order: gateway > handler > shared > delivery >
context), so callbacks upward are plain callables set by the gateway, never imports.

The hub: the store's dispatcher thread reports each (topic, queue) that got messages; the hub
hands that to the event loop and sets the wake event of every reader of that topic (a
connected session, or a shared subscription group), and of the readers of every user topic
(filters starting with a wildcard).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from orbitmq.common.clock import Clock
from orbitmq.mqtt.config import MqttConfig
from orbitmq.mqtt.journal import Journal
from orbitmq.mqtt.mapping import is_user_topic, orbit_topic
from orbitmq.mqtt.retained import RetainedStore
from orbitmq.mqtt.session import Session
from orbitmq.mqtt.store_access import StoreAccess

ALL = "*"
"""Hub key of readers of every user topic."""


class Hub:
    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.readers: dict[str, set[asyncio.Event]] = {}

    def on_arrival(self, topic: str, _queue_id: int, _max_offset: int) -> None:
        """On the store's dispatcher thread."""
        loop = self.loop
        if loop is not None and (topic in self.readers or ALL in self.readers):
            loop.call_soon_threadsafe(self._wake, topic)

    def _wake(self, topic: str) -> None:
        for ev in self.readers.get(topic, ()):
            ev.set()
        if is_user_topic(topic):
            for ev in self.readers.get(ALL, ()):
                ev.set()

    def watch(self, event: asyncio.Event, topics: set[str]) -> None:
        """``event`` is set on arrivals in ``topics`` (ALL: every user topic) and no others."""
        for key in list(self.readers):
            if key not in topics:
                self.unwatch_one(event, key)
        for key in topics:
            self.readers.setdefault(key, set()).add(event)

    def unwatch_one(self, event: asyncio.Event, key: str) -> None:
        events = self.readers.get(key)
        if events is not None:
            events.discard(event)
            if not events:
                del self.readers[key]

    def unwatch(self, event: asyncio.Event) -> None:
        for key in list(self.readers):
            self.unwatch_one(event, key)


def filter_topics(filters: list[str], fallback: str) -> set[str]:
    """The OrbitMQ topics (or ALL) that messages matching ``filters`` can be in."""
    out: set[str] = set()
    for f in filters:
        first = f.partition("/")[0]
        out.add(ALL if first in ("+", "#") else orbit_topic(f, fallback))
    return out


@dataclass
class GatewayContext:
    config: MqttConfig
    access: StoreAccess
    clock: Clock
    retained: RetainedStore
    journal: Journal
    """Sessions (``s:<client id>``) and shared groups (``g:<$share/group/filter>``)."""
    hub: Hub = field(default_factory=Hub)
    group_freed: Callable[[str], None] = lambda _key: None
    """A member freed a slot of a shared group's message (the group may dispatch more)."""

    def topics_of(self, keys: set[str]) -> list[str]:
        """Concrete OrbitMQ topics for hub keys (ALL: every user topic now)."""
        out = {k for k in keys if k != ALL}
        if ALL in keys:
            out.update(self.access.user_topics())
        return sorted(out)

    def save_session(self, session: Session) -> None:
        if session.persistent:
            self.journal.put("s:" + session.client_id, session.to_json())

"""GatewayContext: what the gateway's parts share, and the arrival hub that wakes readers.

Below every other gateway module (import order: gateway > handler > shared > delivery >
context), so callbacks upward are plain callables set by the gateway, never imports.

The hub: the store reports each (topic, queue) that got messages; the hub tells every reader
of that topic (a connected session, or a shared subscription group), and the readers of every
user topic (filters starting with a wildcard). Usually the report comes on the event loop
itself, inside the dispatch round that made the records readable (the broker dispatches
inline after its appends, broker/store_bridge.py): a reader that registered an ``inline``
callback is offered the arrival right there and may send the new records from what the round
holds (``Deliverer.on_arrival``), in the same loop pass as the append, as a held pull is
answered. A callback that declines (returns False), fails, or a report from the dispatcher
thread (handed to the loop with ``call_soon_threadsafe``) sets the reader's wake event
instead, and its task reads the ConsumeQueue as before.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from orbitmq.common.clock import Clock
from orbitmq.mqtt.config import MqttConfig
from orbitmq.mqtt.journal import Journal
from orbitmq.mqtt.mapping import is_user_topic, orbit_topic
from orbitmq.mqtt.retained import RetainedStore
from orbitmq.mqtt.session import Session
from orbitmq.mqtt.store_access import StoreAccess

log = logging.getLogger(__name__)

Inline = Callable[[str, int], bool]
"""Offered ``(topic, queue_id)`` on the loop inside a dispatch round; True if the reader took
care of it (nothing more to read there now), False to be woken instead."""

ALL = "*"
"""Hub key of readers of every user topic."""


class Hub:
    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_thread = -1
        self.readers: dict[str, dict[asyncio.Event, Inline | None]] = {}
        self.inline = 0
        """Arrivals a reader took care of inline (stats, tests)."""

    def bind(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Call on the loop's own thread (None: stop hearing arrivals)."""
        self.loop = loop
        self.loop_thread = threading.get_ident() if loop is not None else -1

    def on_arrival(self, topic: str, queue_id: int, _max_offset: int) -> None:
        """On the loop inside the dispatch round, or on the store's dispatcher thread."""
        loop = self.loop
        if loop is None or (topic not in self.readers and ALL not in self.readers):
            return
        if threading.get_ident() == self.loop_thread:
            self._arrived(topic, queue_id)
        elif not loop.is_closed():
            loop.call_soon_threadsafe(self._wake, topic)

    def _arrived(self, topic: str, queue_id: int) -> None:
        groups = [self.readers.get(topic)]
        if is_user_topic(topic):
            groups.append(self.readers.get(ALL))
        for readers in groups:
            for ev, inline in list((readers or {}).items()):
                if inline is not None and self._offer(inline, topic, queue_id):
                    self.inline += 1
                else:
                    ev.set()

    @staticmethod
    def _offer(inline: Inline, topic: str, queue_id: int) -> bool:
        try:
            return inline(topic, queue_id)
        except Exception:  # the reader's task reads it instead
            log.exception("delivering an MQTT arrival inline failed")
            return False

    def _wake(self, topic: str) -> None:
        for ev in self.readers.get(topic, ()):
            ev.set()
        if is_user_topic(topic):
            for ev in self.readers.get(ALL, ()):
                ev.set()

    def watch(self, event: asyncio.Event, topics: set[str], inline: Inline | None = None) -> None:
        """``event`` is set on arrivals in ``topics`` (ALL: every user topic) and no others;
        ``inline`` is offered them first when they come on the loop."""
        for key in list(self.readers):
            if key not in topics:
                self.unwatch_one(event, key)
        for key in topics:
            self.readers.setdefault(key, {})[event] = inline

    def unwatch_one(self, event: asyncio.Event, key: str) -> None:
        events = self.readers.get(key)
        if events is not None:
            events.pop(event, None)
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

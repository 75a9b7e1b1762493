"""Per-client state: the only state the proxy keeps.

A RocketMQ 5 client is identified by its ``x-mq-client-id`` header. It announces itself on a
Telemetry stream (settings: producer topics or consumer group and subscriptions) and keeps that
stream open so the server can push commands to it (transaction check-backs). A session ends when
the client says so (NotifyClientTermination) or its last stream closes and it stays silent for
``expiry_s``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from orbitmq.proxy.convert import resource_name
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.grpc_v2 import service_pb2 as svc

STREAM_QUEUE_MAX = 1024
"""Commands waiting to be written to one Telemetry stream; beyond it they are dropped (a client
that does not read its stream cannot answer check-backs anyway; the broker asks again)."""


@dataclass(eq=False, slots=True)
class TelemetryStream:
    """One open Telemetry call; ``outbox`` feeds the server->client side."""

    client_id: str
    outbox: asyncio.Queue[svc.TelemetryCommand | None] = field(
        default_factory=lambda: asyncio.Queue(STREAM_QUEUE_MAX)
    )

    def push(self, cmd: svc.TelemetryCommand) -> bool:
        try:
            self.outbox.put_nowait(cmd)
        except asyncio.QueueFull:
            return False
        return True

    def close(self) -> None:
        try:
            self.outbox.put_nowait(None)
        except asyncio.QueueFull:
            # The writer is far behind: make room for the end marker, it is what matters.
            self.outbox.get_nowait()
            self.outbox.put_nowait(None)


@dataclass(eq=False, slots=True)
class ClientSession:
    client_id: str
    settings: pb.Settings | None = None
    """The last settings the client sent (as sent; the reply is built from it)."""
    streams: list[TelemetryStream] = field(default_factory=list)
    last_seen: float = field(default_factory=time.monotonic)

    @property
    def client_type(self) -> int:
        return self.settings.client_type if self.settings is not None else 0

    @property
    def publishing_topics(self) -> frozenset[str]:
        if self.settings is None or not self.settings.HasField("publishing"):
            return frozenset()
        return frozenset(resource_name(r) for r in self.settings.publishing.topics)

    @property
    def group(self) -> str | None:
        s = self.settings
        if s is None or not s.HasField("subscription") or not s.subscription.HasField("group"):
            return None
        return resource_name(s.subscription.group)


class ClientSessions:
    def __init__(self, expiry_s: float = 120.0) -> None:
        self.expiry_s = expiry_s
        self._sessions: dict[str, ClientSession] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def __iter__(self) -> Iterator[ClientSession]:
        return iter(list(self._sessions.values()))

    def get(self, client_id: str) -> ClientSession | None:
        return self._sessions.get(client_id)

    def touch(self, client_id: str) -> ClientSession:
        session = self._sessions.get(client_id)
        if session is None:
            session = self._sessions[client_id] = ClientSession(client_id)
        session.last_seen = time.monotonic()
        return session

    def settings_of(self, client_id: str) -> pb.Settings | None:
        session = self._sessions.get(client_id)
        return session.settings if session is not None else None

    def open_stream(self, client_id: str) -> TelemetryStream:
        stream = TelemetryStream(client_id)
        self.touch(client_id).streams.append(stream)
        return stream

    def close_stream(self, stream: TelemetryStream) -> None:
        stream.close()
        session = self._sessions.get(stream.client_id)
        if session is not None and stream in session.streams:
            session.streams.remove(stream)
            session.last_seen = time.monotonic()

    def remove(self, client_id: str) -> ClientSession | None:
        """Forget the client. Its open streams are left for the client to close (ending them
        from here makes clients log an error on shutdown); they stop counting at once."""
        return self._sessions.pop(client_id, None)

    def producers_of(self, topic: str) -> list[ClientSession]:
        """Sessions with an open stream whose settings publish ``topic``."""
        return [s for s in self._sessions.values() if s.streams and topic in s.publishing_topics]

    def published_topics(self) -> set[str]:
        """Topics some client with an open stream publishes."""
        out: set[str] = set()
        for s in self._sessions.values():
            if s.streams:
                out |= s.publishing_topics
        return out

    def expire(self, now: float | None = None) -> list[ClientSession]:
        """Drop sessions without a stream that were silent for ``expiry_s``; returns them."""
        now = time.monotonic() if now is None else now
        gone = [
            s
            for s in self._sessions.values()
            if not s.streams and now - s.last_seen > self.expiry_s
        ]
        for s in gone:
            del self._sessions[s.client_id]
        return gone

"""Registry: every MQTT session of the gateway, the shared groups, wills and expiry timers,
and the inbound path from a PUBLISH to a stored OrbitMQ message.

- Sessions live here whether a client is connected or not. A session ends when its client
  disconnects with expiry 0, when a clean start replaces it, or when its expiry interval
  passes while no client is connected; it is then removed from the journal and its shared
  in-flight messages go back to their groups.
- Wills (§3.1.2.5): on a connection lost without a normal DISCONNECT (or with reason 0x04) the
  will is published after min(Will Delay Interval, session expiry); a new connection for the
  same client id inside that delay cancels it; a session ending publishes it at once. A
  connection taken over by a new one is such a loss: its will is published unless the session
  goes on and the will has a delay.
- Inbound: the OrbitMQ topic is the MQTT topic's first level (:mod:`orbitmq.mqtt.mapping`);
  the queue is the CRC32 of the whole MQTT topic modulo the write queues, so messages of one
  MQTT topic stay in order. Publishes read together are stored together (the broker's bridge
  batches concurrent appends).
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from typing import Protocol

from orbitmq.common.errors import MQError, NoPermissionError, TopicNotExistError
from orbitmq.common.tasks import TaskSet
from orbitmq.mqtt.context import GatewayContext
from orbitmq.mqtt.mapping import (
    EMPTY_BODY,
    MQTT_CLIENT_ID,
    MQTT_PACKET_ID,
    MappingError,
    orbit_topic,
    publish_properties,
)
from orbitmq.mqtt.session import NEVER, Inflight, Session
from orbitmq.mqtt.shared import SharedGroup
from orbitmq.protocol.mqtt.codes import ReasonCode
from orbitmq.protocol.mqtt.packets import Publish, Will
from orbitmq.protocol.mqtt.properties import Prop
from orbitmq.protocol.mqtt.topics import parse_shared

log = logging.getLogger(__name__)

BATCH_BYTES = 64 * 1024
"""Body bytes per stored batch of one read's PUBLISHes, under the broker's
``send_inline_max_bytes`` (256 KiB) so the batch is appended and dispatched on the loop."""


class LiveConnection(Protocol):
    def take_over(self) -> Will | None:
        """Another connection took this client id: send DISCONNECT 0x8E and close; returns
        the old connection's will."""
        ...


class Registry:
    def __init__(self, ctx: GatewayContext, tasks: TaskSet) -> None:
        self.ctx = ctx
        self.tasks = tasks
        self.sessions: dict[str, Session] = {}
        self.live: dict[str, LiveConnection] = {}
        self.groups: dict[str, SharedGroup] = {}
        self._wills: dict[str, tuple[asyncio.TimerHandle, Will]] = {}
        self._expiry: dict[str, asyncio.TimerHandle] = {}
        ctx.group_freed = self._group_freed

    # --- start -------------------------------------------------------------------------------

    def load(self) -> None:
        """Sessions and groups from the journal; sessions that expired while the broker was
        down end now; the others expire counted from now at the latest."""
        now = self.ctx.clock.now_ms()
        for key, raw in list(self.ctx.journal.items.items()):
            if key.startswith("g:"):
                group = self._group(key[2:], raw.get("cursors", {}))
                group.pending.extend(tuple(p) for p in raw.get("pending", []))
        for key, raw in list(self.ctx.journal.items.items()):
            if not key.startswith("s:"):
                continue
            session = Session.from_json(key[2:], raw)
            self.sessions[session.client_id] = session
            for sub in session.subs:
                if parse_shared(sub) is not None:
                    self._group(sub, {}).subscribers.add(session.client_id)
            if session.expires_at_ms is None and session.expiry_s != NEVER:
                session.expires_at_ms = now + session.expiry_s * 1000
            if session.expires_at_ms is not None and session.expires_at_ms <= now:
                self.end_session(session.client_id)
            elif session.expires_at_ms is not None:
                self._schedule_expiry(session)
        for key, group in list(self.groups.items()):
            if not group.subscribers:
                self._drop_group(key)

    def _group(self, key: str, cursors: dict[str, int]) -> SharedGroup:
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = SharedGroup(self.ctx, key, cursors)
            self.tasks.spawn(group.run(), name=f"mqtt-share-{key}")
        return group

    def _drop_group(self, key: str) -> None:
        group = self.groups.pop(key, None)
        if group is not None:
            group.closed = True
            group.wake.set()
            self.ctx.journal.delete("g:" + key)

    def _group_freed(self, key: str) -> None:
        group = self.groups.get(key)
        if group is not None:
            group.wake.set()

    # --- shared subscriptions ------------------------------------------------------------------

    def shared_subscribe(self, key: str, client_id: str) -> SharedGroup:
        new = key not in self.groups
        group = self._group(key, {})
        if new:
            group.start_positions()
        group.subscribers.add(client_id)
        return group

    def shared_unsubscribe(self, key: str, client_id: str) -> None:
        group = self.groups.get(key)
        if group is None:
            return
        group.subscribers.discard(client_id)
        group.members = [m for m in group.members if m.session.client_id != client_id]
        if not group.subscribers:
            self._drop_group(key)

    # --- sessions ------------------------------------------------------------------------------

    def open_session(
        self, client_id: str, clean_start: bool, expiry_s: int
    ) -> tuple[Session, bool]:
        """The session for a new connection and whether it was present (resumed)."""
        old = self.live.pop(client_id, None)
        if old is not None:
            will = old.take_over()
            delay = 0 if will is None else int(will.properties.get(Prop.WILL_DELAY_INTERVAL, 0))
            if will is not None and (clean_start or delay == 0):
                # the old connection ended without DISCONNECT; its will waits only if the
                # session goes on and a delay was asked (then this connection cancels it)
                self.tasks.spawn(self.publish_will(client_id, will))
        pending = self._wills.pop(client_id, None)
        if pending is not None:  # reconnected inside the will delay: no will (§3.1.3.2.2)
            pending[0].cancel()
        expiry = self._expiry.pop(client_id, None)
        if expiry is not None:
            expiry.cancel()
        existing = self.sessions.get(client_id)
        if existing is not None and clean_start:
            self.end_session(client_id)
            existing = None
        present = existing is not None
        session = existing or Session(client_id)
        session.expiry_s = expiry_s
        session.expires_at_ms = None
        self.sessions[client_id] = session
        if not session.persistent:
            self.ctx.journal.delete("s:" + client_id)
        self.ctx.save_session(session)
        return session, present

    def end_session(self, client_id: str) -> None:
        session = self.sessions.pop(client_id, None)
        if session is None:
            return
        timer = self._expiry.pop(client_id, None)
        if timer is not None:
            timer.cancel()
        pending = self._wills.pop(client_id, None)
        if pending is not None:  # the session ends before the will delay: publish it now
            pending[0].cancel()
            self.tasks.spawn(self.publish_will(client_id, pending[1]))
        by_group: dict[str, list[Inflight]] = {}
        for entry in session.inflight.values():
            if entry.group is not None:
                by_group.setdefault(entry.group, []).append(entry)
        for key, entries in by_group.items():
            group = self.groups.get(key)
            if group is not None:
                group.take_back(entries)
        for sub in list(session.subs):
            if parse_shared(sub) is not None:
                self.shared_unsubscribe(sub, client_id)
        self.ctx.journal.delete("s:" + client_id)

    def connection_ended(self, session: Session, will: Will | None, handler: object) -> None:
        """The connection of ``session`` is gone; ``will``: due (lost, or DISCONNECT 0x04)."""
        if self.live.get(session.client_id) is handler:
            del self.live[session.client_id]
        elif session.client_id in self.live:
            return  # taken over: the new connection owns the session now
        if will is not None:
            delay = int(will.properties.get(Prop.WILL_DELAY_INTERVAL, 0))
            if session.expiry_s == 0 or delay == 0:
                self.tasks.spawn(self.publish_will(session.client_id, will))
            else:
                wait = min(delay, session.expiry_s)
                timer = asyncio.get_running_loop().call_later(
                    wait, self._will_due, session.client_id, will
                )
                self._wills[session.client_id] = (timer, will)
        if session.expiry_s == 0:
            self.end_session(session.client_id)
            return
        if session.expiry_s != NEVER:
            session.expires_at_ms = self.ctx.clock.now_ms() + session.expiry_s * 1000
            self._schedule_expiry(session)
        self.ctx.save_session(session)

    def _will_due(self, client_id: str, will: Will) -> None:
        self._wills.pop(client_id, None)
        self.tasks.spawn(self.publish_will(client_id, will))

    def _schedule_expiry(self, session: Session) -> None:
        assert session.expires_at_ms is not None
        delay = max(0.0, (session.expires_at_ms - self.ctx.clock.now_ms()) / 1000)
        self._expiry[session.client_id] = asyncio.get_running_loop().call_later(
            delay, self._expired, session.client_id
        )

    def _expired(self, client_id: str) -> None:
        self._expiry.pop(client_id, None)
        if client_id not in self.live:
            self.end_session(client_id)

    async def publish_will(self, client_id: str, will: Will) -> None:
        props = {k: v for k, v in will.properties.items() if k != Prop.WILL_DELAY_INTERVAL}
        pub = Publish(will.topic, will.payload, will.qos, will.retain, properties=props)
        codes = await self.store([pub], client_id, ("127.0.0.1", 0))
        if codes[0] >= 0x80:
            log.warning("will of %s to %s not stored: 0x%02x", client_id, will.topic, codes[0])

    # --- inbound -------------------------------------------------------------------------------

    async def store(self, pubs: list[Publish], client_id: str, peer: tuple[str, int]) -> list[int]:
        """Store ``pubs`` (in order per MQTT topic); one reason code each (0 or >= 0x80).

        The PUBLISHes of one read that go to the same queue are stored as one batch (one
        append, one wait; up to ``BATCH_BYTES`` of bodies, so the broker still appends it on
        the loop), in their order; batches of different queues are stored concurrently."""
        cfg = self.ctx.config
        now = self.ctx.clock.now_ms()
        errors: list[BaseException | None] = [None] * len(pubs)
        props: list[bytes] = [b""] * len(pubs)
        batches: list[tuple[str, int, list[int]]] = []
        open_batch: dict[tuple[str, int], tuple[list[int], list[int]]] = {}
        for i, p in enumerate(pubs):
            try:
                topic = orbit_topic(p.topic, cfg.fallback_topic)
                props[i] = publish_properties(p, client_id, now)
                queues = self.ctx.access.write_queues(topic, cfg.auto_create_topic)
            except Exception as exc:  # noqa: BLE001 - that message's reason code
                errors[i] = exc
                continue
            key = (topic, zlib.crc32(p.topic.encode()) % queues)
            got = open_batch.get(key)
            if got is None or got[1][0] + len(p.payload) > BATCH_BYTES:
                got = open_batch[key] = ([], [0])
                batches.append((key[0], key[1], got[0]))
            got[0].append(i)
            got[1][0] += len(p.payload)

        async def one(topic: str, queue_id: int, idx: list[int]) -> None:
            bodies = [pubs[i].payload or EMPTY_BODY for i in idx]
            await self.ctx.access.append(topic, queue_id, bodies, [props[i] for i in idx],
                                         now, peer)  # fmt: skip
            for i in idx:
                if pubs[i].retain:
                    self.ctx.retained.put(pubs[i].topic, pubs[i].payload, props[i])

        results: list[BaseException | None]
        if len(batches) == 1:  # the usual case: no task
            try:
                await one(*batches[0])
                results = [None]
            except Exception as exc:  # noqa: BLE001 - the batch's reason code, as gather gives
                results = [exc]
        else:
            results = list(
                await asyncio.gather(*(one(*b) for b in batches), return_exceptions=True)
            )
        for (_t, _q, idx), r in zip(batches, results, strict=True):
            for i in idx:
                errors[i] = r
        codes: list[int] = []
        for p, r in zip(pubs, errors, strict=True):
            if isinstance(r, BaseException):
                codes.append(_reason(r))
                if not isinstance(r, MQError | MappingError):
                    log.error("storing an MQTT PUBLISH to %s failed", p.topic, exc_info=r)
                else:
                    log.info("MQTT PUBLISH of %s to %s refused: %s", client_id, p.topic, r)
            else:
                codes.append(0)
        return codes

    def placement(self, p: Publish) -> tuple[str, int, int]:
        """(topic, queue, queue end now) a PUBLISH will be stored at (queue -1: the topic does
        not exist yet, any queue)."""
        topic = orbit_topic(p.topic, self.ctx.config.fallback_topic)
        queues = self.ctx.access.queues(topic)
        if not queues:
            return topic, -1, 0
        queue_id = zlib.crc32(p.topic.encode()) % queues
        return topic, queue_id, self.ctx.access.max_offset(topic, queue_id)

    async def already_stored(
        self, client_id: str, packet_id: int, where: tuple[str, int, int]
    ) -> bool:
        """Whether the queue holds, past ``where``'s offset, the QoS 2 PUBLISH ``packet_id``
        of ``client_id`` (stored before a crash that came before its PUBREC)."""
        topic, queue_id, offset = where
        access = self.ctx.access
        queues = [queue_id] if queue_id >= 0 else list(range(access.queues(topic)))
        pid = str(packet_id)
        for q in queues:
            cur = offset if queue_id >= 0 else 0
            while cur < access.max_offset(topic, q):
                msgs, nxt = await access.read(topic, q, cur)
                for m in msgs:
                    props = m.properties
                    if props.get(MQTT_PACKET_ID) == pid and props.get(MQTT_CLIENT_ID) == client_id:
                        return True
                if nxt <= cur:
                    break
                cur = nxt
        return False

    def close(self) -> None:
        for timer in (*(t for t, _ in self._wills.values()), *self._expiry.values()):
            timer.cancel()
        self._wills.clear()
        self._expiry.clear()
        for group in self.groups.values():
            group.closed = True
            group.wake.set()


def _reason(exc: BaseException) -> int:
    if isinstance(exc, MappingError):
        return ReasonCode.TOPIC_NAME_INVALID
    if isinstance(exc, TopicNotExistError):
        return ReasonCode.TOPIC_NAME_INVALID
    if isinstance(exc, NoPermissionError):
        return ReasonCode.NOT_AUTHORIZED
    if isinstance(exc, MQError):
        # PUBACK/PUBREC allow neither Server Busy nor Unavailable: Quota Exceeded says retry.
        return (
            ReasonCode.QUOTA_EXCEEDED if exc.retriable else ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR
        )
    return ReasonCode.UNSPECIFIED_ERROR

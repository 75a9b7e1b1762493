"""Deliverer: outbound messages of one connected session, read from the store.

For each OrbitMQ topic its (non-shared) subscriptions can match, the deliverer reads every
queue from the session's read position, keeps the messages whose ``MQTT_TOPIC`` (or topic
name) matches a subscription and sends each once, at min(publish QoS, best matching
subscription QoS), with the subscription identifiers of every match (5.0), No Local and
Retain As Published applied and a 5.0 expiry counted down (an expired message is skipped).

Flow control: a QoS 1/2 message is sent only while the client's Receive Maximum and the
server's ``receive_maximum`` leave a slot; otherwise reading stops at that message until an
acknowledgement frees one. The session (positions and in-flight entries) is journaled before
the PUBLISH bytes are written, so what a client may have seen is always on file.

Two ways in, one order. The session's task (``run``) reads each queue from its position
(``StoreAccess.read``: on the loop near the tail, else on the read pool): at start, after a reconnect (resend first), for retained messages owed,
when the window was full or the socket backed up, and for anything the other way declines.
The other way (``on_arrival``): while the task is parked with nothing to read, the arrival
hub offers it a (topic, queue) inside the dispatch round that made new records readable, on
the loop; when the session's position is among that round's records, they are matched and
written right there, in the same loop pass as the append (no wake-up, no reader-thread hop,
no ConsumeQueue read-back), as Mosquitto forwards in memory. Both move the same position
under the same rules (window, journal before write), and the arrival path runs only while
the task holds no read in progress, so a message is never sent twice or out of order.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable

from orbitmq.common.record import StoredMessage
from orbitmq.mqtt.context import GatewayContext, filter_topics
from orbitmq.mqtt.mapping import Outbound, outbound
from orbitmq.mqtt.session import Inflight, Session, SubOptions, cursor_key
from orbitmq.protocol.mqtt.codes import MQTT_5
from orbitmq.protocol.mqtt.connection import ServerConnection, WindowFullError
from orbitmq.protocol.mqtt.packets import Publish
from orbitmq.protocol.mqtt.properties import Prop, Properties
from orbitmq.protocol.mqtt.topics import matches, parse_shared

log = logging.getLogger(__name__)

INLINE_MAX_BYTES = 256 * 1024
"""Bytes written by arrivals since the task last drained the socket, past which arrivals
wake the task instead (it drains: a slow client slows its reads, not the broker's memory)."""

IDLE_WAIT_S = 30.0
"""Longest sleep without a wake-up. Arrivals (also in topics created after the subscription),
an acknowledgement freeing a slot a message waits for, and new subscriptions all wake the
reader; this is only a safety net, kept
long so 10,000 idle connections cost no CPU."""


class Deliverer:
    def __init__(
        self, ctx: GatewayContext, session: Session, conn: ServerConnection,
        write: Callable[[bytes], None], drain: Callable[[], Awaitable[None]],
    ) -> None:  # fmt: skip
        self.ctx = ctx
        self.session = session
        self.conn = conn
        self.write = write
        self.drain = drain
        self.wake = asyncio.Event()
        self.closed = False
        self._out = bytearray()
        self.idle = False
        """The task is parked waiting for a wake-up, with no read in progress."""
        self._inline_bytes = 0
        self.held = False
        """A message waits for a free slot: the next acknowledgement wakes the task (the
        others need not: with nothing held back a wake-up would read nothing)."""
        self.retained: deque[tuple[str, SubOptions]] = deque()
        """Retained topics owed to new subscriptions, sent before stored messages as the
        window allows (kept in memory: a reconnect does not resend them)."""

    # --- what the handler and the shared groups call -----------------------------------------

    def can_send(self) -> bool:
        """A QoS > 0 slot is free."""
        return (
            not self.closed
            and self.conn.send_quota > 0
            and len(self.session.inflight) < self.ctx.config.receive_maximum
        )

    def plain_subs(self) -> list[SubOptions]:
        return [s for s in self.session.subs.values() if parse_shared(s.filter) is None]

    def watch(self) -> set[str]:
        """Point the hub at this session's topics; returns them (hub keys)."""
        keys = filter_topics([s.filter for s in self.plain_subs()], self.ctx.config.fallback_topic)
        self.ctx.hub.watch(self.wake, keys, self.on_arrival)
        return keys

    def start_positions(self, sub: SubOptions) -> None:
        """A new subscription reads from the end of each queue it can match."""
        keys = filter_topics([sub.filter], self.ctx.config.fallback_topic)
        for topic in self.ctx.topics_of(keys):
            for q in range(self.ctx.access.queues(topic)):
                self.session.cursors.setdefault(
                    cursor_key(topic, q), self.ctx.access.max_offset(topic, q)
                )

    def drop_positions(self) -> None:
        """Forget positions of topics no subscription covers any more."""
        keys = filter_topics([s.filter for s in self.plain_subs()], self.ctx.config.fallback_topic)
        if "*" in keys:
            return
        for key in list(self.session.cursors):
            if key.rpartition("/")[0] not in keys:
                del self.session.cursors[key]

    def on_delivered(self, packet_id: int) -> None:
        entry = self.session.inflight.pop(packet_id, None)
        if entry is not None and entry.group is not None:
            self.ctx.group_freed(entry.group)
        if self.held:
            self.held = False
            self.wake.set()

    def mark_released(self) -> bool:
        """Copy PUBREC-received states from the connection; True if any changed."""
        changed = False
        for pid, awaited in self.conn.outbound_in_flight.items():
            entry = self.session.inflight.get(pid)
            if entry is not None and awaited == "pubcomp" and not entry.released:
                entry.released = changed = True
        return changed

    def send(self, o: Outbound, qos: int, retain: bool, sub_ids: tuple[int, ...],
             entry: Inflight) -> None:  # fmt: skip
        """Queue one PUBLISH (``entry`` recorded in flight at QoS > 0); ``flush`` writes."""
        if self.closed or self.conn.closed:
            return  # the connection ended (or was taken over) while we read
        props: Properties = dict(o.properties)
        if o.expiry_at is not None:
            left_ms = o.expiry_at - self.ctx.clock.now_ms()
            if left_ms <= 0:
                return
            props[Prop.MESSAGE_EXPIRY_INTERVAL] = max(1, -(-left_ms // 1000))
        if sub_ids:
            props[Prop.SUBSCRIPTION_IDENTIFIER] = sub_ids
        try:
            res = self.conn.publish(o.topic, o.payload, qos, retain=retain, properties=props)
        except (WindowFullError, ValueError) as exc:
            log.warning("%s: %s not sent: %s", self.session.client_id, o.topic, exc)
            return
        if res is None:
            return  # over the client's Maximum Packet Size: not sent, as if delivered
        pid, data = res
        if pid is not None:
            entry.qos, entry.sub_ids, entry.retain = qos, sub_ids, retain
            self.session.inflight[pid] = entry
        self._out += data

    def flush(self) -> None:
        """Journal the session, then write what was queued."""
        if self._out:
            self.ctx.save_session(self.session)
            data, self._out = bytes(self._out), bytearray()
            self._inline_bytes += len(data)
            self.write(data)

    def deliver(self, o: Outbound, subs: list[SubOptions], entry: Inflight) -> bool:
        """Send ``o`` through the matching ``subs``; False when it needs a slot and none is
        free (nothing sent). Skipped messages (no match, no local, expired) count as sent."""
        cid = self.session.client_id
        subs = [s for s in subs if not (s.no_local and o.publisher == cid)]
        subs = [s for s in subs if matches(s.match_filter, o.topic)]
        if not subs:
            return True
        qos = min(o.qos, max(s.qos for s in subs))
        if qos and not self.can_send():
            return False
        retain = o.retain and any(s.retain_as_published for s in subs)
        ids = tuple(s.sub_id for s in subs if s.sub_id) if self.conn.version == MQTT_5 else ()
        self.send(o, qos, retain, ids, entry)
        return True

    # --- the loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            while not self.closed:
                self.wake.clear()
                keys = self.watch()
                moved = await self.pump(keys)
                self.flush()
                await self.drain()  # a slow client slows its reads, not the broker's memory
                self._inline_bytes = 0
                if moved:
                    await asyncio.sleep(0)  # reads near the tail do not yield: let others run
                else:
                    self.idle = True
                    try:
                        async with asyncio.timeout(IDLE_WAIT_S):
                            await self.wake.wait()
                    except TimeoutError:
                        pass
                    finally:
                        self.idle = False
        finally:
            self.ctx.hub.unwatch(self.wake)

    def send_retained(self) -> bool:
        """Send owed retained messages while the window allows; True if any went."""
        moved = False
        now = self.ctx.clock.now_ms()
        v5 = self.conn.version == MQTT_5
        while self.retained and not self.closed:
            topic, opts = self.retained[0]
            o = self.ctx.retained.get(topic, now)
            if o is not None:
                qos = min(o.qos, opts.qos)
                if qos and not self.can_send():
                    self.held = True
                    break
                ids = (opts.sub_id,) if opts.sub_id and v5 else ()
                self.send(o, qos, True, ids, Inflight(0, retained=topic))
            self.retained.popleft()
            moved = True
        return moved

    async def pump(self, keys: set[str]) -> bool:
        moved = self.send_retained()
        access = self.ctx.access
        for topic in self.ctx.topics_of(keys):
            for q in range(access.queues(topic)):
                key = cursor_key(topic, q)
                cur = self.session.cursors.get(key, 0)
                if cur >= access.max_offset(topic, q) or self.closed:
                    continue
                msgs, nxt = await access.read(topic, q, cur)
                nxt, _full = self._take(topic, q, msgs, nxt)
                if nxt != cur:
                    self.session.cursors[key] = nxt
                    moved = True
                self.flush()
        return moved

    def _take(self, topic: str, q: int, msgs: list[StoredMessage], nxt: int) -> tuple[int, bool]:
        """Send ``msgs`` (read from queue ``q`` of ``topic``, ending before ``nxt``) in order,
        stopping at the first one without a slot; returns the new position and whether it
        stopped there."""
        subs = self.plain_subs()
        for m in msgs:
            entry = Inflight(0, topic, q, m.queue_offset)
            if not self.deliver(_view(m), subs, entry):
                self.held = True
                return m.queue_offset, True
        return nxt, False

    def on_arrival(self, topic: str, q: int) -> bool:
        """Offered by the hub on the loop, inside the dispatch round that made new records of
        queue ``q`` readable: send them from that round when the task is parked (no read in
        progress), owes no retained messages, the socket has not backed up and the session's
        position is among the round's records. True if nothing is left to read there now;
        False to wake the task instead."""
        if not self.idle or self.closed or self.conn.closed or self.retained:
            return False
        if self._inline_bytes >= INLINE_MAX_BYTES:
            return False
        key = cursor_key(topic, q)
        cur = self.session.cursors.get(key, 0)
        got = self.ctx.access.read_recent(topic, q, cur)
        if got is None:
            return False
        msgs, nxt = got
        nxt, full = self._take(topic, q, msgs, nxt)
        if nxt != cur:
            self.session.cursors[key] = nxt
        self.flush()
        # A full window is woken by the acknowledgement that frees a slot.
        return full or nxt >= self.ctx.access.max_offset(topic, q)

    # --- a resumed session ---------------------------------------------------------------------

    async def resend(self) -> bytes:
        """The bytes that put the session's in-flight messages back (DUP PUBLISH, PUBREL)."""
        unacked: list[Publish] = []
        released: list[int] = []
        for pid in sorted(self.session.inflight):
            entry = self.session.inflight[pid]
            if entry.released:
                released.append(pid)
                continue
            o = await self._load(entry)
            if o is None:
                del self.session.inflight[pid]
                continue
            props: Properties = dict(o.properties) if self.conn.version == MQTT_5 else {}
            if entry.sub_ids and self.conn.version == MQTT_5:
                props[Prop.SUBSCRIPTION_IDENTIFIER] = entry.sub_ids
            unacked.append(Publish(o.topic, o.payload, entry.qos, entry.retain, True, pid, props))
        return self.conn.restore(unacked, released, self.session.inbound_qos2)

    async def _load(self, entry: Inflight) -> Outbound | None:
        if entry.retained is not None:
            return self.ctx.retained.get(entry.retained, self.ctx.clock.now_ms())
        m = await self.ctx.access.read_one(entry.topic, entry.queue_id, entry.offset)
        return None if m is None else _view(m)


def _view(m: StoredMessage) -> Outbound:
    return outbound(m)

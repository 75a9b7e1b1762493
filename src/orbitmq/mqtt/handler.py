"""ClientHandler: one MQTT network connection, from its first byte to its close.

It feeds the socket's bytes to the sans-IO :class:`ServerConnection` and acts on the events:
CONNECT (authentication, by password, certificate or a SCRAM-SHA-256 exchange over AUTH
(scram.py; also re-authentication), the session: new, resumed or taken over, in-flight state
resent),
PUBLISH (authorized, stored through the registry, then PUBACK/PUBREC with the outcome),
SUBSCRIBE / UNSUBSCRIBE (authorized per filter; the session's filters, shared groups, retained
messages), acknowledgements (the
deliverer frees the slot), DISCONNECT and protocol errors (5.0: DISCONNECT with the reason
first; malformed input never reaches anything but this connection).

Reading stops while the publishes of one read are being stored, which bounds what a fast
publisher can queue (3.1.1 has no Receive Maximum). A watchdog closes a client that sends no
CONNECT within ``CONNECT_TIMEOUT_S`` or goes silent for 1.5 keep-alive periods (0x8D).

The bytes come from a TCP or TLS stream, or from WebSocket frames
(:class:`orbitmq.mqtt.websocket.WebSocketStream`): the handler only needs a :class:`Writer`.

A PUBLISH the policies refuse gets PUBACK/PUBREC 0x87 (5.0); 3.1.1 has no negative
acknowledgement, so it is acknowledged and dropped (as Mosquitto does): closing would only make
the client send it again forever. A refused subscription gets SUBACK 0x87 (5.0) or 0x80 (3.1.1).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from orbitmq.auth.model import Action
from orbitmq.auth.scram import METHOD, ScramError, ScramServer
from orbitmq.mqtt.auth import EVERY_TOPIC, Authenticator
from orbitmq.mqtt.context import GatewayContext
from orbitmq.mqtt.delivery import Deliverer
from orbitmq.mqtt.mapping import orbit_topic
from orbitmq.mqtt.registry import Registry
from orbitmq.mqtt.session import Session, SubOptions
from orbitmq.protocol.mqtt.codes import MQTT_5, ReasonCode
from orbitmq.protocol.mqtt.connection import (
    AuthRequested,
    Closed,
    ConnectRequested,
    Delivered,
    Disconnected,
    Event,
    MessageReceived,
    Released,
    Send,
    ServerConnection,
    SubscribeRequested,
    UnsubscribeRequested,
)
from orbitmq.protocol.mqtt.packets import (
    Auth,
    Connect,
    Publish,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
    Will,
)
from orbitmq.protocol.mqtt.properties import Prop, Properties
from orbitmq.protocol.mqtt.topics import validate_subscription

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0
READ_SIZE = 256 * 1024
LINGER_S = 2.0
AUTH_FAILURE_DELAY_S = 0.1
"""A refused CONNECT's CONNACK waits this long (password guessing gets slow)."""


class Reader(Protocol):
    """What the handler reads from: an ``asyncio.StreamReader`` or a WebSocket stream."""

    async def read(self, n: int = -1) -> bytes: ...
    def feed_eof(self) -> None: ...


class Writer(Protocol):
    """What the handler writes to: an ``asyncio.StreamWriter`` or a WebSocket stream."""

    def write(self, data: bytes) -> None: ...
    async def drain(self) -> None: ...
    def close(self) -> None: ...
    def is_closing(self) -> bool: ...
    def can_write_eof(self) -> bool: ...
    def write_eof(self) -> None: ...
    def get_extra_info(self, name: str, default: Any = None) -> Any: ...


@dataclass(frozen=True, slots=True)
class Peer:
    ip: str
    port: int
    principal: str | None = None
    """A verified client certificate's principal (mutual TLS), None without one."""
    websocket: bool = False

    @classmethod
    def of(cls, writer: Writer, principal: str | None = None, websocket: bool = False) -> Peer:
        peer = writer.get_extra_info("peername")
        ip, port = (str(peer[0]), int(peer[1])) if peer else ("0.0.0.0", 0)
        return cls(ip, port, principal, websocket)


class ClientHandler:
    def __init__(
        self, ctx: GatewayContext, registry: Registry, auth: Authenticator,
        reader: Reader, writer: Writer, peer: Peer | None = None,
    ) -> None:  # fmt: skip
        self.ctx = ctx
        self.registry = registry
        self.auth = auth
        self.reader = reader
        self.writer = writer
        cfg = ctx.config
        self.conn = ServerConnection(
            receive_maximum=cfg.receive_maximum,
            topic_alias_maximum=cfg.topic_alias_maximum,
            max_packet_size=cfg.max_packet_size,
        )
        self.remote = peer or Peer.of(writer)
        self.peer: tuple[str, int] = (self.remote.ip, self.remote.port)
        self.user = ""
        """The authenticated user ("" while anonymous)."""
        self.session: Session | None = None
        self.deliverer: Deliverer | None = None
        self.will: Will | None = None
        self.will_due = True
        self.done = False
        self.taken_over = False
        self.linger = False
        self._tasks: list[asyncio.Task[None]] = []
        self.scram: ScramServer | None = None
        """The enhanced-authentication exchange under way (CONNECT or re-authentication)."""
        self.connecting: Connect | None = None
        """The CONNECT waiting for its exchange to end."""

    # --- the socket ----------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if data and not self.writer.is_closing():
            self.writer.write(data)

    async def drain(self) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.drain()

    async def run(self) -> None:
        watchdog = asyncio.get_running_loop().create_task(self._watchdog())
        try:
            while not self.done:
                data = await self.reader.read(READ_SIZE)
                if not data:
                    break
                await self.handle(self.conn.receive_data(data, self.ctx.clock.now_ms()))
                await self.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            watchdog.cancel()
            if self.linger:
                await self._linger()
            await self.finish()

    async def _linger(self) -> None:
        """After a DISCONNECT for a protocol error: our side is shut for writing; read and drop
        what the client still sends, so closing does not reset the connection (a reset can
        destroy the DISCONNECT before the client reads it)."""
        with contextlib.suppress(ConnectionError, OSError, TimeoutError):
            async with asyncio.timeout(LINGER_S):
                while await self.reader.read(READ_SIZE):
                    pass

    async def _watchdog(self) -> None:
        started = self.ctx.clock.monotonic()
        while not self.done:
            if self.session is None:
                left = started + CONNECT_TIMEOUT_S - self.ctx.clock.monotonic()
                if left <= 0:
                    self.close()
                    return
                await asyncio.sleep(min(left, 1.0))
                continue
            deadline = self.conn.keep_alive_deadline_ms()
            if deadline is None:
                return
            closed = self.conn.check_keep_alive(self.ctx.clock.now_ms())
            if closed is not None:
                self.close_after(closed.data)
                self.reader.feed_eof()  # wake the read loop: the client is silent
                return
            await asyncio.sleep(max(0.05, (deadline - self.ctx.clock.now_ms()) / 1000 + 0.01))

    def close(self) -> None:
        self.done = True
        self.writer.close()

    def close_after(self, data: bytes) -> None:
        """Send ``data`` (a DISCONNECT with a reason), stop reading packets, then linger."""
        self.write(data)
        self.done = self.linger = True
        if self.writer.can_write_eof():
            with contextlib.suppress(OSError):
                self.writer.write_eof()

    def take_over(self) -> Will | None:
        self.taken_over = True
        if self.deliverer is not None:
            self.deliverer.closed = True  # the new connection owns the session from now on
        self.write(self.conn.close(ReasonCode.SESSION_TAKEN_OVER))
        self.close()
        return self.will if self.will_due else None

    def shutdown(self) -> None:
        """The server is stopping: DISCONNECT 0x8B (5.0), no will; the session is kept."""
        self.will_due = False
        self.write(self.conn.close(ReasonCode.SERVER_SHUTTING_DOWN))
        self.close()

    async def finish(self) -> None:
        self.done = True
        for task in self._tasks:
            task.cancel()
        d, session = self.deliverer, self.session
        if d is not None:
            d.closed = True
            d.wake.set()
            for group in self.registry.groups.values():
                group.leave(d)
        if session is not None:
            if d is not None:
                d.mark_released()
            will = self.will if self.will_due and not self.taken_over else None
            self.registry.connection_ended(session, will, self)
        with contextlib.suppress(Exception):
            self.writer.close()

    # --- events --------------------------------------------------------------------------------

    async def handle(self, events: list[Event]) -> None:
        pubs: list[Publish] = []
        dirty = False
        for ev in events:
            if isinstance(ev, MessageReceived):
                pubs.append(ev.publish)
                continue
            if pubs:
                await self._store(pubs)
                pubs = []
            if isinstance(ev, Send):
                d = self.deliverer
                if d is not None and self.session is not None and d.mark_released():
                    self.ctx.save_session(self.session)  # PUBREC noted before the PUBREL goes
                self.write(ev.data)
            elif isinstance(ev, Delivered):
                if self.deliverer is not None:
                    self.deliverer.on_delivered(ev.packet_id)
                dirty = True
            elif isinstance(ev, Released):
                if self.session is not None:
                    self.session.inbound_qos2.discard(ev.packet_id)
                dirty = True
            elif isinstance(ev, ConnectRequested):
                await self._connect(ev.connect)
            elif isinstance(ev, SubscribeRequested):
                self._subscribe(ev.subscribe)
            elif isinstance(ev, UnsubscribeRequested):
                self._unsubscribe(ev.unsubscribe)
            elif isinstance(ev, Disconnected):
                self.will_due = ev.disconnect.reason_code == ReasonCode.DISCONNECT_WITH_WILL_MESSAGE
                expiry = ev.disconnect.properties.get(Prop.SESSION_EXPIRY_INTERVAL)
                if self.session is not None and isinstance(expiry, int):
                    self.session.expiry_s = min(expiry, self.ctx.config.max_session_expiry_s)
                self.close()
            elif isinstance(ev, Closed):
                log.info("mqtt %s closed: %s %s", self.peer, ev.reason.name, ev.detail)
                self.close_after(ev.data)
            elif isinstance(ev, AuthRequested):
                await self._auth(ev.auth)
        if pubs:
            await self._store(pubs)
        dv = self.deliverer
        if dv is not None and self.session is not None and (dv.mark_released() or dirty):
            self.ctx.save_session(self.session)

    async def _store(self, pubs: list[Publish]) -> None:
        session = self.session
        if session is None:
            return
        fallback = self.ctx.config.fallback_topic
        allowed = [self._may(Action.PUB, orbit_topic(p.topic, fallback)) for p in pubs]
        if not all(allowed):
            self._acknowledge(session, pubs, [0 if ok else -1 for ok in allowed], True)
            pubs = [p for p, ok in zip(pubs, allowed, strict=True) if ok]
            if not pubs:
                return
        cid = session.client_id
        found: set[int] = set()  # resent QoS 2 ids found stored before a crash
        for p in pubs:
            if p.qos == 2 and p.packet_id is not None:
                # only a resend (DUP) can be the copy a crash left; a new message may reuse the id
                where = session.storing_qos2.get(p.packet_id) if p.dup else None
                if where is not None and await self.registry.already_stored(
                    cid, p.packet_id, where
                ):
                    found.add(p.packet_id)
                else:
                    session.storing_qos2[p.packet_id] = self.registry.placement(p)
        todo = [p for p in pubs if not (p.qos == 2 and p.packet_id in found)]
        if len(todo) != len(pubs) or any(p.qos == 2 for p in todo):
            self.ctx.save_session(session)  # where each QoS 2 message goes, before it is stored
        stored = iter(await self.registry.store(todo, cid, self.peer))
        codes = [0 if p.qos == 2 and p.packet_id in found else next(stored) for p in pubs]
        self._acknowledge(session, pubs, codes, False)

    def _may(self, action: Action, topic: str, group: str | None = None) -> bool:
        return self.auth.may(self.user, action, topic, self.remote.ip, group=group)

    def _acknowledge(
        self, session: Session, pubs: list[Publish], codes: list[int], refusals: bool
    ) -> None:
        """PUBACK/PUBREC each of ``pubs`` with its code; ``refusals``: only those coded -1
        (not authorized: 5.0 0x87, 3.1.1 a plain acknowledgement, the message dropped)."""
        v5 = self.conn.version == MQTT_5
        if refusals:
            pairs = [(p, ReasonCode.NOT_AUTHORIZED if v5 else 0)
                     for p, c in zip(pubs, codes, strict=True) if c == -1]  # fmt: skip
            for p, _ in pairs:
                log.info("mqtt %s (%s): PUBLISH to %s not authorized",
                         session.client_id, self.user, p.topic)  # fmt: skip
        else:
            pairs = list(zip(pubs, codes, strict=True))
        out = bytearray()
        qos2 = False
        for p, code in pairs:
            if code and not v5:
                # 3.1.1 cannot refuse a PUBLISH: closing makes the client send it again.
                log.warning(
                    "mqtt %s: PUBLISH to %s refused (0x%02x): closing",
                    session.client_id,
                    p.topic,
                    code,
                )
                self.write(bytes(out))
                self.close()
                return
            if p.packet_id is None or self.conn.closed:
                continue
            if p.qos == 2:
                session.storing_qos2.pop(p.packet_id, None)
                if code < 0x80:
                    session.inbound_qos2.add(p.packet_id)
                qos2 = True
            out += self.conn.acknowledge(p.packet_id, code)
        if qos2:
            self.ctx.save_session(session)  # before PUBREC: a resent PUBLISH is not stored twice
        self.write(bytes(out))

    async def _connect(self, c: Connect) -> None:
        method = c.properties.get(Prop.AUTHENTICATION_METHOD)
        if method is not None:
            if method != METHOD or not self.auth.scram_enabled:
                self.write(self.conn.refuse(ReasonCode.BAD_AUTHENTICATION_METHOD))
                self.close()
                return
            self.connecting = c
            await self._auth(Auth(ReasonCode.RE_AUTHENTICATE, c.properties))
            return
        user = self.auth.login(
            c.username, c.password, self.remote.principal, f"{self.remote.ip}:{self.remote.port}"
        )
        if user is None:
            await asyncio.sleep(AUTH_FAILURE_DELAY_S)
            self.write(self.conn.refuse(ReasonCode.BAD_USER_NAME_OR_PASSWORD))
            self.close()
            return
        await self._open(c, user, {})

    async def _auth(self, a: Auth) -> None:
        """One step of a SCRAM-SHA-256 exchange (scram.py): a client-first (in CONNECT, or
        AUTH 0x19 to re-authenticate) gets AUTH 0x18 with the server-first; a client-final
        (AUTH 0x18) gets CONNACK (or AUTH 0x00) with the server-final. A failure is CONNACK
        0x86, or DISCONNECT 0x87 for a re-authentication (which must name the same user)."""
        data = a.properties.get(Prop.AUTHENTICATION_DATA, b"")
        props: Properties = {Prop.AUTHENTICATION_METHOD: METHOD}
        try:
            if not isinstance(data, bytes):
                raise ScramError("no authentication data")
            if a.reason_code == ReasonCode.RE_AUTHENTICATE:
                self.scram = ScramServer(self.auth.scram_secret)
                props[Prop.AUTHENTICATION_DATA] = self.scram.first(data)
                self.write(self.conn.send(Auth(ReasonCode.CONTINUE_AUTHENTICATION, props)))
                return
            if self.scram is None:
                raise ScramError("no exchange under way")
            user, props[Prop.AUTHENTICATION_DATA] = self.scram.final(data)
            if self.session is not None and user != self.user:
                raise ScramError(f"re-authentication as {user}, connected as {self.user}")
        except ScramError as exc:
            name = self.scram.user if self.scram is not None else ""
            log.info("mqtt %s: %s authentication of %r failed: %s", self.peer, METHOD, name, exc)
            self.auth.scram_failed(name, f"{self.remote.ip}:{self.remote.port}")
            await asyncio.sleep(AUTH_FAILURE_DELAY_S)
            if self.session is None:
                self.write(self.conn.refuse(ReasonCode.BAD_USER_NAME_OR_PASSWORD))
            else:
                self.write(self.conn.close(ReasonCode.NOT_AUTHORIZED))
            self.close()
            return
        self.scram = None
        c, self.connecting = self.connecting, None
        if c is not None and self.session is None:
            await self._open(c, user, props)
        else:
            self.write(self.conn.send(Auth(ReasonCode.SUCCESS, props)))

    async def _open(self, c: Connect, user: str, props: Properties) -> None:
        """The client is authenticated as ``user``: check its will, open its session,
        CONNACK (with ``props``), resend what was in flight, start delivering."""
        cfg = self.ctx.config
        v5 = c.protocol_level == MQTT_5
        self.user = user
        if c.will is not None and not self._may(
            Action.PUB, orbit_topic(c.will.topic, cfg.fallback_topic)
        ):
            self.write(self.conn.refuse(ReasonCode.NOT_AUTHORIZED))
            self.close()
            return
        client_id = c.client_id
        if not client_id:
            client_id = "orbitmq-" + uuid.uuid4().hex
            if v5:
                props[Prop.ASSIGNED_CLIENT_IDENTIFIER] = client_id
        if v5:
            asked = int(c.properties.get(Prop.SESSION_EXPIRY_INTERVAL, 0))
            expiry = min(asked, cfg.max_session_expiry_s)
            if expiry != asked:
                props[Prop.SESSION_EXPIRY_INTERVAL] = expiry
        else:
            expiry = 0 if c.clean_start else cfg.max_session_expiry_s
        most = cfg.max_keep_alive_s
        if v5 and most and (c.keep_alive == 0 or c.keep_alive > most):
            self.conn.server_keep_alive = self.conn.keep_alive = most  # CONNACK says so
        session, present = self.registry.open_session(client_id, c.clean_start, expiry)
        self.registry.live[client_id] = self
        session.version = c.protocol_level
        self.session = session
        self.will = c.will
        events = self.conn.accept(present, props)
        d = self.deliverer = Deliverer(self.ctx, session, self.conn, self.write, self.drain)
        connack, rest = events[0], events[1:]
        assert isinstance(connack, Send)
        self.write(connack.data)
        self.write(await d.resend())
        for key in session.subs:
            group = self.registry.groups.get(key)
            if group is not None:
                group.join(d)
        self.ctx.save_session(session)
        self._tasks.append(asyncio.get_running_loop().create_task(self._deliver(d)))
        await self.handle(rest)

    async def _deliver(self, d: Deliverer) -> None:
        try:
            await d.run()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("mqtt delivery to %s failed: closing", d.session.client_id)
            self.close()

    def _subscribe(self, s: Subscribe) -> None:
        session, d = self.session, self.deliverer
        assert session is not None and d is not None
        v5 = self.conn.version == MQTT_5
        raw_id = s.properties.get(Prop.SUBSCRIPTION_IDENTIFIER)
        sub_id = raw_id[0] if isinstance(raw_id, tuple) else raw_id
        codes: list[int] = []
        fresh: list[SubOptions] = []
        for sub in s.subscriptions:
            try:
                shared = validate_subscription(sub.filter)
            except ValueError:
                codes.append(ReasonCode.TOPIC_FILTER_INVALID if v5 else 0x80)
                continue
            if sub.filter in self.ctx.config.deny_subscribe:
                codes.append(ReasonCode.UNSPECIFIED_ERROR)
                continue
            if not self._may_subscribe(sub.filter if shared is None else shared.filter,
                                       None if shared is None else shared.group):  # fmt: skip
                codes.append(ReasonCode.NOT_AUTHORIZED if v5 else 0x80)
                continue
            existed = sub.filter in session.subs
            opts = SubOptions(sub.filter, sub.qos, sub.no_local, sub.retain_as_published,
                              sub_id if isinstance(sub_id, int) else None)  # fmt: skip
            session.subs[sub.filter] = opts
            if shared is not None:
                self.registry.shared_subscribe(sub.filter, session.client_id).join(d)
            else:
                d.start_positions(opts)
                if sub.retain_handling == 0 or (sub.retain_handling == 1 and not existed):
                    fresh.append(opts)
            codes.append(sub.qos)
        self.ctx.save_session(session)
        self.write(self.conn.send(Suback(s.packet_id, tuple(codes))))
        now = self.ctx.clock.now_ms()
        for opts in fresh:
            d.retained.extend((o.topic, opts) for o in self.ctx.retained.matching(opts.filter, now))
        d.send_retained()
        d.flush()
        d.wake.set()

    def _may_subscribe(self, topic_filter: str, group: str | None) -> bool:
        first = topic_filter.partition("/")[0]
        if first in ("+", "#"):
            topic = EVERY_TOPIC
        else:
            topic = orbit_topic(topic_filter, self.ctx.config.fallback_topic)
        return self._may(Action.SUB, topic, group)

    def _unsubscribe(self, u: Unsubscribe) -> None:
        session, d = self.session, self.deliverer
        assert session is not None and d is not None
        codes: list[int] = []
        for f in u.filters:
            if session.subs.pop(f, None) is None:
                codes.append(ReasonCode.NO_SUBSCRIPTION_EXISTED)
                continue
            codes.append(0)
            group = self.registry.groups.get(f)
            if group is not None:
                group.leave(d)
                self.registry.shared_unsubscribe(f, session.client_id)
        d.drop_positions()
        self.ctx.save_session(session)
        v5 = self.conn.version == MQTT_5
        self.write(self.conn.send(Unsuback(u.packet_id, tuple(codes) if v5 else ())))

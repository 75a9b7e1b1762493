"""KafkaGateway: the Kafka listener, one asyncio server on the gateway's event loop.

Each connection is a `ServerConnection` (sans-IO) fed from the socket. Produce requests are
pipelined: up to ``max_inflight_produce`` of one connection are worked on at once (librdkafka
keeps five in flight), each partition's batches still appended in request order
(`orbitmq.kafka.ordering`), and a writer sends the answers in request order, which Kafka
guarantees per connection and clients rely on. Every other request waits for the Produces
before it and is answered before anything after it is read, as Kafka serves every request (it
mutes a connection until its response is sent): a long-polled Fetch holds its connection, which
no Kafka client relies on being otherwise (producers and consumers use their own connections,
and a consumer's group requests go to a separate coordinator connection). A request for an API or version this gateway does not
serve closes the connection, except ApiVersions, which gets the supported ranges (what every
client asks first). A malformed frame closes that connection only. Handlers that park (Fetch
long polls, JoinGroup and SyncGroup during a rebalance) await futures; the loop keeps serving
other connections.

Security (docs/kafka.md#security): with ``auth_enabled`` each connection has a
:class:`~orbitmq.kafka.sasl.Session`; until it is authenticated (SASL, or a client certificate
naming a user) only ApiVersions, SaslHandshake and SaslAuthenticate are served and anything
else closes the connection; afterwards every request goes through
:class:`~orbitmq.kafka.authz.Authorizer` before its handler. A failed authentication is answered
with SASL_AUTHENTICATION_FAILED and the connection closed, as Kafka does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from orbitmq.auth.guard import cert_principal
from orbitmq.auth.model import Action, ResourceType
from orbitmq.auth.server import AUTH_FAILURE_DELAY_S
from orbitmq.client.admin.client import AsyncAdminClient
from orbitmq.client.admin.config import AdminConfig
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.client.producer.producer import AsyncProducer
from orbitmq.common.tasks import TaskSet
from orbitmq.kafka.authz import Authorizer
from orbitmq.kafka.config import KafkaConfig
from orbitmq.kafka.control import ControlPlane
from orbitmq.kafka.data import DataPlane
from orbitmq.kafka.groups import Coordinator
from orbitmq.kafka.ordering import PartitionOrder
from orbitmq.kafka.partitions import Partitions
from orbitmq.kafka.producer_state import ProducerStates
from orbitmq.kafka.sasl import (
    AUTH_FAILED_MESSAGE,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    KafkaAuth,
    Session,
)
from orbitmq.net.limits import REASON_AUTH_FAILED, REASON_THROTTLED, Limits, Refusals
from orbitmq.net.listener import Listener
from orbitmq.net.quota import ByteQuotas
from orbitmq.protocol.kafka.connection import (
    RawToken,
    Rejected,
    Request,
    ServerConnection,
    encode_response,
    raw_frame,
)
from orbitmq.protocol.kafka.primitives import KafkaCodecError

log = logging.getLogger(__name__)

PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR = 8, 9, 10
JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 11, 12, 13, 14
DESCRIBE_GROUPS, LIST_GROUPS, API_VERSIONS = 15, 16, 18
CREATE_TOPICS, DELETE_TOPICS, INIT_PRODUCER_ID = 19, 20, 22

# What the gateway serves (docs/kafka.md explains each bound). Produce v0-2 are advertised and
# refused per partition (magic < 2), as Kafka 4 does: librdkafka < 2.11.1 enables compression
# only when Produce v0 is advertised.
SUPPORTED: dict[int, tuple[int, int]] = {
    PRODUCE: (0, 9), FETCH: (4, 12), LIST_OFFSETS: (1, 7), METADATA: (0, 12),
    OFFSET_COMMIT: (2, 8), OFFSET_FETCH: (1, 8), FIND_COORDINATOR: (0, 4),
    JOIN_GROUP: (0, 7), HEARTBEAT: (0, 4), LEAVE_GROUP: (0, 4), SYNC_GROUP: (0, 5),
    DESCRIBE_GROUPS: (0, 5), LIST_GROUPS: (0, 4), API_VERSIONS: (0, 4),
    CREATE_TOPICS: (2, 7), DELETE_TOPICS: (1, 5), INIT_PRODUCER_ID: (0, 4),
}  # fmt: skip
LIMITS = Limits(
    max_connections=1_000_000, max_connections_per_ip=1_000_000,
    new_connections_per_ip_per_s=1e9, exempt_loopback=True,
)  # fmt: skip
"""No admission caps (as on the MQTT ports: Kafka clients open a connection per broker and
role); the listener's TLS handshake timeout (10 s) applies."""
SASL_APIS: dict[int, tuple[int, int]] = {SASL_HANDSHAKE: (0, 1), SASL_AUTHENTICATE: (0, 2)}
"""Served when authentication is on. SaslHandshake v0 is followed by bare SASL tokens (no
SaslAuthenticate): Kafka 4 removed it (KIP-896), but kafka-python 2.0.2, Sarama <= 1.40.1 and
aiokafka <= 0.12 send it, and Kafka 3 serves it."""
BEFORE_AUTH = frozenset({API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE})

Body = dict[str, Any]


class _Close:
    """A slot's answer meaning: close the connection after the answers before it."""


CLOSE = _Close()


def _ready(value: bytes | _Close | None) -> asyncio.Future[bytes | _Close | None]:
    fut: asyncio.Future[bytes | _Close | None] = asyncio.get_running_loop().create_future()
    fut.set_result(value)
    return fut


class KafkaGateway:
    def __init__(self, config: KafkaConfig) -> None:
        self.config = config
        self.tasks = TaskSet("kafka-gateway", logger=log)
        self._listener: Listener | None = None
        self.tls = config.tls_source()
        self._conns: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self.admin: AsyncAdminClient | None = None
        self.producer: AsyncProducer | None = None
        self.port = 0
        self.refusals = Refusals()
        """The listener's refusals, SASL failures and ACL denials, and quota throttles by
        reason (``orbitmq_net_refused_total{listener="kafka"}`` beside a broker)."""
        self.auth: KafkaAuth | None = None
        self.authz: Authorizer | None = None
        if config.auth_enabled and config.auth_file:
            self.auth = KafkaAuth.open(
                config.auth_file, config.audit_file, config.sasl_mechanisms,
                config.cluster_id, f"kafka-{config.node_id}", self.refusals,
            )  # fmt: skip
            self.authz = Authorizer(self.auth)
        self.supported = {**SUPPORTED, **SASL_APIS} if self.auth is not None else SUPPORTED
        self.quotas = ByteQuotas.of(
            {PRODUCE}, {FETCH}, config.produce_quota_bytes_per_s, config.fetch_quota_bytes_per_s
        )

    async def start(self) -> None:
        cfg = self.config
        self.producer = await AsyncProducer(
            cfg.namesrv_addrs,
            ProducerConfig(
                group="KAFKA_GATEWAY_PRODUCER",
                linger_ms=0.0,
                compress_over_bytes=-1,
                # the Kafka client retries with its own sequence numbers (idempotence), so a
                # failure goes back to it instead of being retried here, possibly twice
                retry_times_when_send_failed=0,
                auto_create_fallback=False,
                access_key=cfg.access_key,
                secret_key=cfg.secret_key,
            ),
        ).start()
        self.admin = await AsyncAdminClient(
            cfg.namesrv_addrs, AdminConfig(access_key=cfg.access_key, secret_key=cfg.secret_key)
        ).start()
        listener = Listener(
            lambda _ip: asyncio.Protocol(), host=cfg.host, port=cfg.port, tls_mode=cfg.tls_mode,
            tls=self.tls, limits=LIMITS, refusals=self.refusals, name="kafka",
        )  # fmt: skip
        listener.open_protocol = self._opener(listener)
        self._listener = listener
        self.port = await listener.start()
        advertised = (cfg.advertised_host or cfg.host, cfg.advertised_port or self.port)
        self.partitions = Partitions(self.admin)
        self.states = ProducerStates()
        self.coordinator = Coordinator(
            min_session_ms=cfg.group_min_session_timeout_ms,
            max_session_ms=cfg.group_max_session_timeout_ms,
            initial_delay_ms=cfg.group_initial_rebalance_delay_ms,
        )
        self.data = DataPlane(cfg, self.admin, self.producer, self.partitions, self.states)
        self.control = ControlPlane(
            cfg, self.admin, self.partitions, self.coordinator, self.states, advertised
        )
        self.tasks.spawn(self._expire_members(), name="kafka-session-expiry")

    def _opener(self, listener: Listener) -> Callable[[str], asyncio.Protocol]:
        """Each accepted (and, with TLS, handshaken) connection as a stream pair served by
        :meth:`_serve`; one admitted by a TLS-sniffing listener gives its slot back at the end."""
        limit = self.config.max_request_bytes

        def open_protocol(ip: str) -> asyncio.Protocol:
            async def connected(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
                try:
                    await self._serve(r, w)
                finally:
                    if ip:
                        listener.release(ip)

            return asyncio.StreamReaderProtocol(asyncio.StreamReader(limit=limit), connected)

        return open_protocol

    async def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:  # no new connections from here on
            with contextlib.suppress(Exception):
                await asyncio.wait_for(listener.stop(), 5)
        for w in list(self._conns):
            w.close()
        # a connection parked in a handler (a rebalance, a long poll) sees no close: end it here
        # rather than leave it to the loop's shutdown
        handlers = list(self._handlers)
        for t in handlers:
            t.cancel()
        if handlers:
            await asyncio.wait(handlers, timeout=5)
        self.tasks.cancel()
        await self.tasks.close(timeout=5)
        if self.producer is not None:
            await self.producer.close()
        if self.admin is not None:
            await self.admin.close()

    async def _expire_members(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.coordinator.expire()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # asyncio.start_server's callback on Python 3.11 calls task.exception() on this task,
        # which raises (and logs a traceback) if the task ends cancelled: a cancel from stop()
        # ends it normally instead
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._serve_connection(reader, writer)
        except asyncio.CancelledError:
            pass
        finally:
            self._handlers.discard(task)

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._conns.add(writer)
        peer = writer.get_extra_info("peername")
        host = f"/{peer[0]}" if peer else "/unknown"
        session = Session(f"{peer[0]}:{peer[1]}" if peer else "unknown")
        if self.auth is not None:
            session.certified = cert_principal(writer)
            session.user = self.auth.certificate_user(session.certified)
        conn = ServerConnection(self.supported, max_frame=self.config.max_request_bytes)
        order = PartitionOrder()
        slots: asyncio.Queue[asyncio.Future[bytes | _Close | None] | None] = asyncio.Queue()
        out = self.tasks.spawn(self._write_in_order(slots, writer), name="kafka-conn-writer")
        produces: list[asyncio.Future[bytes | _Close | None]] = []
        limit = self.config.max_inflight_produce
        try:
            while not out.done():
                await self._muted(session)
                if not (data := await reader.read(256 * 1024)):
                    break
                for ev in conn.receive(data):
                    if session.muted_until:
                        await self._muted(session)
                    if out.done():
                        return  # the writer closed the connection (a failed request)
                    if isinstance(ev, Rejected):
                        log.info("kafka %s: %s", host, ev.reason)
                        slots.put_nowait(_ready(CLOSE if ev.reply is None else ev.reply))
                        if ev.reply is None:
                            return
                        continue
                    if isinstance(ev, RawToken):  # SASL after a SaslHandshake v0
                        reply = await self._raw_token(ev.data, session, conn)
                        slots.put_nowait(_ready(CLOSE if reply is None else reply))
                        if reply is None:
                            return
                        continue
                    if (
                        self.auth is not None
                        and session.user is None
                        and ev.api_key not in BEFORE_AUTH
                    ):
                        # Kafka closes a connection that skips authentication
                        self.auth.deny(
                            session, ev.api_key, "-", "-", "not authenticated", REASON_AUTH_FAILED
                        )
                        slots.put_nowait(_ready(CLOSE))
                        return
                    if ev.api_key == PRODUCE:
                        # pipelined: started now (tickets in arrival order), answered in order
                        produces = [f for f in produces if not f.done()]
                        if len(produces) >= limit:
                            await asyncio.wait(produces, return_when=asyncio.FIRST_COMPLETED)
                            produces = [f for f in produces if not f.done()]
                        task = self.tasks.spawn(self._guarded(ev, host, order, session))
                        produces.append(task)
                        slots.put_nowait(task)
                        continue
                    # any other request waits for the Produces before it and holds the
                    # connection until answered, as Kafka serves every request (it mutes the
                    # connection per request; no client relies on more)
                    if produces:
                        await asyncio.wait(produces)
                        produces = []
                    fut = _ready(await self._guarded(ev, host, order, session))
                    slots.put_nowait(fut)
                    if isinstance(fut.result(), _Close):
                        return
                    if session.failed:  # the SASL failure is answered, then the end
                        slots.put_nowait(_ready(CLOSE))
                        return
                await writer.drain()  # a client that does not read its answers is not read
        except KafkaCodecError as e:
            log.info("kafka %s: malformed request, closing: %s", host, e)
            slots.put_nowait(_ready(CLOSE))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            slots.put_nowait(None)  # the writer ends after the answers before this point
            try:
                await asyncio.wait([out])
            finally:
                self._conns.discard(writer)
                writer.close()

    async def _write_in_order(
        self,
        slots: asyncio.Queue[asyncio.Future[bytes | _Close | None] | None],
        writer: asyncio.StreamWriter,
    ) -> None:
        """Responses in request order (Kafka clients match them by position too)."""
        try:
            while (slot := await slots.get()) is not None:
                if not slot.done():
                    await writer.drain()  # flush what is ready while the next one works
                    await asyncio.wait([slot])
                reply = slot.result()
                if isinstance(reply, _Close):
                    break
                if reply is not None:
                    writer.write(reply)
                if slots.empty():
                    await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _guarded(
        self, req: Request, host: str, order: PartitionOrder, session: Session
    ) -> bytes | _Close | None:
        try:
            return await self._answer(req, host, order, session)
        except KafkaCodecError as e:
            log.info("kafka %s: closing: %s", host, e)
            return CLOSE

    async def _answer(
        self, req: Request, host: str, order: PartitionOrder, session: Session
    ) -> bytes | None:
        try:
            if self.authz is None or req.api_key in BEFORE_AUTH:
                body = await self._handle(req, host, order, session, req.body)
            else:
                body = await self.authz.run(
                    req.api_key, req.api_version, req.body, session,
                    lambda b: self._handle(req, host, order, session, b),
                )  # fmt: skip
        except KafkaCodecError:
            raise
        except Exception:
            log.exception("kafka: API %d v%d failed", req.api_key, req.api_version)
            raise KafkaCodecError("handler failed") from None  # close: no generic error body
        if self.quotas is not None and req.api_key in (PRODUCE, FETCH):
            self._throttle(req, body, session)
        if body is None:
            return None
        return encode_response(req.api_key, req.api_version, req.correlation_id, body)

    async def _handle(
        self, req: Request, host: str, order: PartitionOrder, session: Session, body: Body
    ) -> Body | None:
        key, v = req.api_key, req.api_version
        c = self.control
        if key == API_VERSIONS:
            return {"error_code": 0, "throttle_time_ms": 0, "api_keys": [
                {"api_key": k, "min_version": lo, "max_version": hi} for k, (lo, hi) in sorted(self.supported.items())
            ]}  # fmt: skip
        if key in (SASL_HANDSHAKE, SASL_AUTHENTICATE):
            return await self._sasl(key, body, session)
        if key == PRODUCE:
            result = await self.data.produce(body, order)
            return None if body["acks"] == 0 else result
        if key == FETCH:
            return await self.data.fetch(body)
        if key == LIST_OFFSETS:
            return await self.data.list_offsets(body)
        if key == METADATA:
            authz = self.authz
            if authz is None:
                return await c.metadata(body, v)
            return await c.metadata(
                body, v,
                lambda name: authz.may(session, METADATA, ResourceType.TOPIC, name, Action.CREATE),
                lambda name: authz.may(session, METADATA, ResourceType.TOPIC, name, Action.PUB,
                                       Action.SUB, Action.GET, audit=False),
            )  # fmt: skip
        if key == CREATE_TOPICS:
            return await c.create_topics(body)
        if key == DELETE_TOPICS:
            return await c.delete_topics(body)
        if key == FIND_COORDINATOR:
            return c.find_coordinator(body, v)
        if key == INIT_PRODUCER_ID:
            return c.init_producer_id(body)
        if key == OFFSET_COMMIT:
            return await c.offset_commit(body)
        if key == OFFSET_FETCH:
            return await c.offset_fetch(body, v)
        if key == JOIN_GROUP:
            return {
                "throttle_time_ms": 0,
                **await self.coordinator.join(body, v, req.client_id or "", host),
            }
        if key == SYNC_GROUP:
            return {"throttle_time_ms": 0, **await self.coordinator.sync(body)}
        if key == HEARTBEAT:
            return {"throttle_time_ms": 0, "error_code": self.coordinator.heartbeat(body)}
        if key == LEAVE_GROUP:
            ids = [body["member_id"]] if v < 3 else [m["member_id"] for m in body["members"]]
            codes = self.coordinator.leave(body["group_id"], ids)
            members = [{"member_id": i, "group_instance_id": None, "error_code": code}
                       for i, code in zip(ids, codes, strict=True)]  # fmt: skip
            top = codes[0] if v < 3 else 0
            return {"throttle_time_ms": 0, "error_code": top, "members": members}
        if key == LIST_GROUPS:
            return c.list_groups()
        if key == DESCRIBE_GROUPS:
            return c.describe_groups(body)
        raise KafkaCodecError(f"API {key} is advertised but has no handler")  # unreachable

    def _throttle(self, req: Request, body: Body | None, session: Session) -> None:
        """Charge a Produce (its request bytes) or a Fetch (the record bytes answered) to the
        user's quota (net/quota.py, Kafka's model: the user, else the address); over it, the
        answer says throttle_time_ms and the connection is not read for that long after it
        (Kafka's channel muting), so pipelined requests cannot slip past."""
        assert self.quotas is not None
        fetched = 0
        if req.api_key == FETCH and body is not None:
            fetched = sum(
                len(p["records"] or b"") for t in body["responses"] for p in t["partitions"]
            )
        delay = self.quotas.charge(req.api_key, req.size, fetched, session.user or session.ip)
        if delay > 0:
            self.refusals.counts[REASON_THROTTLED] += 1
            if body is not None:
                body["throttle_time_ms"] = int(delay * 1000)
            until = asyncio.get_running_loop().time() + delay
            session.muted_until = max(session.muted_until, until)

    @staticmethod
    async def _muted(session: Session) -> None:
        """Wait out a quota's throttle before reading the connection's next request."""
        left = session.muted_until - asyncio.get_running_loop().time()
        if left > 0:
            await asyncio.sleep(left)

    async def _raw_token(
        self, token: bytes, session: Session, conn: ServerConnection
    ) -> bytes | None:
        """A bare SASL token (SaslHandshake v0): the bare answer, or None to close (a failure
        closes the connection without an answer, as Kafka does for this framing)."""
        if self.auth is None or session.mechanism is None:
            return None
        code, answer, done = self.auth.authenticate(session, token)
        if code != 0:
            await asyncio.sleep(AUTH_FAILURE_DELAY_S)
            return None
        if not done:
            conn.raw_frames = 1  # SCRAM: the client-final comes bare too
        return raw_frame(answer)

    async def _sasl(self, key: int, body: Body, session: Session) -> Body:
        auth = self.auth
        if auth is None:  # not advertised then; a client sending it anyway is refused
            raise KafkaCodecError("SASL is not enabled on this listener")
        if key == SASL_HANDSHAKE:
            code = auth.handshake(session, body["mechanism"])
            session.failed = code != 0
            return {"error_code": code, "mechanisms": list(auth.mechanisms)}
        code, token, _done = auth.authenticate(session, body["auth_bytes"])
        if code != 0:
            session.failed = True
            await asyncio.sleep(AUTH_FAILURE_DELAY_S)  # Kafka's failed-authentication delay
            return {"error_code": code, "error_message": AUTH_FAILED_MESSAGE, "auth_bytes": b"",
                    "session_lifetime_ms": 0}  # fmt: skip
        return {"error_code": 0, "error_message": None, "auth_bytes": token,
                "session_lifetime_ms": 0}  # fmt: skip

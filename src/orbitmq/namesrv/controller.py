"""NamesrvController: one NameServer process's parts, started and stopped together.

A RemotingServer answers requests through the processor; a periodic scan drops brokers that
stopped registering; a broker whose registering connection closes is dropped at once (it
crashed or was stopped, and waiting 120 s would route producers to a dead address). NameServers
share nothing: each broker registers with every one of them, so running several side by side
needs no coordination.

Metrics use a registry per controller, so tests can run several NameServers in one process.
The Prometheus endpoint serves from its own thread; what it reads is either a counter
(thread-safe) or a ``len()`` of a table, which is atomic, so it never walks a table the event
loop is changing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from orbitmq.auth.server import ServerAuth
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import ConfigError
from orbitmq.namesrv.config import NamesrvConfig
from orbitmq.namesrv.processor import NamesrvProcessor
from orbitmq.namesrv.route_info import Clock, RouteInfoManager
from orbitmq.net.client import RemotingClient
from orbitmq.net.connection import Connection, Reply
from orbitmq.net.metrics import RefusalCollector
from orbitmq.net.server import RemotingServer
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.signature import Signer

log = logging.getLogger(__name__)


def _code_name(enum: type[RequestCode] | type[ResponseCode], code: int) -> str:
    try:
        return enum(code).name
    except ValueError:
        return str(code)


class NamesrvMetrics:
    """Counters and gauges of one NameServer, in their own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "orbitmq_namesrv_requests",
            "Requests by request code and response code",
            ["request", "response"],
            registry=r,
        )
        self.broker_removals = Counter(
            "orbitmq_namesrv_broker_removals",
            "Brokers dropped without unregistering, by reason (expired, disconnected)",
            ["reason"],
            registry=r,
        )
        self.brokers = Gauge("orbitmq_namesrv_brokers", "Registered brokers", registry=r)
        self.broker_groups = Gauge(
            "orbitmq_namesrv_broker_groups", "Registered broker names", registry=r
        )
        self.topics = Gauge("orbitmq_namesrv_topics", "Topics with routes", registry=r)
        self.clusters = Gauge("orbitmq_namesrv_clusters", "Clusters", registry=r)
        self.connections = Gauge("orbitmq_namesrv_connections", "Open connections", registry=r)


class NamesrvController:
    def __init__(self, config: NamesrvConfig, *, clock: Clock = time.monotonic) -> None:
        if not 0 <= config.port < 65536:
            raise ConfigError(f"port {config.port} is outside [0, 65535]")
        if config.broker_channel_expired_s <= 0 or config.scan_not_active_broker_interval_s <= 0:
            raise ConfigError("broker expiry and scan interval must be positive")
        self.config = config
        self.routes = RouteInfoManager(clock)
        self.auth = ServerAuth.open(
            enabled=config.auth_enabled,
            auth_file=config.auth_file,
            audit_file=config.audit_file,
            cluster=config.cluster,
            node="namesrv",
            controllers=config.auth_controller_addrs,
            admin_transport=config.admin_transport_needed(),
        )
        """Authentication, authorization and the user/ACL admin codes (docs/security.md)."""
        self.processor = NamesrvProcessor(self.routes, self.auth)
        self.metrics = NamesrvMetrics()
        self.server = RemotingServer(
            self._handle,
            host=config.host,
            port=config.port,
            name="namesrv",
            on_disconnect=self._on_disconnect,
            tls=config.tls_source(),
            tls_mode=config.tls_mode,
            limits=config.limits(),
        )
        self.metrics_port: int | None = None
        """The Prometheus endpoint's port once started (None: no endpoint)."""
        self._scan_task: asyncio.Task[None] | None = None
        self._auth_client: RemotingClient | None = None
        self._metrics_server: WSGIServer | None = None
        self._metrics_thread: threading.Thread | None = None
        m, routes, server = self.metrics, self.routes, self.server
        m.brokers.set_function(lambda: routes.broker_count)
        m.broker_groups.set_function(lambda: routes.broker_group_count)
        m.topics.set_function(lambda: routes.topic_count)
        m.clusters.set_function(lambda: routes.cluster_count)
        m.connections.set_function(lambda: len(server.connections))
        m.registry.register(RefusalCollector("namesrv", server.refusals))

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def address(self) -> str:
        """The "host:port" brokers and clients dial."""
        return self.server.address

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self.config.auth_controller_addrs:  # users and ACLs from the controller quorum
            self._auth_client = RemotingClient(
                name="namesrv-to-controller",
                signer=None
                if self.config.access_key is None
                else Signer(self.config.access_key, self.config.secret_key or ""),
            )
            await self.auth.start(self._auth_client)
        await self.server.start()
        try:
            if self.config.metrics_port is not None:
                self._start_metrics(self.config.metrics_port)
        except BaseException:
            await self.server.stop()
            raise
        self._scan_task = asyncio.get_running_loop().create_task(
            self._scan_loop(), name="namesrv-scan"
        )
        log.info("NameServer listening on %s", self.address)

    async def stop(self) -> None:
        task, self._scan_task = self._scan_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.server.stop()
        await self.auth.stop()
        if self._auth_client is not None:
            await self._auth_client.close()
        server, self._metrics_server = self._metrics_server, None
        thread, self._metrics_thread = self._metrics_thread, None
        if server is not None:
            await asyncio.to_thread(server.shutdown)
            server.server_close()
        if thread is not None:
            await asyncio.to_thread(thread.join, 5.0)

    def _start_metrics(self, port: int) -> None:
        server, thread = start_http_server(
            port,
            addr=self.config.host,
            registry=self.metrics.registry,
            **self.config.metrics_tls_options(),
        )
        self._metrics_server, self._metrics_thread = server, thread
        self.metrics_port = server.server_port
        log.info("NameServer metrics on %s:%d", self.config.host, self.metrics_port)

    # ------------------------------------------------------------------ events

    async def _handle(self, request: Frame, conn: Connection) -> Reply:
        try:
            reply = self.processor.process(request, conn)
        except Exception as exc:  # a bug: answer, log, keep serving
            log.exception("NameServer: request code %d failed", request.code)
            reply = request.reply(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
        await self.auth.penalize(reply, conn)  # a failed authentication waits (auth/server.py)
        name = (
            _code_name(RequestCode, request.code)
            if request.code in self.processor.codes
            else "UNSUPPORTED"
        )
        self.metrics.requests.labels(name, _code_name(ResponseCode, reply.code)).inc()
        return reply

    def _on_disconnect(self, conn: Connection) -> None:
        for addr in self.routes.connection_closed(conn):
            log.info("broker %s dropped: its connection closed (%s)", addr, conn.close_reason)
            self.metrics.broker_removals.labels("disconnected").inc()

    def scan_not_active_brokers(self) -> list[str]:
        """Drop brokers silent for longer than broker_channel_expired_s (the scan's step)."""
        gone = self.routes.scan_not_active_brokers(self.config.broker_channel_expired_s)
        for addr in gone:
            log.warning(
                "broker %s dropped: no registration for %.0f s",
                addr,
                self.config.broker_channel_expired_s,
            )
            self.metrics.broker_removals.labels("expired").inc()
        return gone

    async def _scan_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.scan_not_active_broker_interval_s)
            try:
                self.scan_not_active_brokers()
            except Exception:
                log.exception("NameServer: broker scan failed")

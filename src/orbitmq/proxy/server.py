"""ProxyServer: the gRPC server's lifecycle (start, bound address, stop).

One ``grpc.aio`` server on the caller's event loop: each client keeps a Telemetry stream open
per endpoint plus long-polling receives, which a thread-per-call server would pay a thread for.
The receive limit is raised to the largest body plus overhead (gRPC's 4 MiB default would refuse
a 4 MiB body). Server keepalive pings keep idle Telemetry streams alive through NAT. With TLS
in ``permissive`` mode (or with ``limit_connections``) clients reach gRPC through the front port
(``tls.PortMux``), which also applies the connection caps (``ProxyConfig.limits()``;
quotas.py); in ``required`` mode gRPC binds the public port with its own TLS (no relay). With ``metrics_port``
set, the RocketMQ proxy metrics (:mod:`orbitmq.proxy.metrics`) are served over HTTP on ``host``
by prometheus_client's server thread.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from wsgiref.simple_server import WSGIServer

import grpc
from prometheus_client import start_http_server

from orbitmq.common.errors import ConfigError
from orbitmq.proxy.config import ProxyConfig
from orbitmq.proxy.consumer_service import ConsumerRpcs
from orbitmq.proxy.context import ProxyContext
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.metrics import ProxyMetrics
from orbitmq.proxy.servicer import MessagingServicer
from orbitmq.proxy.tls import PortMux, read_pem, reloading_credentials, self_signed

log = logging.getLogger(__name__)

SESSION_SWEEP_S = 30.0


def _bind(server: grpc.aio.Server, bind: str, creds: grpc.ServerCredentials | None) -> int:
    try:
        port = (
            server.add_insecure_port(bind) if creds is None else server.add_secure_port(bind, creds)
        )
    except RuntimeError as exc:
        raise ConfigError(f"proxy cannot listen on {bind}: {exc}") from exc
    if port == 0:
        raise ConfigError(f"proxy cannot listen on {bind} (in use?)")
    return port


def endpoints_of(host: str, port: int) -> pb.Endpoints:
    """``host:port`` as protocol Endpoints (IPv4, IPv6 or a domain name)."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        scheme = pb.AddressScheme.DOMAIN_NAME
    else:
        scheme = pb.AddressScheme.IPv4 if ip.version == 4 else pb.AddressScheme.IPv6
    return pb.Endpoints(scheme=scheme, addresses=[pb.Address(host=host, port=port)])


class ProxyServer:
    """``server = ProxyServer(config); await server.start(); ...; await server.stop()``."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.port = 0
        self.ctx: ProxyContext | None = None
        self.servicer: MessagingServicer | None = None
        self._server: grpc.aio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._mux: PortMux | None = None
        self.metrics: ProxyMetrics | None = None
        self.metrics_port: int | None = None
        self._metrics_server: WSGIServer | None = None
        self.tls_cert_pem: bytes | None = None
        """The certificate TLS clients are shown (PEM), None with TLS off: a client that
        verifies can be given it when the proxy made its own."""

    @property
    def address(self) -> str:
        host = self.config.host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        return f"{host}:{self.port}"

    async def start(self) -> ProxyServer:
        cfg = self.config
        ctx = await ProxyContext.start(cfg)
        try:
            server = grpc.aio.server(
                options=[
                    ("grpc.max_receive_message_length", cfg.grpc_max_receive_bytes),
                    ("grpc.max_send_message_length", -1),
                    ("grpc.keepalive_time_ms", 60_000),
                    ("grpc.keepalive_timeout_ms", 20_000),
                    ("grpc.keepalive_permit_without_calls", 1),
                    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
                    ("grpc.http2.max_ping_strikes", 0),
                    # Off unless asked: a second proxy on a taken port must fail, not share it.
                    ("grpc.so_reuseport", 1 if cfg.reuse_port else 0),
                ]
            )
            host = "127.0.0.1" if cfg.host in ("0.0.0.0", "::", "") else cfg.host
            bind = f"[{cfg.host}]:{cfg.port}" if ":" in cfg.host else f"{cfg.host}:{cfg.port}"
            if cfg.tls_mode == "off" and not cfg.limit_connections:
                port = _bind(server, bind, None)
            elif cfg.tls_mode == "off":  # the front port only for its connection caps
                mux = PortMux("off", None, _bind(server, "127.0.0.1:0", None), cfg.limits())
                port = await mux.start(cfg.host, cfg.port)
                self._mux = mux
            else:
                if cfg.tls_cert_file and cfg.tls_key_file:  # the operator's: reloaded on change
                    creds, self.tls_cert_pem = reloading_credentials(
                        cfg.tls_cert_file, cfg.tls_key_file, cfg.tls_client_ca_file
                    )
                else:
                    identity = self_signed(["localhost", "127.0.0.1", host])
                    client_ca = read_pem(cfg.tls_client_ca_file) if cfg.tls_client_ca_file else None
                    creds = grpc.ssl_server_credentials(
                        [(identity.key_pem, identity.cert_pem)],
                        root_certificates=client_ca,
                        require_client_auth=client_ca is not None,
                    )
                    self.tls_cert_pem = identity.cert_pem
                if cfg.tls_mode == "required" and not cfg.limit_connections:
                    # gRPC's own TLS on the public port: no relay, the client's own address
                    # in context.peer(), its certificate in context.auth_context().
                    port = _bind(server, bind, creds)
                else:
                    tls_port = _bind(server, "127.0.0.1:0", creds)
                    plain_port = (
                        _bind(server, "127.0.0.1:0", None) if cfg.tls_mode == "permissive" else None
                    )
                    mux = PortMux(cfg.tls_mode, tls_port, plain_port, cfg.limits())
                    port = await mux.start(cfg.host, cfg.port, reuse_port=cfg.reuse_port)
                    self._mux = mux
            self.port = port
            servicer = MessagingServicer(ctx, ConsumerRpcs(ctx), endpoints_of(host, port))
            if self._mux is not None:  # clients reach gRPC from loopback through the mux
                servicer.peer_of = self._mux.peer_of
            metrics = ProxyMetrics(cfg.cluster, f"{host}:{port}")
            metrics.sessions = lambda: ctx.sessions
            server.add_generic_rpc_handlers((servicer.handler(metrics),))
            await servicer.start()
            try:
                await server.start()
            except BaseException:
                await servicer.close()
                raise
        except BaseException:
            if self._mux is not None:
                await self._mux.stop()
                self._mux = None
            await ctx.close()
            raise
        self.ctx, self.servicer, self._server = ctx, servicer, server
        self.metrics = metrics
        metrics.up = 1
        if cfg.metrics_port is not None:
            http, _thread = start_http_server(
                cfg.metrics_port, addr=cfg.host, registry=metrics.registry
            )
            self._metrics_server, self.metrics_port = http, http.server_port
        self._sweeper = asyncio.get_running_loop().create_task(
            self._sweep(), name="orbitmq-proxy-sessions"
        )
        log.info(
            "gRPC proxy listening on %s, TLS %s (NameServers %s)",
            self.address,
            cfg.tls_mode,
            ";".join(cfg.namesrv_addrs),
        )
        return self

    async def _sweep(self) -> None:
        assert self.ctx is not None
        while True:
            await asyncio.sleep(SESSION_SWEEP_S)
            for gone in self.ctx.sessions.expire():
                log.debug("client %s expired", gone.client_id)

    async def stop(self, grace_s: float = 1.0) -> None:
        """Stop accepting calls, end the open ones after ``grace_s``, close the broker clients."""
        server, self._server = self._server, None
        if self.metrics is not None:
            self.metrics.up = 0
        http, self._metrics_server = self._metrics_server, None
        if http is not None:
            await asyncio.to_thread(http.shutdown)
            http.server_close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
            self._sweeper = None
        if server is not None:
            if self.ctx is not None:
                for session in self.ctx.sessions:
                    for stream in session.streams:
                        stream.close()
            await server.stop(grace_s)
        if self._mux is not None:
            await self._mux.stop()
            self._mux = None
        if self.servicer is not None:
            await self.servicer.close()
            self.servicer = None
        if self.ctx is not None:
            await self.ctx.close()
            self.ctx = None

    async def __aenter__(self) -> ProxyServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

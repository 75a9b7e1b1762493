"""TLS and plaintext gRPC on one port, as Apache RocketMQ's Java proxy serves them.

The official clients disagree on the default: the Java client connects with TLS (and trusts any
server certificate), the Python client in plaintext. RocketMQ's proxy accepts both on port 8081
(``tls.server.mode`` permissive), so both work unchanged. grpcio binds a port either secure or
insecure, never both, so the public port belongs to :class:`PortMux`: it reads the first byte of
each connection, 0x16 (a TLS handshake record) or anything else (HTTP/2's preface starts with
``P``), and splices the connection to one of two loopback ports of the same gRPC server, one
with TLS and one without; nothing is parsed after the first byte. On Linux the splice is done
in the kernel (:mod:`orbitmq.proxy.splice`: ``os.splice`` through a pipe each way, no byte
copied into Python); elsewhere (or ``PortMux(splice=False)``) it is two asyncio Protocols
writing into each other's transports, with back-pressure both ways. In ``required`` mode the
proxy binds gRPC's own TLS port publicly and has no front port unless connection caps are
asked for (``limit_connections``; orbitmq.proxy.server).

Certificates: a PEM certificate and key the operator gives, or, when none is given, a
self-signed one made at start-up and kept in memory only (clients that trust any certificate,
like the Java client, need nothing more; clients that verify need the operator's certificate).
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import logging
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from orbitmq.common.errors import ConfigError
from orbitmq.common.tasks import TaskSet
from orbitmq.net.limits import Admission, Limits, Refusals
from orbitmq.proxy.splice import AVAILABLE as SPLICE_AVAILABLE
from orbitmq.proxy.splice import Splice

log = logging.getLogger(__name__)

__all__ = [
    "TLS_MODES",
    "PortMux",
    "TlsIdentity",
    "load_identity",
    "read_pem",
    "reloading_credentials",
    "self_signed",
]

TLS_MODES = ("off", "permissive", "required")
"""off: plaintext only, gRPC binds the public port itself (no splice). permissive: both on one
port. required: TLS only; plaintext connections are closed with a logged reason."""
TLS_RECORD_HANDSHAKE = 0x16
FIRST_BYTE_TIMEOUT_S = 30.0
"""A connection that sends nothing this long after connecting is closed."""


@dataclass(frozen=True, slots=True)
class TlsIdentity:
    cert_pem: bytes
    key_pem: bytes

    @classmethod
    def of(cls, cert: Any, key: Any) -> TlsIdentity:
        """PEM (PKCS#8, unencrypted key) of a ``cryptography`` certificate and private key."""
        from cryptography.hazmat.primitives import serialization

        return cls(
            cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )


def load_identity(cert_file: str, key_file: str) -> TlsIdentity:
    return TlsIdentity(read_pem(cert_file), read_pem(key_file))


def read_pem(path: str) -> bytes:
    """A PEM file the proxy needs (ConfigError naming it when it cannot be read)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    if b"-----BEGIN" not in data:
        raise ConfigError(f"{path} is not a PEM file")
    return data


def self_signed(hosts: Sequence[str]) -> TlsIdentity:
    """A one-year self-signed certificate (EC P-256) naming ``hosts`` (names or addresses)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "OrbitMQ proxy")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return TlsIdentity.of(cert, key)


RELOAD_CHECK_S = 0.5
"""How often, at most, a new connection makes the proxy look at its certificate files."""


def reloading_credentials(
    cert_file: str, key_file: str, client_ca_file: str | None
) -> tuple[Any, bytes]:
    """gRPC server credentials that pick up a changed certificate, key or client CA without a
    restart (grpcio asks before each new connection; the files are hashed at most every
    0.5 s; established connections keep theirs), and the current certificate PEM."""
    import hashlib
    import time

    import grpc

    files = [f for f in (cert_file, key_file, client_ca_file) if f]
    seen, checked = b"", 0.0

    def digest() -> bytes:
        h = hashlib.sha256()
        for name in files:
            try:
                h.update(Path(name).read_bytes())
            except OSError:
                h.update(b"\0missing\0")
        return h.digest()

    def configuration() -> Any:
        identity = load_identity(cert_file, key_file)
        client_ca = read_pem(client_ca_file) if client_ca_file else None
        return grpc.ssl_server_certificate_configuration(
            [(identity.key_pem, identity.cert_pem)], root_certificates=client_ca
        )

    def fetch() -> Any:
        nonlocal seen, checked
        now = time.monotonic()
        if now - checked < RELOAD_CHECK_S:
            return None
        checked = now
        current = digest()
        if current == seen:
            return None
        try:
            config = configuration()
        except ConfigError as exc:
            log.warning("proxy: TLS reload failed, keeping the previous certificate: %s", exc)
            return None
        seen = current
        log.info("proxy: TLS certificate reloaded from %s", ", ".join(files))
        return config

    seen = digest()
    creds = grpc.dynamic_ssl_server_credentials(
        configuration(), fetch, require_client_authentication=client_ca_file is not None
    )
    return creds, read_pem(cert_file)


class _Side(asyncio.Protocol):
    """One end of a splice: what it receives goes to the other end's transport."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.pending = bytearray()
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports have asyncio.Transport's methods without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def forward(self, data: bytes | bytearray) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None and not peer.closed:
            peer.transport.write(data)
        else:
            self.pending += data

    def data_received(self, data: bytes) -> None:
        self.forward(data)

    def pause_writing(self) -> None:  # our transport is full: stop reading the other end
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        peer = self.peer
        if peer is not None and peer.transport is not None and not peer.closed:
            peer.transport.close()


class _Front(_Side):
    """A client's connection to the public port: waits for the first byte, then picks a side."""

    def __init__(self, mux: PortMux) -> None:
        super().__init__()
        self.mux = mux
        self.chosen = False
        self.admitted: str | None = None
        """The address counted by the mux's admission (released when the connection goes)."""
        self._timer: asyncio.TimerHandle | None = None
        self.handed_off = False
        self.splice: Splice | None = None
        self.origin_port: int | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        admission = self.mux.admission
        if admission is not None:  # the caps, before a byte is read
            peer = transport.get_extra_info("peername")
            ip = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
            if not admission.admit(ip):
                transport.close()
                return
            self.admitted = ip
        self.mux.fronts.add(self)
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(FIRST_BYTE_TIMEOUT_S, self._silent)

    def _silent(self) -> None:
        if not self.chosen and self.transport is not None:
            log.debug(
                "proxy: closing %s, nothing sent in %.0f s", self._who(), FIRST_BYTE_TIMEOUT_S
            )
            self.transport.close()

    def _who(self) -> str:
        peer = self.transport.get_extra_info("peername") if self.transport else None
        return str(peer)

    def data_received(self, data: bytes) -> None:
        if self.chosen:
            self.forward(data)
            return
        self.chosen = True
        if self._timer is not None:
            self._timer.cancel()
        tls = data[0] == TLS_RECORD_HANDSHAKE
        target = self.mux.tls_port if tls else self.mux.plain_port
        if target is None:
            log.info(
                "proxy: closing %s: %s connections are not accepted (TLS mode %s)",
                self._who(),
                "TLS" if tls else "plaintext",
                self.mux.mode,
            )
            assert self.transport is not None
            self.transport.close()
            return
        self.pending += data
        assert self.transport is not None
        self.transport.pause_reading()
        self.mux.tasks.spawn(self._splice(target) if self.mux.splice else self._connect(target))

    async def _splice(self, port: int) -> None:
        """Join the client's socket to gRPC's port in the kernel (:mod:`orbitmq.proxy.splice`):
        the transport gives up a duplicate of its socket and closes; this front stays counted
        (``mux.fronts``, admission) until the splice ends."""
        loop = asyncio.get_running_loop()
        back = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        back.setblocking(False)
        try:
            await loop.sock_connect(back, ("127.0.0.1", port))
            back.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._note_origin(back.getsockname())  # before gRPC sees a byte of it
            await loop.sock_sendall(back, bytes(self.pending))
        except OSError as exc:
            back.close()
            log.warning("proxy: cannot reach its gRPC port %d for %s: %s", port, self._who(), exc)
            if self.transport is not None:
                self.transport.close()
            return
        self.pending.clear()
        transport = self.transport
        raw = transport.get_extra_info("socket") if transport is not None else None
        if self.closed or transport is None or raw is None:  # the client left meanwhile
            back.close()
            return
        front = socket.socket(fileno=os.dup(raw.fileno()))
        front.setblocking(False)
        self.handed_off = True
        transport.abort()  # its socket only; the duplicate keeps the connection
        self.splice = Splice(front, back, self._spliced, loop)

    def _spliced(self) -> None:
        self.splice = None
        self._release()

    async def _connect(self, port: int) -> None:
        loop = asyncio.get_running_loop()
        back = _Side()
        try:
            await loop.create_connection(lambda: back, "127.0.0.1", port)
        except OSError as exc:
            log.warning("proxy: cannot reach its gRPC port %d for %s: %s", port, self._who(), exc)
            if self.transport is not None:
                self.transport.close()
            return
        if self.closed:  # the client left while we connected
            assert back.transport is not None
            back.transport.close()
            return
        self.peer, back.peer = back, self
        assert back.transport is not None and self.transport is not None
        self._note_origin(back.transport.get_extra_info("sockname"))
        if self.pending:
            back.transport.write(bytes(self.pending))
            self.pending.clear()
        if back.pending:
            self.transport.write(bytes(back.pending))
            back.pending.clear()
        self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self.handed_off:  # the splice carries the connection now, and releases it
            return
        self._release()
        super().connection_lost(exc)

    def _note_origin(self, local: object) -> None:
        """Tell the mux which client the loopback connection from ``local`` carries."""
        peer = self.transport.get_extra_info("peername") if self.transport else None
        if isinstance(local, tuple) and isinstance(peer, tuple) and len(peer) >= 2:
            host = str(peer[0])
            kind = f"ipv6:[{host}]" if ":" in host else f"ipv4:{host}"
            self.origin_port = int(local[1])
            self.mux.origins[self.origin_port] = f"{kind}:{peer[1]}"

    def _release(self) -> None:
        if self.origin_port is not None:
            self.mux.origins.pop(self.origin_port, None)
            self.origin_port = None
        self.mux.fronts.discard(self)
        if self.admitted is not None and self.mux.admission is not None:
            self.mux.admission.release(self.admitted)
            self.admitted = None

    def close(self) -> None:
        """End this client's connection, spliced or not."""
        if self.splice is not None:
            self.splice.close()
        elif self.transport is not None:
            self.transport.close()


class PortMux:
    """The public port: TLS connections to ``tls_port``, the others to ``plain_port`` (either
    None: such connections are closed)."""

    def __init__(
        self,
        mode: str,
        tls_port: int | None,
        plain_port: int | None,
        limits: Limits | None = None,
        *,
        splice: bool = True,
    ) -> None:
        self.mode = mode
        self.tls_port = tls_port
        self.plain_port = plain_port
        self.refusals = Refusals()
        """Connections refused at accept, by reason (orbitmq.net.limits)."""
        self.admission = None if limits is None else Admission(limits, self.refusals)
        """Connection caps (None: every connection is accepted)."""
        self.fronts: set[_Front] = set()
        self.origins: dict[int, str] = {}
        """Local port of each loopback connection to gRPC -> its client, as gRPC names peers."""
        self.splice = splice and SPLICE_AVAILABLE
        """Carry connections with os.splice (kernel) rather than asyncio Protocols (Python)."""
        self.tasks = TaskSet("TLS splice", logger=log)
        self._server: asyncio.AbstractServer | None = None

    def peer_of(self, peer: str) -> str:
        """The client behind a gRPC peer string (``context.peer()``): for a connection this
        mux opened to gRPC, the client's own address; any other peer as it is."""
        if peer.startswith("ipv4:127.0.0.1:"):
            port = peer.rpartition(":")[2]
            if port.isdigit():
                return self.origins.get(int(port), peer)
        return peer

    async def start(self, host: str, port: int, *, reuse_port: bool = False) -> int:
        """Listen on ``host:port`` (0: a free port); returns the port. ``reuse_port``: share it
        with other processes (SO_REUSEPORT, ``orbitmq proxy --workers``)."""
        loop = asyncio.get_running_loop()
        factory: Callable[[], asyncio.Protocol] = lambda: _Front(self)  # noqa: E731
        try:
            self._server = await loop.create_server(
                factory, host or None, port, reuse_address=True, reuse_port=reuse_port or None
            )
        except OSError as exc:
            raise ConfigError(f"proxy cannot listen on {host}:{port}: {exc}") from exc
        sock = self._server.sockets[0]
        bound: int = sock.getsockname()[1]
        return bound

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for front in list(self.fronts):
            front.close()
        if server is not None:
            await server.wait_closed()
        await self.tasks.close()

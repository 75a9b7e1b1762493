"""Abuse limits of a Remoting listener, and the counters of what they refused.

Contract: :class:`Limits` is the per-listener policy (the numbers of the security brief, §6.1,
as defaults); :class:`Admission` decides, at accept time and before any byte is read, whether a
connection from an address may open (total cap, per-IP cap, per-IP new-connection rate as a
token bucket); :class:`Refusals` counts every refusal by reason, for metrics and tests.

Each refusal is a close with a logged reason: Remoting has no frame to answer before a request
is decoded, and a refused peer must not be able to make the server buffer an answer. The
reasons (also the metric label values) are the ``REASON_*`` constants.

Per-connection limits (pending requests and bytes, frame and idle timeouts) are enforced by
:class:`orbitmq.net.connection.Connection` and the server's sweeper with the same numbers.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

REASON_TOTAL = "max_connections"
REASON_PER_IP = "max_connections_per_ip"
REASON_RATE = "connection_rate"
REASON_PLAINTEXT = "plaintext_refused"
REASON_TLS = "tls_handshake_failed"
REASON_HANDSHAKE_TIMEOUT = "handshake_timeout"
REASON_FRAME_TIMEOUT = "frame_timeout"
REASON_IDLE = "idle_timeout"
REASON_PROTOCOL = "protocol_error"
REASON_PENDING = "pending_limit"
"""Not a close: reading paused because the peer has too many unanswered requests or bytes."""
REASON_THROTTLED = "quota_throttled"
"""Not a close: a response held (and reading paused) for a byte-rate quota."""
REASON_AUTH_FAILED = "auth_failed"
"""A failed authentication (the Kafka listener's SASL; counted, the connection then closed)."""
REASON_ACL_DENIED = "acl_denied"
"""Not a close: a request (or part of one) refused by the ACLs (the Kafka listener)."""
REASONS = (
    REASON_TOTAL,
    REASON_PER_IP,
    REASON_RATE,
    REASON_PLAINTEXT,
    REASON_TLS,
    REASON_HANDSHAKE_TIMEOUT,
    REASON_FRAME_TIMEOUT,
    REASON_IDLE,
    REASON_PROTOCOL,
    REASON_PENDING,
    REASON_THROTTLED,
    REASON_AUTH_FAILED,
    REASON_ACL_DENIED,
)


@dataclass(frozen=True, slots=True)
class Limits:
    max_connections: int = 20_000
    max_connections_per_ip: int = 1_000
    new_connections_per_ip_per_s: float = 200.0
    """Token-bucket rate of new connections from one address (burst: the same number)."""
    max_pending_requests: int = 256
    """Requests of one connection being handled at once; more pause reading (Kafka's muting)."""
    max_pending_bytes: int = 64 * 1024 * 1024
    """Bytes of request frames of one connection being handled; more pause reading."""
    handshake_timeout_s: float = 10.0
    """From accept to the first byte (and to the end of the TLS handshake)."""
    frame_timeout_s: float = 30.0
    """A frame whose first bytes came must be complete within this (slowloris)."""
    idle_timeout_s: float = 120.0
    """A connection with no traffic and nothing pending this long is closed (0: never)."""
    exempt_loopback: bool = True
    """Connections from 127.0.0.0/8 and ::1 skip the per-address caps (local tools and
    benchmarks open many; the brief's rule). The total cap still applies."""


class Refusals:
    """Counts by reason; ``total`` is the sum."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()

    def count(self, reason: str, who: str, detail: str = "") -> None:
        self.counts[reason] += 1
        log.info("refused %s: %s%s", who, reason, f" ({detail})" if detail else "")

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def _is_loopback(ip: str) -> bool:
    return ip.startswith("127.") or ip in ("::1", "::ffff:127.0.0.1")


class Admission:
    """Open connections per address and a new-connection token bucket per address."""

    def __init__(self, limits: Limits, refusals: Refusals) -> None:
        self.limits = limits
        self.refusals = refusals
        self.open: collections.Counter[str] = collections.Counter()
        self.total = 0
        self._buckets: dict[str, tuple[float, float]] = {}  # ip -> (tokens, at)

    def admit(self, ip: str) -> bool:
        lim = self.limits
        if self.total >= lim.max_connections:
            self.refusals.count(REASON_TOTAL, ip, f"{self.total} open")
            return False
        if lim.exempt_loopback and _is_loopback(ip):
            pass
        elif self.open[ip] >= lim.max_connections_per_ip:
            self.refusals.count(REASON_PER_IP, ip, f"{self.open[ip]} open")
            return False
        elif not self._take_token(ip):
            self.refusals.count(REASON_RATE, ip)
            return False
        self.open[ip] += 1
        self.total += 1
        return True

    def _take_token(self, ip: str) -> bool:
        rate = self.limits.new_connections_per_ip_per_s
        now = time.monotonic()
        tokens, at = self._buckets.get(ip, (rate, now))
        tokens = min(rate, tokens + (now - at) * rate)
        if tokens < 1.0:
            self._buckets[ip] = (tokens, now)
            return False
        self._buckets[ip] = (tokens - 1.0, now)
        if len(self._buckets) > 4 * self.limits.max_connections:
            # Forget full buckets (addresses quiet for a second or more): bounded memory.
            full = [k for k, (t, a) in self._buckets.items() if t + (now - a) * rate >= rate]
            for k in full:
                del self._buckets[k]
        return True

    def release(self, ip: str) -> None:
        self.total -= 1
        left = self.open[ip] - 1
        if left > 0:
            self.open[ip] = left
        else:
            del self.open[ip]

"""Produce and fetch byte-rate quotas, Kafka's model: throttle by delaying the response.

Contract: :class:`ByteQuotas` is given the request codes that produce (their request body
counts) and those that fetch (their response body counts), and a rate in bytes per second for
each (None: no quota). After a handler answered, the connection calls :meth:`ByteQuotas.charge`
with the request, the response size and the client's key; it returns how long to hold the
response. The connection then stops reading for that long (Kafka's channel muting, so
pipelined requests cannot slip past the throttle), sends the response with
``throttle_time_ms`` set, and resumes.

The account per (key, kind) is a token bucket of one second of burst: a client within its
quota is never delayed; one above it is delayed until its debt is repaid, so over any window
longer than a few seconds it gets its quota, whatever it sends. A delay is capped at
``max_delay_s`` (Kafka's ``quota.window.size`` times samples, here 30 s) so a single huge
request cannot block a connection for minutes.

The key is the connection's authenticated user (``Connection.attributes["principal"]``, set by
``auth/server.py`` from a verified signature's access key or certificate), else its verified
client certificate's principal, else the client's IP address.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


@dataclass
class ByteQuotas:
    produce_codes: frozenset[int]
    fetch_codes: frozenset[int]
    produce_bytes_per_s: float | None = None
    fetch_bytes_per_s: float | None = None
    max_delay_s: float = 30.0
    throttled: int = 0
    """Responses delayed so far (for metrics and tests)."""
    throttle_s: float = 0.0
    """Total delay imposed so far."""
    _buckets: dict[tuple[str, str], _Bucket] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        produce_codes: Iterable[int],
        fetch_codes: Iterable[int],
        produce_bytes_per_s: float | None,
        fetch_bytes_per_s: float | None,
    ) -> ByteQuotas | None:
        """None when neither rate is set (no per-request cost at all)."""
        if produce_bytes_per_s is None and fetch_bytes_per_s is None:
            return None
        return cls(
            frozenset(produce_codes), frozenset(fetch_codes), produce_bytes_per_s, fetch_bytes_per_s
        )

    def charge(self, code: int, request_bytes: int, response_bytes: int, key: str) -> float:
        """Seconds to hold this response (0: none)."""
        if code in self.produce_codes and self.produce_bytes_per_s is not None:
            return self._take(key, "produce", request_bytes, self.produce_bytes_per_s)
        if code in self.fetch_codes and self.fetch_bytes_per_s is not None:
            return self._take(key, "fetch", response_bytes, self.fetch_bytes_per_s)
        return 0.0

    def _take(self, key: str, kind: str, nbytes: int, rate: float) -> float:
        now = time.monotonic()
        bucket = self._buckets.get((key, kind))
        if bucket is None:
            bucket = self._buckets[(key, kind)] = _Bucket(rate, now)
            if len(self._buckets) > 100_000:  # bounded: forget the fullest (idle) accounts
                self._forget(now)
        bucket.tokens = min(rate, bucket.tokens + (now - bucket.at) * rate) - nbytes
        bucket.at = now
        if bucket.tokens >= 0:
            return 0.0
        delay = min(-bucket.tokens / rate, self.max_delay_s)
        self.throttled += 1
        self.throttle_s += delay
        return delay

    def _forget(self, now: float) -> None:
        for k, b in list(self._buckets.items()):
            if b.tokens >= 0 and now - b.at > 1.0:
                del self._buckets[k]

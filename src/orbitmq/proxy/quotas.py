"""The gRPC proxy's byte-rate quotas and connection caps, the same policies as the Remoting ports.

Contract:

- **Byte rates** (Kafka's model, :class:`orbitmq.net.quota.ByteQuotas`): ``produce`` counts the
  bodies a SendMessage carries, ``fetch`` the message bodies ReceiveMessage and PullMessage
  return, per client: its access key when ACL is on, else its IP address. Over its quota a
  client's response is held until its debt is repaid (a SendMessage answer; the next message of
  a receive stream), so concurrent calls of one client share one debt and cannot get past it;
  other clients are not slowed.
- **Connections**: :class:`orbitmq.net.limits.Admission` at the front port
  (``orbitmq.proxy.tls.PortMux``): total, per-address and new-connections-per-second caps; a
  refused connection is closed at accept, before a byte is read, and counted by reason.

Why not gRPC's own settings: grpcio has no per-address caps or byte rates; the front port and
the answer path are the two places the proxy controls.
"""

from __future__ import annotations

import asyncio
from typing import Any

from orbitmq.net.limits import REASON_THROTTLED, Refusals
from orbitmq.net.quota import ByteQuotas

_PRODUCE, _FETCH = 1, 2  # ByteQuotas' request codes, here the two kinds of gRPC calls


def peer_address(peer: str) -> str:
    """The IP address of a gRPC peer string (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``)."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6" and rest.startswith("["):
        return rest[1 : rest.find("]")]
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    return peer


class ProxyQuotas:
    """Byte-rate quotas of one proxy; ``refusals`` counts held responses (quota_throttled)."""

    def __init__(self, produce_bytes_per_s: float | None, fetch_bytes_per_s: float | None) -> None:
        self.quotas = ByteQuotas.of([_PRODUCE], [_FETCH], produce_bytes_per_s, fetch_bytes_per_s)
        self.refusals = Refusals()

    @property
    def active(self) -> bool:
        return self.quotas is not None

    async def _hold(self, kind: int, nbytes: int, key: str) -> float:
        if self.quotas is None or nbytes <= 0:
            return 0.0
        produce = kind == _PRODUCE
        delay = self.quotas.charge(kind, nbytes if produce else 0, 0 if produce else nbytes, key)
        if delay > 0:
            self.refusals.count(REASON_THROTTLED, key, f"{delay * 1000:.0f} ms")
            await asyncio.sleep(delay)
        return delay

    async def produce(self, nbytes: int, key: str) -> float:
        """Hold a SendMessage answer as long as ``key``'s produce quota needs (seconds)."""
        return await self._hold(_PRODUCE, nbytes, key)

    async def fetch(self, nbytes: int, key: str) -> float:
        """Hold the next message of a receive as long as ``key``'s fetch quota needs."""
        return await self._hold(_FETCH, nbytes, key)


def message_bytes(response: Any) -> int:
    """Body bytes of a ReceiveMessage/PullMessage response item (0: a status or timestamp)."""
    if response.WhichOneof("content") != "message":
        return 0
    return len(response.message.body)

"""``orbitmq bench auth``: what authentication and authorization add to one request.

It times, on this process and without a network, the server's one check
(``ServerAuth.before``: verify the signature, map the code, decide the ACL) on SEND_BATCH
frames of ``batch`` messages of ``size`` bytes, for authentication off, RocketMQ's v1
signature and OrbitMQ's v2 (with its nonce cache), and the client's signing. Divide by a
batch's produce time (``orbitmq bench produce``) for the share of throughput the checks cost
(the issue's target: under 5 %). ``body_hmac_us`` is the floor a body-covering signature
cannot go under: one bare HMAC of the body with the scheme's hash (SHA-1 for v1, SHA-256 for
v2); the rest of ``check_us`` is the check's own Python work.
"""

from __future__ import annotations

import hashlib
import hmac
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from orbitmq.auth.model import PolicyEntry, UserType
from orbitmq.auth.server import ServerAuth
from orbitmq.auth.store import AuthStore
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.messages import encode_send_body
from orbitmq.protocol.signature import Signer


class _Peer:
    peer = "127.0.0.1:40000"
    transport = None
    attributes: dict[str, object] = {}


@dataclass(frozen=True, slots=True)
class AuthBenchResult:
    mode: str
    requests: int
    check_us: float
    """Server check per request, microseconds."""
    sign_us: float
    """Client signing per request, microseconds (0 with authentication off)."""
    body_hmac_us: float = 0.0
    """One bare HMAC of the body with this mode's hash, microseconds (0 with authentication
    off): the part of ``check_us`` and ``sign_us`` no design removes."""


def run_auth_bench(count: int = 20_000, batch: int = 32, size: int = 1024) -> list[AuthBenchResult]:
    body = encode_send_body([b"x" * size] * batch, [b""] * batch)
    fields = {"topic": "BenchTopic", "queue_id": 0}
    out = []
    with tempfile.TemporaryDirectory(prefix="orbitmq-bench-auth-") as tmp:
        path = Path(tmp) / "auth.json"
        store = AuthStore(path)
        store.create_user("bench-admin", "bench-admin-secret", UserType.SUPER)  # no bootstrap
        store.create_user("bench", "bench-secret-1")
        store.put_entries(
            "bench", [PolicyEntry.make("Topic:Bench*", ["Pub"], "Allow")], create=True
        )
        for mode in ("off", "v1", "v2"):
            auth = ServerAuth.open(
                enabled=mode != "off", auth_file=path, audit_file=None, cluster="C", node="bench"
            )
            signer = None if mode == "off" else Signer("bench", "bench-secret-1", int(mode[1]))
            frames = [Frame(RequestCode.SEND_BATCH_MESSAGE, fields=dict(fields), body=body)
                      for _ in range(count)]  # fmt: skip
            started = time.perf_counter()
            if signer is not None:
                for f in frames:
                    signer(f)
            signed = time.perf_counter()
            for f in frames:
                if auth.before(f, _Peer()) is not None:
                    raise RuntimeError(f"bench request refused in mode {mode}")
            checked = time.perf_counter()
            sign_us = (signed - started) / count * 1e6 if signer is not None else 0.0
            floor = 0.0
            if mode != "off":
                digest = hashlib.sha1 if mode == "v1" else hashlib.sha256
                started = time.perf_counter()
                for _ in range(count):
                    hmac.new(b"bench-secret-1", body, digest).digest()
                floor = (time.perf_counter() - started) / count * 1e6
            check_us = (checked - signed) / count * 1e6
            out.append(AuthBenchResult(mode, count, check_us, sign_us, floor))
    return out

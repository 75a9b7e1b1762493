"""AK/SK request signatures on Remoting frames, sans-IO: what a client adds, what a server checks.

Two schemes, chosen by the client, checked by every broker and NameServer:

- **v1, RocketMQ's** (``AclClientRPCHook``/``AclUtils.combineRequestContent``): the header
  fields plus ``AccessKey`` are sorted by key, their *values only* are concatenated (no
  separators, ``Signature`` left out), the body is appended, and ``Signature`` is
  ``Base64(HMAC-SHA1(secret, content))``. OrbitMQ's header values are typed (msgpack) where
  RocketMQ's are Java strings, so a value is rendered as Java would print it: a str as is, an int
  in decimal, a bool ``true``/``false``, a float by ``repr``; nil is left out (RocketMQ skips
  null fields); a list or map as sorted-key JSON. v1 has RocketMQ's weaknesses, kept for
  compatibility: no timestamp (a captured request replays) and no request code in the content.
- **v2, OrbitMQ's own** (``SignatureVersion=2``): HMAC-SHA256 over a length-prefixed canonical
  form of the request code, every field (key and value) and the body, with ``Timestamp`` (ms)
  and ``Nonce`` among the signed fields; the server refuses a timestamp outside its window and a
  nonce it has seen inside that window (:class:`NonceCache`), so a request cannot be replayed,
  moved to another code or re-cut between fields.

A server compares signatures with ``hmac.compare_digest``. Nothing here logs or stores a secret.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import heapq
import hmac
import secrets
import struct
import time
from dataclasses import dataclass
from typing import Any

import msgspec

from orbitmq.protocol.frame import Frame

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
SIGNATURE_VERSION = "SignatureVersion"
TIMESTAMP = "Timestamp"
NONCE = "Nonce"
AUTH_FIELDS = frozenset(
    {ACCESS_KEY, SIGNATURE, SECURITY_TOKEN, SIGNATURE_VERSION, TIMESTAMP, NONCE}
)
"""Fields the signature adds; handlers never read them."""
REPLAY_WINDOW_MS = 5 * 60 * 1000
"""v2: a timestamp further than this from the server's clock is refused (the brief's 5 min)."""

_json = msgspec.json.Encoder(order="sorted")


def _text(value: Any) -> str | None:
    """A header value as RocketMQ's Java client would print it (None: left out)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return _json.encode(value).decode()


def _body(frame: Frame) -> bytes | bytearray | memoryview:
    return frame.body if frame.body is not None else b""


def v1_content(
    fields: dict[str, Any], body: bytes | bytearray | memoryview
) -> list[bytes | bytearray | memoryview]:
    """What v1 signs, as parts: the sorted values (``Signature`` excluded), then the body (not
    copied: a batch body is hashed in place)."""
    text = "".join(
        t for k in sorted(fields) if k != SIGNATURE and (t := _text(fields[k])) is not None
    )
    return [text.encode("utf-8"), body]


class SigningKey:
    """A secret made ready to sign: one HMAC object per scheme, keyed once and copied per
    request (``hmac.new`` re-derives the inner and outer pads from the key on every call; a copy
    of a keyed object does not). A server keeps one per user (``Guard``), a Signer one for its
    secret. The secret is kept out of ``repr``."""

    __slots__ = ("secret", "v1", "v2")

    def __init__(self, secret: str) -> None:
        key = secret.encode("utf-8")
        self.secret = secret
        self.v1 = hmac.new(key, digestmod=hashlib.sha1)
        self.v2 = hmac.new(key, digestmod=hashlib.sha256)

    def __repr__(self) -> str:
        return "SigningKey(...)"


def _key(secret: str | SigningKey) -> SigningKey:
    return secret if isinstance(secret, SigningKey) else SigningKey(secret)


@functools.lru_cache(maxsize=64)
def _signing_key(secret: str) -> SigningKey:
    """A client's keys, made once per secret (a process signs with a handful of secrets; the
    Signer, frozen and picklable, does not hold one itself)."""
    return SigningKey(secret)


def v1_signature(
    secret: str | SigningKey, fields: dict[str, Any], body: bytes | bytearray | memoryview
) -> str:
    mac = _key(secret).v1.copy()
    for part in v1_content(fields, body):
        mac.update(part)
    return base64.b64encode(mac.digest()).decode("ascii")


_U32 = struct.Struct(">I").pack


def v2_canonical(code: int, fields: dict[str, Any], body_len: int) -> bytes:
    """What v2 signs before the body, in one buffer (one HMAC update): the scheme tag and the
    code, every field as length-prefixed key and value (sorted by key, ``Signature`` left out),
    then the body's length."""
    parts = [b"ORBITMQ-HMAC-SHA256\x00", _U32(code)]
    for key in sorted(fields):
        if key == SIGNATURE:
            continue
        text = _text(fields[key])
        if text is not None:
            k, v = key.encode("utf-8"), text.encode("utf-8")
            parts += (_U32(len(k)), k, _U32(len(v)), v)
    parts.append(_U32(body_len))
    return b"".join(parts)


def v2_signature(
    secret: str | SigningKey,
    code: int,
    fields: dict[str, Any],
    body: bytes | bytearray | memoryview,
) -> str:
    mac = _key(secret).v2.copy()
    mac.update(
        v2_canonical(code, fields, len(body) if not isinstance(body, memoryview) else body.nbytes)
    )
    mac.update(body)
    return base64.b64encode(mac.digest()).decode("ascii")


@dataclass(frozen=True, slots=True)
class Signer:
    """Signs request frames with one access key: give it to a RemotingClient as ``signer``.

    ``version=1`` is RocketMQ's scheme, ``2`` OrbitMQ's with timestamp and nonce. The secret is
    kept out of ``repr`` so that a logged config or client never shows it."""

    access_key: str
    secret_key: str = ""
    version: int = 2
    security_token: str | None = None

    def __repr__(self) -> str:
        return f"Signer(access_key={self.access_key!r}, version={self.version})"

    def __call__(self, frame: Frame, now_ms: int | None = None) -> None:
        fields = frame.fields
        for key in AUTH_FIELDS:
            fields.pop(key, None)
        fields[ACCESS_KEY] = self.access_key
        if self.security_token is not None:
            fields[SECURITY_TOKEN] = self.security_token
        if self.version == 1:
            fields[SIGNATURE] = v1_signature(_signing_key(self.secret_key), fields, _body(frame))
            return
        fields[SIGNATURE_VERSION] = "2"
        fields[TIMESTAMP] = str(int(time.time() * 1000) if now_ms is None else now_ms)
        fields[NONCE] = secrets.token_hex(12)
        signing = _signing_key(self.secret_key)
        fields[SIGNATURE] = v2_signature(signing, frame.code, fields, _body(frame))


@dataclass(frozen=True, slots=True)
class Claim:
    """What a request says about who sent it: the access key, the signature and its scheme."""

    access_key: str
    signature: str
    version: int
    timestamp_ms: int | None
    nonce: str | None


class SignatureError(ValueError):
    """The request's authentication fields are malformed (not: the signature is wrong)."""


def claim_of(frame: Frame) -> Claim | None:
    """The signature fields of ``frame`` (None: it carries no AccessKey)."""
    fields = frame.fields
    ak = fields.get(ACCESS_KEY)
    if ak is None:
        return None
    sig = fields.get(SIGNATURE)
    if not isinstance(ak, str) or not ak or len(ak) > 256:
        raise SignatureError("AccessKey is not a string of 1..256 characters")
    if not isinstance(sig, str) or not sig or len(sig) > 256:
        raise SignatureError("Signature is missing")
    version = fields.get(SIGNATURE_VERSION)
    if version is None:
        return Claim(ak, sig, 1, None, None)
    if version != "2":
        raise SignatureError(f"SignatureVersion {str(version)[:8]!r} is not supported")
    ts, nonce = fields.get(TIMESTAMP), fields.get(NONCE)
    if not isinstance(ts, str) or not ts.isdigit() or len(ts) > 16:
        raise SignatureError("Timestamp is not milliseconds")
    if not isinstance(nonce, str) or not 8 <= len(nonce) <= 64:
        raise SignatureError("Nonce is not 8..64 characters")
    return Claim(ak, sig, 2, int(ts), nonce)


def verify(secret: str | SigningKey, frame: Frame, claim: Claim) -> bool:
    """True when ``claim.signature`` is the frame's signature under ``secret`` (constant time).
    A server passes the user's SigningKey (kept per user), so no key is derived per request."""
    if claim.version == 1:
        expected = v1_signature(secret, frame.fields, _body(frame))
    else:
        expected = v2_signature(secret, frame.code, frame.fields, _body(frame))
    return hmac.compare_digest(expected.encode("ascii"), claim.signature.encode("utf-8", "replace"))


class NonceCache:
    """v2 replay protection: the nonces of every request whose timestamp is still inside the
    window, so that each is admitted once.

    An entry is forgotten when its *request timestamp* leaves the window (a replay of it is then
    refused by the window itself); entries are kept by the request's timestamp, not by when they
    came, because a client whose clock runs ahead signs timestamps up to a window into the
    future. Bounded: when ``capacity`` entries are all still inside the window, the oldest is
    forgotten and every request not newer than it is refused from then on (``floor_ms``): under
    that flood the cache fails closed, never open."""

    def __init__(self, window_ms: int = REPLAY_WINDOW_MS, capacity: int = 200_000) -> None:
        self.window_ms = window_ms
        self.capacity = capacity
        self._seen: dict[tuple[str, str], int] = {}
        self._expiry: list[tuple[int, tuple[str, str]]] = []
        """(request timestamp, key), a min-heap: what leaves the window first."""
        self.floor_ms = -1
        """Requests with a timestamp at or below this are refused (set by overflow only)."""

    def admit(self, claim: Claim, now_ms: int) -> str | None:
        """None when the request is fresh (and remember it), else why it is refused."""
        assert claim.timestamp_ms is not None and claim.nonce is not None
        ts = claim.timestamp_ms
        if abs(now_ms - ts) > self.window_ms:
            return "Timestamp is outside the replay window"
        expiry, seen = self._expiry, self._seen
        while expiry and now_ms - expiry[0][0] > self.window_ms:
            seen.pop(heapq.heappop(expiry)[1], None)
        key = (claim.access_key, claim.nonce)
        if key in seen:
            return "Nonce was already used"
        if ts <= self.floor_ms:
            return "Timestamp is older than the replay cache holds (too many requests)"
        while len(seen) >= self.capacity:
            oldest_ts, oldest = heapq.heappop(expiry)
            seen.pop(oldest, None)
            self.floor_ms = max(self.floor_ms, oldest_ts)
        if ts <= self.floor_ms:
            return "Timestamp is older than the replay cache holds (too many requests)"
        seen[key] = ts
        heapq.heappush(expiry, (ts, key))
        return None

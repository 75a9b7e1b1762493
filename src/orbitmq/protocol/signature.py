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

import binascii
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


_U32 = struct.Struct(">I").pack
_PLAN_LIMIT = 1024
"""Signing plans kept (one per distinct tuple of field names; a process sees a few dozen)."""
_V1_ORDER: dict[tuple[str, ...], tuple[str, ...]] = {}
_V2_ORDER: dict[tuple[str, ...], tuple[tuple[str, bytes], ...]] = {}


def _v1_order(names: tuple[str, ...]) -> tuple[str, ...]:
    """The keys v1 renders for a frame with these field names, in signing order."""
    order = _V1_ORDER.get(names)
    if order is None:
        if len(_V1_ORDER) >= _PLAN_LIMIT:
            _V1_ORDER.clear()
        order = _V1_ORDER[names] = tuple(sorted(k for k in names if k != SIGNATURE))
    return order


def _v2_order(names: tuple[str, ...]) -> tuple[tuple[str, bytes], ...]:
    """(key, its length-prefixed encoding) for these field names, in signing order."""
    order = _V2_ORDER.get(names)
    if order is None:
        if len(_V2_ORDER) >= _PLAN_LIMIT:
            _V2_ORDER.clear()
        order = _V2_ORDER[names] = tuple(
            (k, _U32(len(b := k.encode("utf-8"))) + b) for k in sorted(names) if k != SIGNATURE
        )
    return order


def _v1_text(fields: dict[str, Any]) -> str:
    """The values v1 signs, concatenated: the key order comes from the plan of this tuple of
    field names (sorted once, not per request); a str value is taken as is and an int goes
    to ``repr`` (as ``_text`` would) without a Python call; a None renders as "" (left out,
    as RocketMQ skips null fields)."""
    return "".join(
        [
            v
            if (t := (v := fields[k]).__class__) is str
            else repr(v)
            if t is int
            else _text(v) or ""
            for k in _v1_order(tuple(fields))
        ]
    )


def v1_content(
    fields: dict[str, Any], body: bytes | bytearray | memoryview
) -> list[bytes | bytearray | memoryview]:
    """What v1 signs, as parts: the sorted values (``Signature`` excluded), then the body (not
    copied: a batch body is hashed in place)."""
    return [_v1_text(fields).encode("utf-8"), body]


def _pads(key: bytes, digest: Any) -> tuple[Any, Any]:
    """HMAC (RFC 2104) keyed once: the inner and outer hash objects after the padded key."""
    block = digest().block_size
    if len(key) > block:
        key = digest(key).digest()
    key = key.ljust(block, b"\0")
    return digest(key.translate(hmac.trans_36)), digest(key.translate(hmac.trans_5C))


class SigningKey:
    """A secret made ready to sign: per scheme, the HMAC's inner and outer hash states after
    the padded key, computed once and copied per request. The HMAC is RFC 2104's, byte for
    byte ``hmac.new``'s; computing it from ``hashlib`` objects keeps a request's MAC to a few C
    calls (``hmac.HMAC``'s copy, update and digest are Python methods, and ``hmac.new``
    re-derives both pads from the key on every call). A server keeps one per user
    (``Guard``), a Signer one for its secret. The secret is kept out of ``repr``."""

    __slots__ = ("_v1", "_v2", "secret")

    def __init__(self, secret: str) -> None:
        key = secret.encode("utf-8")
        self.secret = secret
        self._v1 = _pads(key, hashlib.sha1)
        self._v2 = _pads(key, hashlib.sha256)

    def __repr__(self) -> str:
        return "SigningKey(...)"

    def sign_v1(self, fields: dict[str, Any], body: bytes | bytearray | memoryview) -> str:
        """RocketMQ's v1 signature of ``fields`` and ``body`` (Base64 of HMAC-SHA1)."""
        inner, outer = self._v1
        mac = inner.copy()
        mac.update(_v1_text(fields).encode("utf-8"))
        mac.update(body)
        out = outer.copy()
        out.update(mac.digest())
        return binascii.b2a_base64(out.digest(), newline=False).decode("ascii")

    def sign_v2(
        self, code: int, fields: dict[str, Any], body: bytes | bytearray | memoryview
    ) -> str:
        """OrbitMQ's v2 signature (Base64 of HMAC-SHA256 over :func:`v2_canonical` and the body)."""
        inner, outer = self._v2
        mac = inner.copy()
        n = body.nbytes if isinstance(body, memoryview) else len(body)
        mac.update(v2_canonical(code, fields, n))
        mac.update(body)
        out = outer.copy()
        out.update(mac.digest())
        return binascii.b2a_base64(out.digest(), newline=False).decode("ascii")


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
    return _key(secret).sign_v1(fields, body)


_V2_TAG = b"ORBITMQ-HMAC-SHA256\x00"


def v2_canonical(code: int, fields: dict[str, Any], body_len: int) -> bytes:
    """What v2 signs before the body, in one buffer (one HMAC update): the scheme tag and the
    code, every field as length-prefixed key and value (sorted by key, ``Signature`` left out),
    then the body's length. The keys' order and encodings come from the plan of this tuple
    of field names."""
    parts = [_V2_TAG, _U32(code)]
    for key, prefix in _v2_order(tuple(fields)):
        value = fields[key]
        kind = value.__class__
        text = value if kind is str else repr(value) if kind is int else _text(value)
        if text is not None:
            v = text.encode("utf-8")
            parts += (prefix, _U32(len(v)), v)
    parts.append(_U32(body_len))
    return b"".join(parts)


def v2_signature(
    secret: str | SigningKey,
    code: int,
    fields: dict[str, Any],
    body: bytes | bytearray | memoryview,
) -> str:
    return _key(secret).sign_v2(code, fields, body)


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
        if not AUTH_FIELDS.isdisjoint(fields):  # a frame signed before (a retry): sign anew
            for key in AUTH_FIELDS:
                fields.pop(key, None)
        fields[ACCESS_KEY] = self.access_key
        if self.security_token is not None:
            fields[SECURITY_TOKEN] = self.security_token
        body = frame.body if frame.body is not None else b""
        if self.version == 1:
            fields[SIGNATURE] = _signing_key(self.secret_key).sign_v1(fields, body)
            return
        fields[SIGNATURE_VERSION] = "2"
        fields[TIMESTAMP] = str(int(time.time() * 1000) if now_ms is None else now_ms)
        fields[NONCE] = secrets.token_hex(12)
        fields[SIGNATURE] = _signing_key(self.secret_key).sign_v2(frame.code, fields, body)


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
    key = _key(secret)
    body = frame.body if frame.body is not None else b""
    if claim.version == 1:
        expected = key.sign_v1(frame.fields, body)
    else:
        expected = key.sign_v2(frame.code, frame.fields, body)
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

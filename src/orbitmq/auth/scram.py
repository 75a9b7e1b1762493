"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802 with RFC 7677's hash), the server side, for MQTT
5.0 enhanced authentication and Kafka's SASL: no I/O, one exchange per object.

It lives in ``orbitmq.auth`` (below both gateways) so the MQTT gateway and the Kafka listener
share one implementation. MQTT carries the SASL messages in Authentication Data (§4.12), as EMQX does: the client-first
message in CONNECT (or in an AUTH 0x19 to re-authenticate), the server-first in AUTH 0x18, the
client-final in AUTH 0x18, the server-final in CONNACK (or AUTH 0x00). The password is the ACL
user's secret key: the broker keeps secrets in the clear (RocketMQ's HMAC signatures need
them), so the salted password is derived here, with a salt per user made from a per-process
key (a client does not keep salts between connections, so they need not survive a restart).
An unknown or disabled user gets a salt made the same way and fails only at the proof, so the
exchange does not tell which names exist. No channel binding (gs2 ``n`` or ``y``; ``p`` is
refused); the secret is used as its UTF-8 bytes (no SASLprep: ACL secrets are ASCII). Kafka
carries the same messages in SaslAuthenticate requests (``orbitmq.kafka.sasl``); a client-first
message's extensions (KIP-86 ``tokenauth=...``) are refused, as no token store exists here.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Callable

METHOD = "SCRAM-SHA-256"
HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
"""mechanism name -> hashlib name."""
ITERATIONS = 4096
"""RFC 7677's minimum; the client derives the key with it once per exchange."""
_SALT_KEY = secrets.token_bytes(32)
_CACHE_MAX = 1024
_salted: dict[tuple[str, str, str], bytes] = {}


class ScramError(Exception):
    """The exchange failed: a malformed message, or a wrong proof."""


def _hmac(key: bytes, msg: bytes, hash_name: str = "sha256") -> bytes:
    return hmac.digest(key, msg, hash_name)


def salt_of(user: str) -> bytes:
    return _hmac(_SALT_KEY, user.encode())[:16]


def salted_password(user: str, secret: str, hash_name: str = "sha256") -> bytes:
    key = (user, secret, hash_name)
    got = _salted.get(key)
    if got is None:
        got = hashlib.pbkdf2_hmac(hash_name, secret.encode(), salt_of(user), ITERATIONS)
        if len(_salted) >= _CACHE_MAX:
            _salted.clear()
        _salted[key] = got
    return got


def _attrs(msg: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in msg.split(","):
        name, eq, value = part.partition("=")
        if len(name) != 1 or not eq:
            raise ScramError(f"malformed attribute {part[:20]!r}")
        out.setdefault(name, value)
    return out


def _saslname(value: str) -> str:
    if "=" in value.replace("=2C", "").replace("=3D", ""):
        raise ScramError("malformed user name")
    return value.replace("=2C", ",").replace("=3D", "=")


class ScramServer:
    """``first(client_first) -> server_first``, then ``final(client_final) -> (user,
    server_final)``; either raises ScramError. ``lookup(user)`` is the user's secret, None
    when the user may not log in. ``hash_name``: ``sha256`` or ``sha512`` (HASHES)."""

    def __init__(self, lookup: Callable[[str], str | None], hash_name: str = "sha256") -> None:
        if hash_name not in HASHES.values():
            raise ValueError(f"SCRAM hash {hash_name!r} is not one of {sorted(HASHES.values())}")
        self.lookup = lookup
        self.hash_name = hash_name
        self.user = ""
        self._secret: str | None = None
        self._gs2 = ""
        self._nonce = ""
        self._first_bare = ""
        self._server_first = ""

    @property
    def started(self) -> bool:
        """Whether the client-first message was taken (the server-first answered)."""
        return bool(self._server_first)

    def first(self, data: bytes) -> bytes:
        try:
            msg = data.decode()
        except UnicodeDecodeError as exc:
            raise ScramError("client-first is not UTF-8") from exc
        cb, sep1, rest = msg.partition(",")
        authzid, sep2, bare = rest.partition(",")
        if not (sep1 and sep2) or cb not in ("n", "y") or (authzid and authzid[:2] != "a="):
            raise ScramError("unsupported or malformed GS2 header (no channel binding here)")
        attrs = _attrs(bare)
        if "m" in attrs or "n" not in attrs or not attrs.get("r"):
            raise ScramError("client-first needs n= and r=")
        self.user = _saslname(attrs["n"])
        self._secret = self.lookup(self.user) if self.user else None
        self._gs2 = f"{cb},{authzid},"
        self._nonce = attrs["r"] + secrets.token_urlsafe(18)
        self._first_bare = bare
        salt = base64.b64encode(salt_of(self.user)).decode()
        self._server_first = f"r={self._nonce},s={salt},i={ITERATIONS}"
        return self._server_first.encode()

    def final(self, data: bytes) -> tuple[str, bytes]:
        if not self._server_first:
            raise ScramError("client-final before client-first")
        try:
            msg = data.decode()
        except UnicodeDecodeError as exc:
            raise ScramError("client-final is not UTF-8") from exc
        without_proof, sep, proof_part = msg.rpartition(",p=")
        if not sep:
            raise ScramError("client-final has no proof")
        attrs = _attrs(without_proof)
        if attrs.get("r") != self._nonce:
            raise ScramError("nonce mismatch")
        if attrs.get("c") != base64.b64encode(self._gs2.encode()).decode():
            raise ScramError("channel binding mismatch")
        try:
            proof = base64.b64decode(proof_part, validate=True)
        except ValueError as exc:
            raise ScramError("proof is not base64") from exc
        # the same work for an unknown user: no timing difference to probe names with
        secret, h = self._secret, self.hash_name
        salted = salted_password(self.user, secret if secret is not None else "\0", h)
        client_key = _hmac(salted, b"Client Key", h)
        stored_key = hashlib.new(h, client_key).digest()
        auth_message = f"{self._first_bare},{self._server_first},{without_proof}".encode()
        signature = _hmac(stored_key, auth_message, h)
        if len(proof) != len(signature):
            raise ScramError("wrong proof")
        derived = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        ok = hmac.compare_digest(hashlib.new(h, derived).digest(), stored_key)
        if not ok or secret is None:
            raise ScramError("wrong proof")
        server_sig = _hmac(_hmac(salted, b"Server Key", h), auth_message, h)
        return self.user, b"v=" + base64.b64encode(server_sig)


def client_proof(user: str, secret: str, client_first_bare: str, server_first: str,
                 gs2: str = "n,,", hash_name: str = "sha256") -> tuple[str, bytes]:  # fmt: skip
    """The client's side of the final step (for tests and tools): the client-final message
    and the server signature it must get back."""
    attrs, h = _attrs(server_first), hash_name
    salted = hashlib.pbkdf2_hmac(h, secret.encode(), base64.b64decode(attrs["s"]), int(attrs["i"]))
    client_key = _hmac(salted, b"Client Key", h)
    without_proof = f"c={base64.b64encode(gs2.encode()).decode()},r={attrs['r']}"
    auth_message = f"{client_first_bare},{server_first},{without_proof}".encode()
    signature = _hmac(hashlib.new(h, client_key).digest(), auth_message, h)
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    server_sig = _hmac(_hmac(salted, b"Server Key", h), auth_message, h)
    return f"{without_proof},p={base64.b64encode(proof).decode()}", server_sig

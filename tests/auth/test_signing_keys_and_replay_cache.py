"""Keys derived once per secret sign exactly as before, and the v2 replay cache never fails open
(a client clock ahead of the server's, a cache at capacity)."""

from __future__ import annotations

import hashlib
import hmac
import struct
from base64 import b64encode
from pathlib import Path

from orbitmq.auth.audit import AuditLog
from orbitmq.auth.guard import Guard
from orbitmq.auth.model import PolicyEntry
from orbitmq.auth.store import AuthStore
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.signature import (
    Claim,
    NonceCache,
    Signer,
    SigningKey,
    claim_of,
    v1_signature,
    v2_signature,
    verify,
)


def _lp(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def test_v2_wire_form_is_unchanged() -> None:
    """The canonical form, spelled out: old clients and servers keep interoperating."""
    fields = {"topic": "T", "queue_id": 3, "Signature": "ignored", "none": None}
    content = b"ORBITMQ-HMAC-SHA256\x00" + struct.pack(">I", 10)
    content += _lp(b"queue_id") + _lp(b"3") + _lp(b"topic") + _lp(b"T")
    content += struct.pack(">I", 4) + b"BODY"
    expected = b64encode(hmac.new(b"secret-key-1", content, hashlib.sha256).digest()).decode()
    assert v2_signature("secret-key-1", 10, fields, b"BODY") == expected
    key = SigningKey("secret-key-1")
    for _ in range(3):  # the keyed object is copied, never consumed
        assert v2_signature(key, 10, fields, b"BODY") == expected
        assert v2_signature(key, 10, fields, memoryview(b"BODY")) == expected
        assert v1_signature(key, fields, b"B") == v1_signature("secret-key-1", fields, b"B")
    assert "secret" not in repr(key)
    long_secret = "k" * 65  # longer than SHA-256's block: the key is hashed first
    expected = b64encode(hmac.new(long_secret.encode(), content, hashlib.sha256).digest()).decode()
    assert v2_signature(SigningKey(long_secret), 10, fields, b"BODY") == expected


def _reference_v1(secret: str, fields: dict[str, object], body: bytes) -> str:
    """RocketMQ's v1 as the official clients compute it, the slow way (hmac.new per request)."""
    text = ""
    for k in sorted(fields):
        v = fields[k]
        if k == "Signature" or v is None:
            continue
        if isinstance(v, bool):
            text += "true" if v else "false"
        elif isinstance(v, int):
            text += str(v)
        else:
            text += str(v)
    mac = hmac.new(secret.encode(), text.encode() + body, hashlib.sha1)
    return b64encode(mac.digest()).decode()


def test_cached_plans_and_pads_sign_as_the_reference() -> None:
    """The per-field-names plans and the precomputed HMAC pads give hmac.new's bytes: for
    secrets shorter and longer than a block (hashed first), for any field order, for frames
    whose field names change between calls (a retry adds fields, a plan is reused)."""
    long_secret = "s" * 100
    cases: list[dict[str, object]] = [
        {"topic": "T", "queue_id": 2, "born_ts": 1_795_699_213_671},
        {"born_ts": 5, "topic": "T", "queue_id": 2},  # same names, another order
        {"topic": "T", "flag": True, "none": None, "Signature": "old", "group": "g"},
        {"topic": "T", "b": False, "\u00e9": "\u00fc"},
        {},
    ]
    for secret in ("secret-key-1", long_secret):
        key = SigningKey(secret)
        for fields in cases * 2:
            for body in (b"", b"payload" * 50):
                want = _reference_v1(secret, fields, body)
                assert v1_signature(key, fields, body) == want
                assert v1_signature(secret, fields, memoryview(body)) == want
        frame = Frame(10, fields={"topic": "T", "queue_id": 1}, body=b"x" * 100)
        Signer("ak", secret, 1)(frame)
        claim = claim_of(frame)
        assert claim is not None and verify(key, frame, claim)
        want = _reference_v1(secret, dict(frame.fields), b"x" * 100)
        assert frame.fields["Signature"] == want


def test_verify_with_a_key_and_a_string_agree() -> None:
    frame = Frame(10, fields={"topic": "T"}, body=b"payload" * 100)
    Signer("ak", "secret-key-1")(frame)
    claim = claim_of(frame)
    assert claim is not None
    assert verify(SigningKey("secret-key-1"), frame, claim)
    assert not verify(SigningKey("secret-key-2"), frame, claim)


def _claim(nonce: str, ts: int) -> Claim:
    return Claim("ak", "sig", 2, ts, nonce)


def test_a_future_timestamp_is_remembered_until_it_leaves_the_window() -> None:
    """A client clock 900 ms ahead: the nonce must still be refused 1.5 s later (when the
    entry's arrival, not its timestamp, is older than the window)."""
    cache = NonceCache(window_ms=1000)
    assert cache.admit(_claim("n-future", 10_900), 10_000) is None
    assert cache.admit(_claim("n-future", 10_900), 11_500) == "Nonce was already used"
    assert cache.admit(_claim("n-future", 10_900), 12_000) is not None  # the window refuses it
    assert cache.admit(_claim("other-nonce", 12_000), 12_000) is None
    assert len(cache._seen) == 1  # the expired entry was forgotten


def test_a_full_cache_fails_closed() -> None:
    cache = NonceCache(window_ms=60_000, capacity=100)
    for i in range(100):
        assert cache.admit(_claim(f"nonce-{i:04d}", 1_000 + i), 5_000) is None
    assert cache.admit(_claim("nonce-new", 2_000), 5_000) is None  # evicts the oldest (ts 1000)
    assert cache.floor_ms == 1_000
    # the forgotten nonce cannot be replayed: its timestamp is at the floor
    assert cache.admit(_claim("nonce-0000", 1_000), 5_000) is not None
    for i in range(1, 100):  # and the remembered ones are still refused
        assert cache.admit(_claim(f"nonce-{i:04d}", 1_000 + i), 5_000) is not None
    assert len(cache._seen) <= 100


def test_guard_uses_a_changed_secret_at_once(tmp_path: Path) -> None:
    store = AuthStore(tmp_path / "auth.json")
    store.create_user("bench", "first-secret-1")
    store.put_entries("bench", [PolicyEntry.make("Topic:T", ["Pub"], "Allow")], create=True)
    guard = Guard(store, AuditLog(None, "n"), cluster="C", refresh_interval_s=0.0)

    class Peer:
        peer = "127.0.0.1:1"
        transport = None
        attributes: dict[str, object] = {}

    def send(secret: str) -> object:
        frame = Frame(RequestCode.SEND_MESSAGE, fields={"topic": "T", "queue_id": 0}, body=b"x")
        Signer("bench", secret)(frame)
        return guard.admit(frame, Peer())

    assert send("first-secret-1") == "bench"
    store.update_user("bench", secret="second-secret-2")
    guard.refresh()
    assert isinstance(send("first-secret-1"), Frame)  # the old key is not used any more
    assert send("second-secret-2") == "bench"


def test_remembered_verdicts_end_with_the_store_version(tmp_path: Path) -> None:
    """The Guard remembers an allowed (user, source IP, topic) per store version: a denial,
    a disabled user and a deleted user each refuse the very next request after the store is
    re-read; another topic or source address is decided afresh; refusals are never
    remembered (each is audited and counted)."""
    store = AuthStore(tmp_path / "auth.json")
    store.create_user("alice", "alice-secret-1")
    store.put_entries("alice", [PolicyEntry.make("Topic:T*", ["Pub"], "Allow")], create=True)
    guard = Guard(store, AuditLog(None, "n"), cluster="C", refresh_interval_s=0.0)

    class Peer:
        transport = None

        def __init__(self, peer: str) -> None:
            self.peer = peer
            self.attributes: dict[str, object] = {}

    here, there = Peer("127.0.0.1:1"), Peer("10.0.0.9:2")

    def send(topic: str, conn: Peer = here) -> object:
        frame = Frame(RequestCode.SEND_MESSAGE, fields={"topic": topic, "queue_id": 0}, body=b"x")
        Signer("alice", "alice-secret-1", 1)(frame)
        return guard.admit(frame, conn)

    for _ in range(3):
        assert send("T1") == "alice"
    assert isinstance(send("U1"), Frame)  # another topic: not covered by the remembered T1
    refused = guard.refused
    assert isinstance(send("U1"), Frame) and guard.refused == refused + 1  # not remembered
    assert send("T1", there) == "alice"
    store.put_entries(
        "alice", [PolicyEntry.make("Topic:T1", ["Pub"], "Deny", ["10.0.0.0/8"])], create=False
    )
    guard.refresh()
    assert isinstance(send("T1", there), Frame)  # the literal denial, for 10/8 only, wins
    assert send("T1") == "alice"  # ... and does not apply from here
    assert send("T2", there) == "alice"
    store.update_user("alice", enabled=False)
    guard.refresh()
    assert isinstance(send("T2"), Frame) and isinstance(send("T2", there), Frame)
    store.update_user("alice", enabled=True)
    guard.refresh()
    assert send("T2") == "alice"
    store.delete_user("alice")
    guard.refresh()
    assert isinstance(send("T2"), Frame)

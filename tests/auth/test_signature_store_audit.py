"""Request signatures (RocketMQ v1 and OrbitMQ v2), the auth store and the audit chain."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from pathlib import Path

import pytest

from orbitmq.auth.audit import AuditLog
from orbitmq.auth.audit import verify as verify_chain
from orbitmq.auth.model import PolicyEntry, Resource, UserType
from orbitmq.auth.store import AuthStore, ExistsError, NotFoundError
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.signature import NonceCache, Signer, claim_of, v1_signature, verify


def test_v1_is_rocketmqs_algorithm() -> None:
    """Sorted values only, no separators, Signature left out, body appended, Base64 HMAC-SHA1."""
    frame = Frame(10, fields={"topic": "T", "queue_id": 3, "born_ts": 12, "flag": True})
    Signer("ak", "secret-key-1", version=1)(frame)
    content = b"ak" + b"12" + b"true" + b"3" + b"T"  # AccessKey, born_ts, flag, queue_id, topic
    expected = base64.b64encode(hmac.new(b"secret-key-1", content, hashlib.sha1).digest()).decode()
    assert frame.fields["Signature"] == expected
    claim = claim_of(frame)
    assert claim is not None and claim.version == 1
    assert verify("secret-key-1", frame, claim)
    assert not verify("secret-key-2", frame, claim)
    frame.body = b"x"
    assert not verify("secret-key-1", frame, claim)
    assert (
        v1_signature("k", {"a": "1"}, b"B")
        == base64.b64encode(hmac.new(b"k", b"1B", hashlib.sha1).digest()).decode()
    )


def test_v2_binds_code_fields_and_body_and_refuses_replays() -> None:
    frame = Frame(10, fields={"topic": "T"}, body=b"payload")
    Signer("ak", "secret-key-1")(frame, now_ms=1_000_000)
    claim = claim_of(frame)
    assert claim is not None and claim.version == 2
    assert verify("secret-key-1", frame, claim)
    for tamper in ({"code": 11}, {"body": b"payloaX"}, {"fields": {**frame.fields, "topic": "U"}}):
        other = Frame(
            **{"code": frame.code, "fields": dict(frame.fields), "body": frame.body, **tamper}
        )
        assert not verify("secret-key-1", other, claim_of(other))  # type: ignore[arg-type]
    nonces = NonceCache(window_ms=1000)
    assert nonces.admit(claim, 1_000_500) is None
    assert nonces.admit(claim, 1_000_600) == "Nonce was already used"
    late = Frame(10, fields={"topic": "T"})
    Signer("ak", "secret-key-1")(late, now_ms=1_000_000)
    assert nonces.admit(claim_of(late), 1_002_000) is not None  # type: ignore[arg-type]
    assert "secret" not in repr(Signer("ak", "secret-key-1"))


def test_store_keeps_secrets_encrypted_and_reloads(tmp_path: Path) -> None:
    path = tmp_path / "auth.json"
    a = AuthStore(path)
    b = AuthStore(path)  # another server on the same file
    a.create_user("alice", "alice-secret-123")
    with pytest.raises(ExistsError):
        a.create_user("alice", "alice-secret-123")
    assert b"alice-secret-123" not in path.read_bytes()
    assert os.stat(path).st_mode & 0o077 == 0
    assert os.stat(tmp_path / "auth.json.key").st_mode & 0o077 == 0
    assert b.refresh() and b.secret("alice") == "alice-secret-123"
    before, after = a.put_entries(
        "alice", [PolicyEntry.make("Topic:t", ["Pub"], "Allow")], create=True
    )
    assert before == [] and [str(x.resource) for x in after] == ["Topic:t"]
    a.put_entries("alice", [PolicyEntry.make("Topic:t", ["Sub"], "Deny")], create=False)
    b.refresh()
    (entry,) = b.acl("alice")
    assert entry.decision.value == "Deny"  # same resource: replaced
    a.delete_entries("alice", [Resource.parse("Topic:t")])
    with pytest.raises(NotFoundError):
        a.delete_entries("alice", None)
    a.update_user("alice", enabled=False)
    b.refresh()
    user = b.user("alice")
    assert user is not None and not user.enabled
    a.delete_user("alice")
    b.refresh()
    assert b.user("alice") is None and b.secret("alice") is None
    assert a.version == b.version == json.loads(path.read_text())["version"]


def test_bootstrap_creates_one_admin(tmp_path: Path) -> None:
    store = AuthStore(tmp_path / "auth.json")
    secret = store.bootstrap("admin", None)
    assert secret is not None and len(secret) >= 24
    assert store.bootstrap("admin", None) is None  # already has a Super user
    user = store.user("admin")
    assert user is not None and user.type is UserType.SUPER
    assert store.secret("admin") == secret


def test_audit_chain_detects_edits(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, "node")
    for i in range(5):
        log.admin(
            principal="admin",
            source="127.0.0.1:1",
            code=3001,
            resource=f"u{i}",
            action="AUTH_CREATE_USER",
            result="done",
            before=None,
            after={"username": f"u{i}"},
        )
    log.deny(
        principal="bob",
        source="127.0.0.1:2",
        code=10,
        resource="Topic:t",
        action="Pub",
        reason="no",
    )
    for _ in range(100):  # aggregated: one line per second per (principal, resource, action)
        log.deny(
            principal="bob",
            source="127.0.0.1:2",
            code=10,
            resource="Topic:t",
            action="Pub",
            reason="no",
        )
    assert verify_chain(path).broken_at is None
    assert verify_chain(path).lines == 6
    # a reopened log continues the chain
    AuditLog(path, "node").admin(
        principal="a",
        source="s",
        code=3003,
        resource="u0",
        action="AUTH_DELETE_USER",
        result="done",
    )
    assert verify_chain(path).broken_at is None
    lines = path.read_bytes().splitlines()
    lines[2] = lines[2].replace(b'"u2"', b'"uX"')
    path.write_bytes(b"\n".join(lines) + b"\n")
    assert verify_chain(path).broken_at == 4

"""The Guard's pieces without a server: mTLS principals, and many admin changes audited one
line each (brief T13)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from orbitmq.auth.admin import AuthAdmin
from orbitmq.auth.audit import AuditLog, verify
from orbitmq.auth.guard import Guard, cert_principal
from orbitmq.auth.model import PolicyEntry, UserType
from orbitmq.auth.store import AuthStore
from orbitmq.common.codes import ResponseCode
from orbitmq.protocol import auth_requests as rq
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.messages import encode_send_body


class _Transport:
    def __init__(self, cert: dict[str, Any] | None) -> None:
        self.cert = cert

    def get_extra_info(self, name: str) -> Any:
        return self.cert if name == "peercert" else None


class _Conn:
    def __init__(self, cert: dict[str, Any] | None = None, principal: str | None = None) -> None:
        self.peer = "10.1.2.3:5555"
        self.transport = _Transport(cert)
        if principal is not None:
            self.principal = principal


def test_certificate_principals(tmp_path: Path) -> None:
    san = {"subjectAltName": (("DNS", "alice"), ("DNS", "other")), "subject": ()}
    cn = {"subject": ((("organizationName", "x"),), (("commonName", "bob"),))}
    assert cert_principal(_Conn(san)) == "alice"
    assert cert_principal(_Conn(cn)) == "bob"
    assert cert_principal(_Conn(None)) is None
    assert cert_principal(_Conn(None, principal="carol")) == "carol"
    store = AuthStore(tmp_path / "auth.json")
    store.create_user("alice", "alice-secret-1")
    store.put_entries("alice", [PolicyEntry.make("Topic:t", ["Pub"], "Allow")], create=True)
    guard = Guard(store, AuditLog(None, "test"), cluster="C")
    send = Frame(10, fields={"topic": "t", "queue_id": 0}, body=encode_send_body([b"x"], [b""]))
    assert guard.admit(send, _Conn(san)) == "alice"  # no AccessKey: the certificate speaks
    refused = guard.admit(send, _Conn(cn))  # bob is no user
    assert isinstance(refused, Frame) and refused.code == ResponseCode.NO_PERMISSION
    other = Frame(10, fields={"topic": "u", "queue_id": 0}, body=send.body)
    refused = guard.admit(other, _Conn(san))
    assert isinstance(refused, Frame) and refused.code == ResponseCode.NO_PERMISSION


def test_every_admin_change_is_one_chained_line_without_secrets(tmp_path: Path) -> None:
    count = int(os.environ.get("ORBITMQ_TEST_AUDIT_CHANGES", "60"))
    store = AuthStore(tmp_path / "auth.json")
    store.create_user("root", "root-secret-00", UserType.SUPER)
    audit_path = tmp_path / "audit.jsonl"
    admin = AuthAdmin(store, AuditLog(audit_path, "test"))
    secrets: list[str] = []
    for i in range(count):
        if i % 3 == 0:
            secret = f"user-{i}-secret"
            secrets.append(secret)
            frame = rq.CreateUserRequest(username=f"u{i}", password=secret).frame()
        elif i % 3 == 1:
            frame = rq.CreateAclRequest(
                subject=f"User:u{i - 1}", resources=[f"Topic:t{i}"], actions=["Pub"]
            ).frame()
        else:
            secret = f"new-{i}-secret"
            secrets.append(secret)
            frame = rq.UpdateUserRequest(username=f"u{i - 2}", password=secret).frame()
        assert admin.handle(frame, "root", "127.0.0.1:1").code == ResponseCode.SUCCESS
    lines = audit_path.read_text().splitlines()
    assert len(lines) == count
    assert verify(audit_path).broken_at is None
    records = [json.loads(line) for line in lines]
    assert all(r["principal"] == "root" and r["source"] == "127.0.0.1:1" for r in records)
    assert records[1]["after"][0]["resource"] == "Topic:t1"
    text = audit_path.read_text()
    assert not [s for s in secrets if s in text]

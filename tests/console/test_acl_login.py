"""Console login with the cluster's ACL users (``acl_login``) against a NameServer and a broker
with authentication on: a Super user is an admin, a Normal user a viewer (reads, no writes), a
wrong secret or an unknown user is refused and audited; the console signs its own requests
with ``access_key``/``secret_key``. Against a cluster that does not authenticate, ACL logins
are refused (any secret would pass)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from orbitmq.console.app import create_app
from orbitmq.console.config import ConsoleConfig
from orbitmq.testing import run_namesrv
from tests.auth.conftest import SECRETS, Cluster, cluster  # noqa: F401  # the fixture

pytestmark = pytest.mark.timeout(120)


def _csrf(html: str) -> str:
    m = re.search(r'name="csrf-token" content="([0-9a-f]+)"', html)
    assert m, html[:400]
    return m.group(1)


async def test_acl_users_log_in_with_their_roles(cluster: Cluster, tmp_path: Path) -> None:  # noqa: F811
    audit = tmp_path / "console-audit.jsonl"
    cfg = ConsoleConfig(namesrv_addrs=(cluster.namesrv.address,), port=0, acl_login=True,
                        access_key="admin", secret_key=SECRETS["admin"], audit_log=str(audit))  # fmt: skip

    def run() -> None:
        with TestClient(create_app(cfg)) as web:
            assert web.get("/", follow_redirects=False).headers["location"] == "/login"
            for user, secret in (("alice", "not-hers"), ("nobody", "x"), ("admin", "")):
                refused = web.post("/login", data={"user": user, "password": secret})
                assert refused.status_code == 403 and "wrong user or password" in refused.text
            ok = web.post("/login", data={"user": "alice", "password": SECRETS["alice"]})
            assert ok.status_code == 200 and "alice (viewer)" in ok.text, ok.text[:600]
            assert "broker-a" in ok.text  # the console reads the cluster with its own key
            token = _csrf(ok.text)
            assert web.post("/topics", data={"name": "by-alice", "csrf": token}).status_code == 403
            web.post("/logout")
            ok = web.post("/login", data={"user": "admin", "password": SECRETS["admin"]})
            assert "admin (admin)" in ok.text
            made = web.post("/topics", data={"name": "by-admin", "queues": "1",
                                             "csrf": _csrf(ok.text)})  # fmt: skip
            assert "result=ok" in str(made.url), made.url
        lines = audit.read_text()
        assert lines.count('"action":"login"') == 5 and lines.count('"result":"denied"') == 3
        assert (
            '"user":"alice","ip":"testclient","action":"login","target":"console","result":"ok: viewer"'
            in lines
        )

    await asyncio.to_thread(run)


async def test_acl_login_refused_when_the_cluster_does_not_authenticate(tmp_path: Path) -> None:
    async with run_namesrv() as ns:
        cfg = ConsoleConfig(namesrv_addrs=(ns.address,), port=0, acl_login=True,
                            audit_log=str(tmp_path / "a.jsonl"))  # fmt: skip

        def run() -> str:
            with TestClient(create_app(cfg)) as web:
                resp = web.post("/login", data={"user": "anyone", "password": "anything"})
                assert resp.status_code == 403
                return resp.text

        text = await asyncio.to_thread(run)
    assert "does not authenticate" in text

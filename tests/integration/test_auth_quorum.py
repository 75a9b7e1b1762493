"""Users and ACLs in the controller quorum, as processes (``auth_store = "raft"``): three
NameServers each with a controller node, a broker with auth on that follows the quorum
(``auth_controller_addrs``), and the ``orbitmq user|acl`` commands sent to controller nodes.

Checked: a user and an ACL created through one controller node are enforced by the broker; the
user disabled -> the broker refuses it within 1 s of the command's answer; the controller
leader SIGKILLed (with its NameServer) -> the users are still there, a change through a
surviving node reaches the broker.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orbitmq.client import AdminConfig, AsyncAdminClient
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MQError
from orbitmq.controller.client import ControllerClient
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.signature import Signer
from tests.broker.test_broker import send_frame
from tests.harness import REPO, ProcessCluster
from tests.integration.test_ha_auth import namesrvs_with_controllers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
KEY = "22" * 32
ADMIN_SECRET = "admin-secret-0"
ALICE_SECRET = "alice-secret-1"
TOPIC = "Quorum"
ADMIN = AdminConfig(access_key="admin", secret_key=ADMIN_SECRET)


def cli(target: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBITMQ_")}
    env.update(ORBITMQ_ACCESS_KEY="admin", ORBITMQ_SECRET_KEY=ADMIN_SECRET)
    return subprocess.run(
        [sys.executable, "-m", "orbitmq", *args, "--controller", target],
        input=stdin, capture_output=True, text=True, timeout=30, cwd=REPO, env=env,
    )  # fmt: skip


async def until_cli(target: str, *args: str, stdin: str = "", timeout_s: float = 20) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        done = await asyncio.to_thread(cli, target, *args, stdin=stdin)
        if done.returncode == 0:
            return done.stdout
        assert time.monotonic() < deadline, done.stdout + done.stderr
        await asyncio.sleep(0.3)


async def admin_call(
    target: str, what: str, *args: object, timeout_s: float = 20, **kwargs: object
) -> object:
    """``AsyncAdminClient(target).<what>(...)``, retried until it answers (an election)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            async with AsyncAdminClient(target, ADMIN) as admin:
                return await getattr(admin, what)(*args, **kwargs)
        except MQError as exc:
            assert time.monotonic() < deadline, f"{what} on {target}: {exc}"
            await asyncio.sleep(0.3)


async def test_users_in_the_quorum_with_processes(
    cluster: ProcessCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORBITMQ_AUTH_KEY", KEY)  # every server seals with the same key
    monkeypatch.setenv("ORBITMQ_AUTH_ADMIN_SECRET", ADMIN_SECRET)
    namesrvs, addrs = namesrvs_with_controllers(
        cluster, tmp_path, {}, {"auth_enabled": True, "auth_store": "raft"}
    )
    broker = cluster.broker(
        "q0",
        [],
        settings={
            "broker": {
                "auth_enabled": True,
                "auth_file": str(tmp_path / "q0-auth-cache.json"),
                "auth_controller_addrs": addrs,
                "access_key": "admin",
                "secret_key": ADMIN_SECRET,
            }
        },
    )
    alice = RemotingClient(signer=Signer("alice", ALICE_SECRET))
    ctl = ControllerClient(addrs, access_key="admin", secret_key=ADMIN_SECRET)

    async def alice_sends() -> bool:
        resp = await alice.invoke(broker.address, send_frame(TOPIC, [b"m"]), timeout=5.0)
        return resp.code == ResponseCode.SUCCESS

    async def until(cond: object, timeout_s: float, what: str) -> float:
        started = time.monotonic()
        assert callable(cond)
        while not await cond():
            assert time.monotonic() - started < timeout_s, what
            await asyncio.sleep(0.05)
        return time.monotonic() - started

    t0 = time.monotonic()
    try:
        await admin_call(addrs[1], "list_users", "")  # the admin was bootstrapped
        await until_cli(addrs[1], "user", "create", "-u", "alice", "-p", "-",
                        stdin=ALICE_SECRET + "\n")  # fmt: skip
        await admin_call(addrs[2], "create_acl", "User:alice", [f"Topic:{TOPIC}"],
                         ["Pub", "Create"])  # fmt: skip
        await until(alice_sends, 5, "the broker enforces the user created on a controller")

        await admin_call(addrs[0], "update_user", "alice", user_status="disable")
        took = await until(lambda: _not(alice_sends), 1.0, "revocation within 1 s")
        print(f"revocation enforced {took:.2f}s after the command returned"
              f" ({time.monotonic() - t0:.1f}s in)")  # fmt: skip

        leader = ""
        for addr in addrs:
            try:
                if (await ctl.metadata(addr)).is_leader:
                    leader = addr
            except MQError:
                continue
        assert leader, "no controller leader"
        namesrvs[addrs.index(leader)].kill()
        survivor = next(a for a in addrs if a != leader)
        listed = await admin_call(survivor, "list_users", "", timeout_s=30)
        names = {u["username"] for u in listed}  # type: ignore[attr-defined]
        assert {"alice", "admin"} <= names, listed
        await admin_call(survivor, "update_user", "alice", user_status="enable", timeout_s=30)
        await until(alice_sends, 3, "the change through a survivor reaches the broker")
        print(f"leader killed, change through a survivor: {time.monotonic() - t0:.1f}s in")
    finally:
        await alice.close()
        await ctl.close()


async def _not(cond: object) -> bool:
    assert callable(cond)
    return not await cond()

"""Users and ACLs as replicated Raft state (``auth_store = "raft"``): three controller nodes in one
process (real Raft, real Remoting) and a broker that follows them.

Checked: the first Super user is bootstrapped once; a user and an ACL created through a
follower node are enforced by the broker; disabling the user is enforced within 1 s; the
leader's death keeps every user, changes go on through the survivors and reach the broker; the
document's version only grows; a broker cannot change users (read-only copy)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from orbitmq.auth.document import FollowerAuthStore
from orbitmq.broker.controller import BrokerController
from orbitmq.client import AdminConfig, AsyncAdminClient
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MQError
from orbitmq.controller.server import ControllerNode
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.signature import Signer
from orbitmq.testing import small_broker_config
from tests.auth.test_servers import send
from tests.harness import REPO

from .brokers import until
from .test_server import configs, leader

KEY = "11" * 32
ADMIN_SECRET = "admin-secret-0"
ALICE_SECRET = "alice-secret-1"


@pytest.fixture
async def nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[list[ControllerNode]]:
    monkeypatch.setenv("ORBITMQ_AUTH_KEY", KEY)
    monkeypatch.setenv("ORBITMQ_AUTH_ADMIN_SECRET", ADMIN_SECRET)
    started: list[ControllerNode] = []
    try:
        for config in configs(tmp_path):
            node = ControllerNode(replace(config, auth_enabled=True, auth_store="raft"))
            await node.start()
            started.append(node)
        yield started
    finally:
        for node in started:
            await node.stop()


def admin_of(node: ControllerNode) -> AsyncAdminClient:
    return AsyncAdminClient(node.address, AdminConfig(access_key="admin", secret_key=ADMIN_SECRET))


def has_user(node: ControllerNode, name: str) -> bool:
    store = node.auth.store
    assert store is not None
    store.refresh()  # the Guard does this before each request
    return store.user(name) is not None


async def sends_ok(client: RemotingClient, broker: str) -> bool:
    return (await client.invoke(broker, send("orders"), 5.0)).code == ResponseCode.SUCCESS


async def test_users_in_the_quorum_reach_a_broker_and_survive_the_leader(
    nodes: list[ControllerNode], tmp_path: Path
) -> None:
    lead = await leader(nodes)

    async def bootstrapped() -> bool:
        return all(has_user(n, "admin") for n in nodes)

    await until(bootstrapped, 15)
    follower = next(n for n in nodes if n is not lead)
    async with admin_of(follower) as admin:
        await admin.create_user("alice", ALICE_SECRET)
        await admin.create_acl("User:alice", ["Topic:orders"], ["Pub"])
    broker = BrokerController(
        small_broker_config(
            tmp_path / "store",
            auth_enabled=True,
            auth_file=str(tmp_path / "broker-auth.json"),
            auth_controller_addrs=tuple(n.address for n in nodes),
            access_key="admin",
            secret_key=ADMIN_SECRET,
        )
    )
    await broker.start()
    alice = RemotingClient(signer=Signer("alice", ALICE_SECRET))
    try:
        store = broker.auth.store
        assert isinstance(store, FollowerAuthStore) and store.user("alice") is not None
        version = store.version
        assert await sends_ok(alice, broker.address)
        # the broker's copy is read-only
        async with AsyncAdminClient(
            broker.address, AdminConfig(access_key="admin", secret_key=ADMIN_SECRET)
        ) as via_broker:
            with pytest.raises(MQError, match="controller"):
                await via_broker.create_user("mallory", "mallory-secret")

        async with admin_of(lead) as admin:  # revocation: refused by the broker within 1 s
            await admin.update_user("alice", user_status="disable")
            started = time.monotonic()
            while await sends_ok(alice, broker.address):
                assert time.monotonic() - started < 1.0, "the broker still serves a disabled user"
                await asyncio.sleep(0.05)
            print(f"revocation enforced after {time.monotonic() - started:.2f}s")

        await lead.stop()  # the leader dies: the data stays, changes go on
        nodes.remove(lead)
        survivor = await leader(nodes)
        for n in nodes:
            assert has_user(n, "alice")
        async with admin_of(survivor) as admin:
            deadline = time.monotonic() + 10
            while True:  # the first change may meet the election
                try:
                    await admin.update_user("alice", user_status="enable")
                    break
                except MQError:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.2)
        started = time.monotonic()
        while not await sends_ok(alice, broker.address):
            assert time.monotonic() - started < 2.0, "the re-enabled user is still refused"
            await asyncio.sleep(0.05)
        assert store.version > version
    finally:
        await alice.close()
        await broker.stop()


async def test_a_restarted_node_keeps_the_users(nodes: list[ControllerNode]) -> None:
    """Stop every node, start them again from their data dirs: the users are there."""
    await leader(nodes)

    async def bootstrapped() -> bool:
        return all(has_user(n, "admin") for n in nodes)

    await until(bootstrapped, 15)
    async with admin_of(nodes[0]) as admin:
        await admin.create_user("alice", ALICE_SECRET)
    configs_ = [n.config for n in nodes]
    for n in nodes:
        await n.stop()
    nodes.clear()
    for config in configs_:
        node = ControllerNode(config)
        await node.start()
        nodes.append(node)
    await leader(nodes)

    async def alice_back() -> bool:
        return all(has_user(n, "alice") for n in nodes)

    await until(alice_back, 15)


async def test_user_and_acl_commands_against_a_controller(nodes: list[ControllerNode]) -> None:
    """``orbitmq user|acl ... --controller <node>`` (a follower when there is one)."""
    lead = await leader(nodes)

    async def bootstrapped() -> bool:
        return all(has_user(n, "admin") for n in nodes)

    await until(bootstrapped, 15)
    target = next(n for n in nodes if n is not lead).address
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBITMQ_")}
    env.update(ORBITMQ_ACCESS_KEY="admin", ORBITMQ_SECRET_KEY=ADMIN_SECRET)

    def cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "orbitmq", *args, "--controller", target],
            input=stdin, capture_output=True, text=True, timeout=30, cwd=REPO, env=env,
        )  # fmt: skip

    made = await asyncio.to_thread(cli, "user", "create", "-u", "bob", "-p", "-",
                                   stdin="bob-secret-22\n")  # fmt: skip
    assert made.returncode == 0, made.stderr
    acl = await asyncio.to_thread(cli, "acl", "create", "-s", "User:bob", "-r", "Topic:t",
                                  "-a", "Pub")  # fmt: skip
    assert acl.returncode == 0, acl.stderr
    listed = await asyncio.to_thread(cli, "user", "list")
    assert listed.returncode == 0 and "bob" in listed.stdout, listed.stdout + listed.stderr

    async def everywhere() -> bool:
        return all(has_user(n, "bob") for n in nodes)

    await until(everywhere, 5)

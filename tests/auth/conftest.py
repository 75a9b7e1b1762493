"""A NameServer and a broker with authentication on, sharing one auth store, and four users:
admin (Super), alice (literal grants), bob (prefix grants and a literal deny), carol (no ACL)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orbitmq.auth.model import PolicyEntry, UserType
from orbitmq.auth.store import AuthStore
from orbitmq.broker.controller import BrokerController
from orbitmq.namesrv.config import NamesrvConfig
from orbitmq.namesrv.controller import NamesrvController
from orbitmq.testing import small_broker_config

SECRETS = {
    "admin": "admin-secret-0",
    "alice": "alice-secret-1",
    "bob": "bob-secret-22",
    "carol": "carol-secret-3",
}


def seed(store: AuthStore) -> None:
    store.create_user("admin", SECRETS["admin"], UserType.SUPER)
    for name in ("alice", "bob", "carol"):
        store.create_user(name, SECRETS[name])
    store.put_entries(
        "alice",
        [
            PolicyEntry.make("Topic:orders", ["Pub", "Sub"], "Allow"),
            PolicyEntry.make("Group:g1", ["Sub"], "Allow"),
        ],
        create=True,
    )
    store.put_entries(
        "bob",
        [
            PolicyEntry.make("Topic:ord*", ["Pub", "Sub", "Get"], "Allow"),
            PolicyEntry.make("Topic:orders-secret", ["All"], "Deny"),
            PolicyEntry.make("Group:g*", ["Sub", "Get"], "Allow"),
        ],
        create=True,
    )


@dataclass
class Cluster:
    namesrv: NamesrvController
    broker: BrokerController
    auth_file: Path


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    auth_file = tmp_path / "auth.json"
    seed(AuthStore(auth_file))
    namesrv = NamesrvController(
        NamesrvConfig(
            port=0,
            auth_enabled=True,
            auth_file=str(auth_file),
            audit_file=str(tmp_path / "namesrv-audit.jsonl"),
        )
    )
    await namesrv.start()
    broker: BrokerController | None = None
    try:
        broker = BrokerController(
            small_broker_config(
                tmp_path / "store",
                namesrv_addrs=(namesrv.address,),
                auth_enabled=True,
                auth_file=str(auth_file),
                access_key="admin",
                secret_key=SECRETS["admin"],
            )
        )
        await broker.start()
        yield Cluster(namesrv, broker, auth_file)
    finally:
        if broker is not None:
            await broker.stop()
        await namesrv.stop()

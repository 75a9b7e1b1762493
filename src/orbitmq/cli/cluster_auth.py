"""``orbitmq cluster up --auth``: the local replicated cluster with authentication and ACLs on,
bootstrapped as the single-node ``up`` does (docs/security.md, "Bootstrap").

One users-and-ACLs file, ``<data-dir>/auth.json``, shared by every process (they all run on
this machine): every NameServer checks requests against it, and so does the controller node
embedded in it (it takes its NameServer's auth settings); every broker checks its clients
against it and signs its own NameServer and controller requests (registrations, heartbeats,
SyncStateSet changes) as an inner Super user, ``inner-<broker_name>``, whose secret is made
fresh at each start and handed to the brokers in their environment only (never written to a
config file). When the file holds no Super user, ``admin`` is created: its secret comes from
ORBITMQ_AUTH_ADMIN_SECRET, else one is generated and printed once on stderr (never logged, never
stored in clear), exactly as ``orbitmq up`` does. A second start with the same data folder keeps
``admin`` and its secret.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orbitmq.auth.model import UserType
from orbitmq.auth.server import bootstrap_admin
from orbitmq.auth.store import AuthStore, ExistsError

ADMIN_USER = "admin"


@dataclass(frozen=True)
class ClusterAuth:
    auth_file: Path
    inner_user: str
    inner_secret: str

    def namesrv_table(self) -> dict[str, Any]:
        """``[namesrv]`` settings (the embedded controller follows them)."""
        return {"auth_enabled": True, "auth_file": str(self.auth_file)}

    def broker_table(self) -> dict[str, Any]:
        """``[broker]`` settings; the secret goes by :meth:`broker_env`."""
        return {
            "auth_enabled": True,
            "auth_file": str(self.auth_file),
            "access_key": self.inner_user,
        }

    def broker_env(self) -> dict[str, str]:
        return {"ORBITMQ_BROKER_SECRET_KEY": self.inner_secret}


def prepare_auth(data_dir: Path, broker_name: str) -> ClusterAuth:
    """The shared auth file with its ``admin`` (bootstrapped if absent) and a fresh inner user
    for the brokers."""
    data_dir.mkdir(parents=True, exist_ok=True)
    auth_file = data_dir / "auth.json"
    store = AuthStore(str(auth_file))
    bootstrap_admin(store, ADMIN_USER)
    inner, secret = f"inner-{broker_name}", secrets.token_urlsafe(24)
    try:
        store.create_user(inner, secret, UserType.SUPER, inner="loopback")
    except ExistsError:
        store.update_user(
            inner, secret=secret, utype=UserType.SUPER, enabled=True, inner="loopback"
        )
    return ClusterAuth(auth_file, inner, secret)

"""Users and ACLs in one versioned file that every server reads: the auth metadata store.

One JSON file (``auth_file``) holds ``{"version", "users", "acls"}``; brokers, NameServers and
proxies configured with the same file see the same users and policies. A change (by any of
them, answering an admin request) takes an exclusive ``flock`` on ``<file>.lock``, re-reads the
file, applies the change, bumps ``version`` and replaces the file atomically (write, fsync,
rename, fsync the directory). Readers :meth:`refresh` when the file's identity (inode, size,
mtime) changed; the guard does so at most every ``refresh_interval_s`` (0.25 s), so a revoked
user or a deleted ACL is refused everywhere within 1 s. Until the controller quorum (#9) holds
this metadata, the file is the single source (on one host, or a shared file system).

Secrets: HMAC verification needs the secret itself (RocketMQ keeps it in clear), so it cannot
be hashed. It is stored encrypted with AES-256-GCM (``cryptography``) under a 32-byte key from
``<file>.key`` (created 0600 on first use) or the ``ORBITMQ_AUTH_KEY`` environment variable
(64 hex digits), with the user name as associated data, so a secret cannot be moved to another
user. Secrets are never returned by a listing, never logged, and kept out of ``repr``.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import secrets
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from orbitmq.auth.model import (
    ConfigurationError,
    PolicyEntry,
    Resource,
    User,
    UserType,
    parse_inner,
)

KEY_ENV = "ORBITMQ_AUTH_KEY"
MAX_SECRET_CHARS = 256


class NotFoundError(KeyError):
    """The user or ACL named does not exist."""


class ExistsError(ValueError):
    """The user already exists (create, not update)."""


@dataclass(slots=True)
class Snapshot:
    """One version of the store, immutable once published."""

    version: int = 0
    users: dict[str, User] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict, repr=False)
    acls: dict[str, tuple[PolicyEntry, ...]] = field(default_factory=dict)


def load_key(path: Path, *, create: bool = True) -> bytes:
    """The sealing key: ORBITMQ_AUTH_KEY, else ``<path>.key`` (created 0600 when missing and
    ``create``; ConfigurationError when missing and not)."""
    if not create and not os.environ.get(KEY_ENV):
        keyfile = path.with_name(path.name + ".key")
        if not keyfile.exists():
            raise ConfigurationError(
                f"no auth key: set {KEY_ENV} or copy the controllers' key to {keyfile}"
            )
    return _load_key(path)


def _load_key(path: Path) -> bytes:
    env = os.environ.get(KEY_ENV)
    if env:
        try:
            key = bytes.fromhex(env)
        except ValueError:
            raise ConfigurationError(f"{KEY_ENV} is not hex") from None
        if len(key) != 32:
            raise ConfigurationError(f"{KEY_ENV} must be 32 bytes (64 hex digits)")
        return key
    keyfile = path.with_name(path.name + ".key")
    try:
        fd = os.open(keyfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        key = keyfile.read_bytes()
        if len(key) != 32:
            raise ConfigurationError(f"{keyfile.name} does not hold a 32-byte key") from None
        return key
    key = secrets.token_bytes(32)
    try:
        os.write(fd, key)
        os.fsync(fd)
    finally:
        os.close(fd)
    return key


def user_of(name: str, u: dict[str, Any]) -> User:
    """The User of one ``users`` entry of the document."""
    return User(
        name, UserType.parse(u["type"]), bool(u.get("enabled", True)), str(u.get("inner", ""))
    )


def validate_username(name: str) -> str:
    if not name or len(name) > 64 or not all(c.isalnum() or c in "_-." for c in name):
        raise ConfigurationError(f"user name {name[:70]!r} is not 1..64 of [A-Za-z0-9_.-]")
    return name


def validate_secret(secret: str) -> str:
    if not 8 <= len(secret) <= MAX_SECRET_CHARS:
        raise ConfigurationError(f"a secret key has 8..{MAX_SECRET_CHARS} characters")
    return secret


class AuthStore:
    """The users and ACLs of ``path``; thread-safe; mutations are serialized across processes."""

    def __init__(self, path: str | os.PathLike[str], *, key: bytes | None = None) -> None:
        """``key``: the secret-sealing key (else ORBITMQ_AUTH_KEY or ``<path>.key``)."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._aead = AESGCM(_load_key(self.path) if key is None else key)
        self._lock = threading.Lock()
        self._ident: tuple[int, int, int] | None = None
        self.snapshot = Snapshot()
        self.refresh()

    # ------------------------------------------------------------------ reading

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def refresh(self) -> bool:
        """Re-read the file if it changed; True when a new version was loaded."""
        ident = self._stat()
        if ident == self._ident:
            return False
        with self._lock:
            ident = self._stat()
            if ident == self._ident:
                return False
            self.snapshot = self._read() if ident is not None else Snapshot()
            self._ident = ident
            return True

    def _read(self) -> Snapshot:
        return self.snapshot_of(json.loads(self.path.read_text("utf-8")))

    def snapshot_of(self, data: dict[str, Any]) -> Snapshot:
        """The Snapshot of one version of the document (secrets unsealed)."""
        snap = Snapshot(version=int(data.get("version", 0)))
        for name, u in data.get("users", {}).items():
            snap.users[name] = user_of(name, u)
            snap.secrets[name] = self._open(name, u["secret"])
        for name, entries in data.get("acls", {}).items():
            snap.acls[name] = tuple(PolicyEntry.from_json(e) for e in entries)
        return snap

    def _seal(self, name: str, secret: str) -> str:
        nonce = secrets.token_bytes(12)
        ct = self._aead.encrypt(nonce, secret.encode("utf-8"), b"user:" + name.encode())
        return base64.b64encode(nonce + ct).decode("ascii")

    def _open(self, name: str, sealed: str) -> str:
        raw = base64.b64decode(sealed)
        return self._aead.decrypt(raw[:12], raw[12:], b"user:" + name.encode()).decode("utf-8")

    def user(self, name: str) -> User | None:
        return self.snapshot.users.get(name)

    def secret(self, name: str) -> str | None:
        return self.snapshot.secrets.get(name)

    def acl(self, name: str) -> tuple[PolicyEntry, ...]:
        return self.snapshot.acls.get(name, ())

    @property
    def version(self) -> int:
        return self.snapshot.version

    # ------------------------------------------------------------------ writing

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        lockfile = self.path.with_name(self.path.name + ".lock")
        fd = os.open(lockfile, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _mutate(self, change: Callable[[dict[str, Any]], Any]) -> Any:
        """Apply ``change`` to the file's JSON under the lock; returns what ``change`` returns."""
        with self._locked():
            try:
                data = json.loads(self.path.read_text("utf-8"))
            except FileNotFoundError:
                data = {"version": 0, "users": {}, "acls": {}}
            result = change(data)
            data["version"] = int(data.get("version", 0)) + 1
            tmp = self.path.with_name(self.path.name + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, json.dumps(data, indent=1, sort_keys=True).encode("utf-8"))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            dfd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        self.refresh()
        return result

    def create_user(
        self, name: str, secret: str, utype: UserType = UserType.NORMAL, *, inner: str = ""
    ) -> User:
        """``inner``: see model.INNER_TRANSPORTS ("" for an ordinary user)."""
        validate_username(name)
        validate_secret(secret)
        inner = parse_inner(inner)
        sealed = self._seal(name, secret)

        def change(data: dict[str, Any]) -> None:
            if name in data["users"]:
                raise ExistsError(f"user {name} already exists")
            data["users"][name] = {"type": utype.value, "enabled": True, "secret": sealed}
            if inner:
                data["users"][name]["inner"] = inner

        self._mutate(change)
        return User(name, utype, inner=inner)

    def update_user(
        self,
        name: str,
        *,
        secret: str | None = None,
        utype: UserType | None = None,
        enabled: bool | None = None,
        inner: str | None = None,
    ) -> tuple[User, User]:
        """Change what is given; returns (before, after)."""
        sealed = None if secret is None else self._seal(name, validate_secret(secret))
        inner = None if inner is None else parse_inner(inner)

        def change(data: dict[str, Any]) -> tuple[User, User]:
            u = data["users"].get(name)
            if u is None:
                raise NotFoundError(name)
            before = user_of(name, u)
            if sealed is not None:
                u["secret"] = sealed
            if utype is not None:
                u["type"] = utype.value
            if enabled is not None:
                u["enabled"] = enabled
            if inner is not None:
                u.pop("inner", None)
                if inner:
                    u["inner"] = inner
            return before, user_of(name, u)

        result: tuple[User, User] = self._mutate(change)
        return result

    def delete_user(self, name: str) -> User:
        """Remove the user and its ACL; returns the user as it was."""

        def change(data: dict[str, Any]) -> User:
            u = data["users"].pop(name, None)
            if u is None:
                raise NotFoundError(name)
            data["acls"].pop(name, None)
            return user_of(name, u)

        result: User = self._mutate(change)
        return result

    def put_entries(
        self, name: str, entries: list[PolicyEntry], *, create: bool
    ) -> tuple[list[PolicyEntry], list[PolicyEntry]]:
        """Add or replace entries (keyed by resource); returns (before, after)."""

        def change(data: dict[str, Any]) -> tuple[list[PolicyEntry], list[PolicyEntry]]:
            if name not in data["users"]:
                raise NotFoundError(f"user {name}")
            current = [PolicyEntry.from_json(e) for e in data["acls"].get(name, [])]
            if not create and not current:
                raise NotFoundError(f"ACL of {name}")
            keyed = {str(e.resource): e for e in current}
            for e in entries:
                keyed[str(e.resource)] = e
            after = list(keyed.values())
            data["acls"][name] = [e.to_json() for e in after]
            return current, after

        result: tuple[list[PolicyEntry], list[PolicyEntry]] = self._mutate(change)
        return result

    def delete_entries(
        self, name: str, resources: list[Resource] | None
    ) -> tuple[list[PolicyEntry], list[PolicyEntry]]:
        """Remove the entries of ``resources`` (None: the whole ACL); returns (before, after)."""
        wanted = None if resources is None else {str(r) for r in resources}

        def change(data: dict[str, Any]) -> tuple[list[PolicyEntry], list[PolicyEntry]]:
            current = [PolicyEntry.from_json(e) for e in data["acls"].get(name, [])]
            if not current:
                raise NotFoundError(f"ACL of {name}")
            after = [] if wanted is None else [e for e in current if str(e.resource) not in wanted]
            if after:
                data["acls"][name] = [e.to_json() for e in after]
            else:
                data["acls"].pop(name, None)
            return current, after

        result: tuple[list[PolicyEntry], list[PolicyEntry]] = self._mutate(change)
        return result

    def bootstrap(self, admin: str, secret: str | None) -> str | None:
        """Make sure a Super user exists: create ``admin`` with ``secret`` (or a generated one,
        returned so that it can be shown once) when the store has no Super user yet. Checked
        under the lock, so two servers starting together create one admin."""
        validate_username(admin)
        chosen = secrets.token_urlsafe(24) if secret is None else validate_secret(secret)
        sealed = self._seal(admin, chosen)

        def change(data: dict[str, Any]) -> bool:
            if any(u.get("type") == UserType.SUPER.value for u in data["users"].values()):
                return False
            data["users"][admin] = {"type": UserType.SUPER.value, "enabled": True, "secret": sealed}
            return True

        created = self._mutate(change)
        return chosen if created and secret is None else None

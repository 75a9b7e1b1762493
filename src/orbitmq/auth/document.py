"""Users and ACLs kept somewhere else than a local file: the controller quorum (docs/security.md,
"Users and ACLs in the controller quorum").

The document is the file store's JSON (``{"version", "users", "acls"}``, secrets sealed with the
auth key), so every rule of :class:`~orbitmq.auth.store.AuthStore` (validation, sealing, the
Super-user bootstrap, before/after answers) is reused unchanged; only where a version is read
and how a change is committed differ:

- :class:`DocumentAuthStore` takes ``load() -> (version, document)`` and ``commit(expected,
  document)``. A change reads the current document, applies itself to a copy and commits it as
  a compare-and-set on the version (:class:`Conflict` when another change won: read and apply
  again, at most ``MAX_ATTEMPTS`` times). On the controller ``commit`` is a Raft command.
- :class:`FollowerAuthStore` is a broker's or NameServer's read-only copy: a task asks a
  controller node for the document every ``interval_s`` (0.25 s) with the version it holds
  (CONTROLLER_GET_AUTH_DATA; the answer carries a document only when it is newer), so a
  revocation holds there within 1 s. Its changes are refused: users and ACLs are changed on the
  controllers (``orbitmq user|acl ... --namesrv <controller>``). The last document is also kept
  in ``path`` (0600, atomic), so a restart while no controller answers keeps the last users.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from orbitmq.auth.model import ConfigurationError
from orbitmq.auth.store import AuthStore, Snapshot
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MQError
from orbitmq.common.tasks import TaskSet
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 8
Document = dict[str, Any]


def empty() -> Document:
    return {"version": 0, "users": {}, "acls": {}}


class Conflict(Exception):
    """The document changed since it was read: the compare-and-set did not apply."""


class DocumentAuthStore(AuthStore):
    def __init__(
        self,
        name: str,
        key: bytes,
        load: Callable[[], tuple[int, Document]],
        commit: Callable[[int, Document], None] | None,
    ) -> None:
        """``name``: what logs call it (a path-like label); ``commit`` None: read-only."""
        self.path = Path(name)
        self._key = key
        self._load = load
        self._commit = commit
        self._aead = AESGCM(key)
        self._lock = threading.Lock()
        self._ident = None
        self.snapshot = Snapshot()
        self._loaded = -1
        self.refresh()

    def refresh(self) -> bool:
        version, data = self._load()
        if version == self._loaded:
            return False
        with self._lock:
            if version == self._loaded:
                return False
            self.snapshot = self.snapshot_of(data)
            self._loaded = version
            return True

    def _mutate(self, change: Callable[[dict[str, Any]], Any]) -> Any:
        if self._commit is None:
            raise ConfigurationError(
                "users and ACLs live in the controller quorum here: send this change to a "
                "controller node (orbitmq user|acl ... --namesrv <controller host:port>)"
            )
        for _ in range(MAX_ATTEMPTS):
            version, current = self._load()
            data = copy.deepcopy(current)
            data.setdefault("users", {})
            data.setdefault("acls", {})
            result = change(data)
            data["version"] = version + 1
            try:
                self._commit(version, data)
            except Conflict:
                continue
            self.refresh()
            return result
        raise ConfigurationError(f"the auth data changed {MAX_ATTEMPTS} times meanwhile: retry")


class Invoker(Protocol):
    """What FollowerAuthStore asks with (a RemotingClient that signs as the server's user)."""

    async def invoke(self, addr: str, frame: Frame, timeout: float = ...) -> Frame: ...


class FollowerAuthStore(DocumentAuthStore):
    def __init__(
        self,
        cache: Path,
        key: bytes,
        controllers: Sequence[str],
        *,
        interval_s: float = 0.25,
    ) -> None:
        self.cache = cache
        self.controllers = list(controllers)
        self.interval_s = interval_s
        self._doc: tuple[int, Document] = (0, empty())
        try:
            data = json.loads(cache.read_text("utf-8"))
            self._doc = (int(data.get("version", 0)), data)
        except (OSError, ValueError):
            pass
        self._tasks = TaskSet("auth-follow", logger=log)
        self.fetched = 0
        """Documents received from a controller (for tests and logs)."""
        super().__init__(str(cache), key, lambda: self._doc, None)

    async def fetch_once(self, invoker: Invoker) -> bool:
        """Ask the controllers in turn until one answers; True when it sent a newer version."""
        version = self._doc[0]
        for addr in list(self.controllers):
            frame = Frame(RequestCode.CONTROLLER_GET_AUTH_DATA, fields={"version": version})
            try:
                resp = await invoker.invoke(addr, frame, timeout=2.0)
            except (MQError, OSError) as exc:  # unreachable, timed out, closed: the next node
                log.debug("auth data from %s: %s", addr, exc)
                continue
            if resp.code != ResponseCode.SUCCESS:
                log.warning("auth data from %s refused: %s", addr, resp.remark)
                continue
            # the node that answered first goes first next time
            self.controllers.remove(addr)
            self.controllers.insert(0, addr)
            if not resp.body:
                return False  # unchanged
            data = json.loads(bytes(resp.body))
            newer = int(data.get("version", 0))
            if newer <= version:
                return False  # a follower node behind the one asked before
            previous, self._doc = self._doc, (newer, data)
            try:
                self.refresh()
            except (InvalidTag, KeyError, ValueError, TypeError) as exc:
                # another key, a bad document: keep the last good one
                self._doc = previous
                log.error("auth data version %d from %s not usable: %r", newer, addr, exc)
                return False
            self.fetched += 1
            self._save(data)
            return True
        return False

    def _save(self, data: Document) -> None:
        tmp = self.cache.with_name(self.cache.name + ".tmp")
        try:
            self.cache.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, json.dumps(data, sort_keys=True).encode("utf-8"))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.cache)
        except OSError as exc:
            log.warning("auth data cache %s not written: %s", self.cache, exc)

    async def start(self, invoker: Invoker, first_wait_s: float = 3.0) -> None:
        """One fetch (bounded by ``first_wait_s``), then follow in the background."""
        try:
            await asyncio.wait_for(self.fetch_once(invoker), first_wait_s)
        except TimeoutError:
            log.warning("auth data: no controller answered within %.1f s", first_wait_s)
        self._tasks.spawn(self._follow(invoker), name="auth-follow")

    async def _follow(self, invoker: Invoker) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.fetch_once(invoker)
            except ValueError as exc:  # not JSON: keep the last document
                log.error("auth data from the controller not usable: %s", exc)

    async def stop(self) -> None:
        await self._tasks.close(timeout=2.0)

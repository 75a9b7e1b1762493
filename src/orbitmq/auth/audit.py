"""The audit log: one JSON line per admin change and per refused request, hash-chained.

Each line is a JSON object with UTC ``ts``, ``node``, ``event`` (``admin`` or ``deny``),
``principal``, ``source`` (ip:port), ``code``, ``resource``, ``action``, ``result``, ``reason``
and, for admin changes, ``before``/``after`` (users and entries as shown by ``list``: never a
secret). ``prev`` is the SHA-256 of the previous line (64 zeros for the first), so removing,
reordering or editing a line breaks the chain: :func:`verify` (``orbitmq audit verify FILE``)
finds the first broken line. Refusals are also summed per (principal, resource, action) and
written at most once a second each, so a client hammering a denied topic cannot flood the log.
Admin lines are fsynced. One file per server process (two writers would fork the chain).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("orbitmq.audit")

GENESIS = "0" * 64
DENY_INTERVAL_S = 1.0


def _digest(line: bytes) -> str:
    return hashlib.sha256(line.rstrip(b"\n")).hexdigest()


def _last_hash(path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 65536))
            lines = f.read().splitlines()
    except FileNotFoundError:
        return GENESIS
    return _digest(lines[-1]) if lines else GENESIS


class AuditLog:
    """Appends chained lines to ``path`` (None: to the ``orbitmq.audit`` logger only)."""

    def __init__(self, path: str | os.PathLike[str] | None, node: str) -> None:
        self.path = None if path is None else Path(path)
        self.node = node
        self._lock = threading.Lock()
        self._prev = GENESIS if self.path is None else _last_hash(self.path)
        self._denies: dict[tuple[str, str, str], list[float]] = {}
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def _write(self, record: dict[str, Any], sync: bool) -> None:
        with self._lock:
            record = {
                "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
                + f".{int(time.time() * 1000) % 1000:03d}Z",
                "node": self.node,
                **record,
                "prev": self._prev,
            }
            line = json.dumps(record, sort_keys=True, ensure_ascii=True).encode("ascii")
            self._prev = _digest(line)
            log.info("%s", line.decode("ascii"))
            if self.path is None:
                return
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line + b"\n")
                if sync:
                    os.fsync(fd)
            finally:
                os.close(fd)

    def admin(
        self,
        *,
        principal: str,
        source: str,
        code: int,
        resource: str,
        action: str,
        result: str,
        before: Any = None,
        after: Any = None,
        reason: str = "",
    ) -> None:
        self._write(
            {
                "event": "admin",
                "principal": principal,
                "source": source,
                "code": code,
                "resource": resource,
                "action": action,
                "result": result,
                "reason": reason,
                "before": before,
                "after": after,
            },
            sync=True,
        )

    def deny(
        self, *, principal: str, source: str, code: int, resource: str, action: str, reason: str
    ) -> None:
        """A refused request; repeats of (principal, resource, action) within a second are
        counted into the next line rather than written each."""
        key = (principal, resource, action)
        now = time.monotonic()
        with self._lock:
            slot = self._denies.get(key)
            if slot is not None and now - slot[0] < DENY_INTERVAL_S:
                slot[1] += 1
                return
            repeats = int(slot[1]) if slot is not None else 0
            self._denies[key] = [now, 0]
            if len(self._denies) > 10_000:
                self._denies.clear()
        self._write(
            {
                "event": "deny",
                "principal": principal,
                "source": source,
                "code": code,
                "resource": resource,
                "action": action,
                "result": "denied",
                "reason": reason,
                "suppressed": repeats,
            },
            sync=False,
        )


@dataclass(frozen=True, slots=True)
class ChainReport:
    lines: int
    broken_at: int | None
    """1-based number of the first line whose ``prev`` is wrong (None: the chain holds)."""


def verify(path: str | os.PathLike[str]) -> ChainReport:
    prev = GENESIS
    count = 0
    with Path(path).open("rb") as f:
        for count, raw in enumerate(f, start=1):
            try:
                record = json.loads(raw)
            except ValueError:
                return ChainReport(count, count)
            if not isinstance(record, dict) or record.get("prev") != prev:
                return ChainReport(count, count)
            prev = _digest(raw)
    return ChainReport(count, None)

"""A small crash-safe key/value journal: the MQTT gateway's sessions and retained messages.

One file per journal under the store directory. Every change is one appended line
``<json>\\n`` holding ``[key, value]`` (value None: the key is deleted) written with one
``os.write`` before the caller answers its client, so a killed process (SIGKILL) loses nothing
the client was told (the page cache keeps the write); ``fsync`` makes it survive a power cut
too, at one disk flush per change. Loading replays the lines in order; a torn last line (a
crash inside a write) and anything after it are dropped.

When the file holds more than twice as many lines as live keys (and over a small floor) it is
compacted: the live keys are written to a temporary file, fsynced and renamed over the journal
(:func:`orbitmq.common.files.write_atomically`), so a crash leaves the old or the new file.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import msgspec

from orbitmq.common.files import write_atomically

log = logging.getLogger(__name__)

COMPACT_FLOOR = 1024
"""Lines below which a journal is never compacted (rewriting a tiny file buys nothing)."""


class Journal:
    """``load()`` once, then ``put``/``delete``; ``items`` is the live map (do not mutate)."""

    def __init__(self, path: Path, *, fsync: bool = False) -> None:
        self.path = path
        self.fsync = fsync
        self.items: dict[str, Any] = {}
        self._lines = 0
        self._fd = -1

    def load(self) -> dict[str, Any]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            raw = b""
        good = 0
        for line in raw.split(b"\n"):
            if not line:
                break
            try:
                key, value = msgspec.json.decode(line)
            except (msgspec.DecodeError, ValueError, TypeError):
                log.warning(
                    "%s: damaged line after %d bytes dropped with the rest", self.path, good
                )
                break
            good += len(line) + 1
            self._lines += 1
            if value is None:
                self.items.pop(key, None)
            else:
                self.items[key] = value
        if good != len(raw):
            self._rewrite()
        else:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return self.items

    def put(self, key: str, value: Any) -> None:
        self.items[key] = value
        self._append(key, value)

    def delete(self, key: str) -> None:
        if self.items.pop(key, None) is not None:
            self._append(key, None)

    def _append(self, key: str, value: Any) -> None:
        data = msgspec.json.encode([key, value]) + b"\n"
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]
        if self.fsync:
            os.fsync(self._fd)
        self._lines += 1
        if self._lines > COMPACT_FLOOR and self._lines > 2 * len(self.items):
            self._rewrite()

    def _rewrite(self) -> None:
        """Replace the file by one line per live key (atomically)."""
        if self._fd >= 0:
            os.close(self._fd)
        body = b"".join(msgspec.json.encode([k, v]) + b"\n" for k, v in self.items.items())
        write_atomically(self.path, body)
        self._lines = len(self.items)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

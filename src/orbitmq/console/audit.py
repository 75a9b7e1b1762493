"""The console's audit log: one JSON line per write (who, from where, what, the outcome),
appended and flushed before the answer is sent. Bodies and passwords are never written."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from orbitmq.common.clock import now_ms


class AuditLog:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def write(
        self, user: str, ip: str, action: str, target: str, result: str, **details: Any
    ) -> None:
        entry = {
            "ts": now_ms(),
            "user": user,
            "ip": ip,
            "action": action,
            "target": target,
            "result": result,
            **details,
        }
        line = json.dumps(entry, separators=(",", ":"), default=str) + "\n"
        with self._lock, self.path.open("a") as f:
            f.write(line)
            f.flush()

    def entries(self, target: str | None = None, limit: int = 200) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines()[-5000:]:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if target is None or e.get("target") == target:
                out.append(e)
        return out[-limit:]

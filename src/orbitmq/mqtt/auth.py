"""Username/password authentication of MQTT CONNECTs, until the ACL users of issue #12 exist.

Off (``auth_enabled = false``, the default): every client is accepted. On: the CONNECT must
carry a user name and a password whose SHA-256 (hex) is the one the password file gives that
user. The file has one ``user:sha256-hex`` line per user; blank lines and ``#`` comments are
skipped. Comparison is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

from orbitmq.common.errors import ConfigError


def load_password_file(path: str) -> dict[str, str]:
    users: dict[str, str] = {}
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"mqtt.password_file {path}: {exc}") from exc
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, digest = line.partition(":")
        if not sep or not user or len(digest) != 64:
            raise ConfigError(f"mqtt.password_file {path}:{n}: not user:sha256-hex")
        users[user] = digest.lower()
    return users


class Authenticator:
    def __init__(self, enabled: bool, password_file: str | None) -> None:
        self.enabled = enabled
        self.users = load_password_file(password_file) if enabled and password_file else {}

    def check(self, username: str | None, password: bytes | None) -> bool:
        if not self.enabled:
            return True
        if username is None or password is None:
            return False
        want = self.users.get(username)
        got = hashlib.sha256(password).hexdigest()
        return want is not None and hmac.compare_digest(want, got)

"""Console sessions, users and CSRF tokens, with the standard library only.

A session is a signed cookie ``sid.user.role.sig`` (HMAC-SHA256 with the console's secret); a
CSRF token is HMAC(secret, "csrf:" + sid), so it is bound to the session and needs no storage.
Passwords are PBKDF2-SHA256 hashes (`hash_password`), compared in constant time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass

ROLES = ("viewer", "admin")
ITERATIONS = 200_000


def hash_password(password: str, *, iterations: int = ITERATIONS) -> str:
    salt = secrets.token_hex(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt.encode(), iterations)
    return f"pbkdf2_sha256${iterations}${salt}${base64.b64encode(digest).decode()}"


def check_password(password: str, stored: str) -> bool:
    try:
        algo, iterations, salt, b64 = stored.split("$")
        want = base64.b64decode(b64)
        n = int(iterations)
    except ValueError:
        return False
    if algo != "pbkdf2_sha256":
        return False
    got = hashlib.pbkdf2_hmac("sha256", password.encode(), salt.encode(), n)
    return hmac.compare_digest(got, want)


@dataclass(frozen=True, slots=True)
class Session:
    sid: str
    user: str
    role: str

    @property
    def admin(self) -> bool:
        return self.role == "admin"


class Signer:
    def __init__(self, secret: str | None) -> None:
        self.key = (secret or secrets.token_hex(32)).encode()

    def _sig(self, text: str) -> str:
        return hmac.new(self.key, text.encode(), hashlib.sha256).hexdigest()

    def cookie(self, session: Session) -> str:
        body = f"{session.sid}.{session.user}.{session.role}"
        return f"{body}.{self._sig(body)}"

    def session(self, cookie: str | None) -> Session | None:
        if not cookie or cookie.count(".") != 3:
            return None
        sid, user, role, sig = cookie.split(".")
        if role not in ROLES or not hmac.compare_digest(sig, self._sig(f"{sid}.{user}.{role}")):
            return None
        return Session(sid, user, role)

    def csrf(self, session: Session) -> str:
        return self._sig("csrf:" + session.sid)

    def csrf_ok(self, session: Session, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(self.csrf(session), token or "")


def new_session(user: str, role: str) -> Session:
    return Session(secrets.token_hex(12), user, role)


def parse_user(entry: str) -> tuple[str, str]:
    """'role:hash' -> (role, hash)."""
    role, _, stored = entry.partition(":")
    if role not in ROLES or not stored:
        raise ValueError(f"user entry must be 'viewer:HASH' or 'admin:HASH', not {entry[:12]!r}...")
    return role, stored

"""User and ACL administration (codes 3001-3010), as ``mqadmin``'s auth commands.

Requests go to a NameServer (failing over to the next); every broker and NameServer of a
cluster shares one auth store, so one answer is the cluster's. Secrets are sent, never read
back. A refusal raises the error of its code (NoPermissionError for a missing right,
MessageIllegalError for a bad entry or an unknown user).
"""

from __future__ import annotations

from typing import Any

import msgspec

from orbitmq.client.admin.base import AdminBase
from orbitmq.protocol import auth_requests as rq

__all__ = ["AuthAdminOps"]


def _decoded(body: Any) -> Any:
    return msgspec.msgpack.decode(bytes(body)) if body else None


class AuthAdminOps(AdminBase):
    async def create_user(
        self, username: str, secret: str, user_type: str = "Normal", *, inner: str | None = None
    ) -> None:
        """``inner``: mtls or loopback for an inner user (docs/security.md)."""
        await self._namesrv(
            rq.CreateUserRequest(
                username=username, password=secret, user_type=user_type, inner=inner
            )
        )

    async def update_user(
        self,
        username: str,
        *,
        secret: str | None = None,
        user_type: str | None = None,
        user_status: str | None = None,
        inner: str | None = None,
    ) -> None:
        await self._namesrv(
            rq.UpdateUserRequest(
                username=username,
                password=secret,
                user_type=user_type,
                user_status=user_status,
                inner=inner,
            )
        )

    async def delete_user(self, username: str) -> None:
        await self._namesrv(rq.DeleteUserRequest(username=username))

    async def get_user(self, username: str) -> dict[str, str]:
        resp = await self._namesrv(rq.GetUserRequest(username=username))
        user: dict[str, str] = _decoded(resp.body)
        return user

    async def list_users(self, filter: str = "") -> list[dict[str, str]]:
        resp = await self._namesrv(rq.ListUserRequest(filter=filter))
        users: list[dict[str, str]] = _decoded(resp.body) or []
        return users

    async def create_acl(
        self,
        subject: str,
        resources: list[str],
        actions: list[str],
        decision: str = "Allow",
        source_ips: list[str] | None = None,
        *,
        update: bool = False,
    ) -> None:
        cls = rq.UpdateAclRequest if update else rq.CreateAclRequest
        await self._namesrv(
            cls(
                subject=subject,
                resources=resources,
                actions=actions,
                decision=decision,
                source_ips=source_ips or None,
            )
        )

    async def delete_acl(self, subject: str, resources: list[str] | None = None) -> None:
        await self._namesrv(rq.DeleteAclRequest(subject=subject, resources=resources or None))

    async def get_acl(self, subject: str) -> dict[str, Any]:
        resp = await self._namesrv(rq.GetAclRequest(subject=subject))
        acl: dict[str, Any] = _decoded(resp.body)
        return acl

    async def list_acls(self, filter: str = "") -> list[dict[str, Any]]:
        resp = await self._namesrv(rq.ListAclRequest(filter=filter))
        acls: list[dict[str, Any]] = _decoded(resp.body) or []
        return acls

"""Answers the user and ACL admin codes (3001-3010) from the auth store, and audits each change.

Broker and NameServer route these codes here (after the Guard let them through: Cluster Update
for a change, Get/List for a read). Rules on top of the Guard's, from RocketMQ: only a Super
user may create, change or delete a Super user; an ACL's subject is ``User:<name>`` of an
existing user. Answers never carry a secret. Every change, refused or done, is one audit line
with the principal, the source and the user or entries before and after.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from orbitmq.auth.audit import AuditLog
from orbitmq.auth.model import ConfigurationError, PolicyEntry, Resource, User, UserType
from orbitmq.auth.store import AuthStore, ExistsError, NotFoundError
from orbitmq.common.codes import ResponseCode
from orbitmq.protocol import auth_requests as rq
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame

ANONYMOUS = ""
"""The principal when authentication is off: a local operator, allowed everything."""


def user_view(user: User) -> dict[str, str]:
    view = {
        "username": user.name,
        "user_type": user.type.value,
        "user_status": "enable" if user.enabled else "disable",
    }
    if user.inner:
        view["inner"] = user.inner
    return view


def subject_user(subject: str) -> str:
    kind, sep, name = subject.partition(":")
    if not sep or kind != "User" or not name:
        raise ConfigurationError(f"subject {subject[:70]!r} is not User:<name>")
    return name


class AuthAdmin:
    def __init__(self, store: AuthStore, audit: AuditLog) -> None:
        self.store = store
        self.audit = audit
        self._handlers: dict[int, Callable[[Frame, str], tuple[Frame, Any, Any, str]]] = {
            RequestCode.AUTH_CREATE_USER: self._create_user,
            RequestCode.AUTH_UPDATE_USER: self._update_user,
            RequestCode.AUTH_DELETE_USER: self._delete_user,
            RequestCode.AUTH_GET_USER: self._get_user,
            RequestCode.AUTH_LIST_USER: self._list_users,
            RequestCode.AUTH_CREATE_ACL: self._put_acl,
            RequestCode.AUTH_UPDATE_ACL: self._put_acl,
            RequestCode.AUTH_DELETE_ACL: self._delete_acl,
            RequestCode.AUTH_GET_ACL: self._get_acl,
            RequestCode.AUTH_LIST_ACL: self._list_acls,
        }
        self.codes = frozenset(self._handlers)

    def handle(self, frame: Frame, principal: str | None, source: str) -> Frame:
        """The answer to one admin request from ``principal`` (ANONYMOUS: auth is off)."""
        who = principal or ANONYMOUS
        handler = self._handlers[frame.code]
        changes = frame.code not in (
            RequestCode.AUTH_GET_USER,
            RequestCode.AUTH_LIST_USER,
            RequestCode.AUTH_GET_ACL,
            RequestCode.AUTH_LIST_ACL,
        )
        self.store.refresh()
        target = str(frame.fields.get("username") or frame.fields.get("subject") or "-")[:80]
        try:
            reply, before, after, result = handler(frame, who)
        except (ConfigurationError, ExistsError) as exc:
            reply, before, after, result = (
                frame.reply(ResponseCode.MESSAGE_ILLEGAL, str(exc)),
                None,
                None,
                "invalid",
            )
        except NotFoundError as exc:
            reply, before, after, result = (
                frame.reply(ResponseCode.MESSAGE_ILLEGAL, f"not found: {exc.args[0]}"),
                None,
                None,
                "not found",
            )
        if changes:
            self.audit.admin(
                principal=who or "anonymous",
                source=source,
                code=frame.code,
                resource=target,
                action=RequestCode(frame.code).name,
                result=result,
                before=before,
                after=after,
                reason=reply.remark,
            )
        return reply

    # ------------------------------------------------------------------ users

    def _may_touch_super(self, who: str) -> bool:
        if who == ANONYMOUS:
            return True
        caller = self.store.user(who)
        return caller is not None and caller.type is UserType.SUPER

    def _denied(self, frame: Frame) -> tuple[Frame, Any, Any, str]:
        msg = "only a Super user may create, change or delete a Super user"
        return frame.reply(ResponseCode.NO_PERMISSION, msg), None, None, "denied"

    def _create_user(self, frame: Frame, who: str) -> tuple[Frame, Any, Any, str]:
        req = rq.CreateUserRequest.decode(frame)
        utype = UserType.parse(req.user_type)
        if utype is UserType.SUPER and not self._may_touch_super(who):
            return self._denied(frame)
        user = self.store.create_user(req.username, req.password, utype, inner=req.inner or "")
        return frame.reply(ResponseCode.SUCCESS), None, user_view(user), "done"

    def _update_user(self, frame: Frame, who: str) -> tuple[Frame, Any, Any, str]:
        req = rq.UpdateUserRequest.decode(frame)
        utype = None if req.user_type is None else UserType.parse(req.user_type)
        current = self.store.user(req.username)
        touches_super = utype is UserType.SUPER or (
            current is not None and current.type is UserType.SUPER
        )
        if touches_super and not self._may_touch_super(who):
            return self._denied(frame)
        enabled = None
        if req.user_status is not None:
            if req.user_status not in ("enable", "disable"):
                raise ConfigurationError("user_status must be enable or disable")
            enabled = req.user_status == "enable"
        before, after = self.store.update_user(
            req.username, secret=req.password, utype=utype, enabled=enabled, inner=req.inner
        )
        view_after = user_view(after) | ({"secret": "changed"} if req.password else {})
        return frame.reply(ResponseCode.SUCCESS), user_view(before), view_after, "done"

    def _delete_user(self, frame: Frame, who: str) -> tuple[Frame, Any, Any, str]:
        req = rq.DeleteUserRequest.decode(frame)
        current = self.store.user(req.username)
        is_super = current is not None and current.type is UserType.SUPER
        if is_super and not self._may_touch_super(who):
            return self._denied(frame)
        before = self.store.delete_user(req.username)
        return frame.reply(ResponseCode.SUCCESS), user_view(before), None, "done"

    def _get_user(self, frame: Frame, _who: str) -> tuple[Frame, Any, Any, str]:
        req = rq.GetUserRequest.decode(frame)
        user = self.store.user(req.username)
        if user is None:
            raise NotFoundError(f"user {req.username}")
        return _body(frame, user_view(user)), None, None, "read"

    def _list_users(self, frame: Frame, _who: str) -> tuple[Frame, Any, Any, str]:
        req = rq.ListUserRequest.decode(frame)
        users = sorted(self.store.snapshot.users.values(), key=lambda u: u.name)
        views = [user_view(u) for u in users if req.filter in u.name]
        return _body(frame, views), None, None, "read"

    # ------------------------------------------------------------------ ACLs

    def _put_acl(self, frame: Frame, _who: str) -> tuple[Frame, Any, Any, str]:
        cls = (
            rq.CreateAclRequest
            if frame.code == RequestCode.AUTH_CREATE_ACL
            else rq.UpdateAclRequest
        )
        req = cls.decode(frame)
        name = subject_user(req.subject)
        if not req.resources:
            raise ConfigurationError("an ACL entry needs at least one resource")
        entries = [
            PolicyEntry.make(r, req.actions, req.decision, req.source_ips or ())
            for r in req.resources
        ]
        before, after = self.store.put_entries(
            name, entries, create=frame.code == RequestCode.AUTH_CREATE_ACL
        )
        return (
            frame.reply(ResponseCode.SUCCESS),
            [e.to_json() for e in before],
            [e.to_json() for e in after],
            "done",
        )

    def _delete_acl(self, frame: Frame, _who: str) -> tuple[Frame, Any, Any, str]:
        req = rq.DeleteAclRequest.decode(frame)
        name = subject_user(req.subject)
        resources = None if not req.resources else [Resource.parse(r) for r in req.resources]
        before, after = self.store.delete_entries(name, resources)
        return (
            frame.reply(ResponseCode.SUCCESS),
            [e.to_json() for e in before],
            [e.to_json() for e in after],
            "done",
        )

    def _get_acl(self, frame: Frame, _who: str) -> tuple[Frame, Any, Any, str]:
        req = rq.GetAclRequest.decode(frame)
        name = subject_user(req.subject)
        entries = self.store.acl(name)
        if not entries:
            raise NotFoundError(f"ACL of {name}")
        view = {"subject": req.subject, "entries": [e.to_json() for e in entries]}
        return _body(frame, view), None, None, "read"

    def _list_acls(self, frame: Frame, _who: str) -> tuple[Frame, Any, Any, str]:
        req = rq.ListAclRequest.decode(frame)
        views = [
            {"subject": f"User:{name}", "entries": [e.to_json() for e in entries]}
            for name, entries in sorted(self.store.snapshot.acls.items())
            if req.filter in f"User:{name}"
        ]
        return _body(frame, views), None, None, "read"


def _body(frame: Frame, obj: Any) -> Frame:
    return frame.reply(ResponseCode.SUCCESS, body=msgspec.msgpack.encode(obj))

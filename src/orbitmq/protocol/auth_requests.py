"""Header classes of the user and ACL admin codes (3001-3010, RocketMQ 5.3's numbers).

Answered by every broker and NameServer from the shared auth store (docs/security.md). A
secret travels only in AUTH_CREATE_USER and AUTH_UPDATE_USER (use TLS); no answer ever carries
one. Answers to GET/LIST are msgpack bodies: a user is ``{username, user_type, user_status}``,
an ACL ``{subject, entries: [{resource, actions, decision, source_ips}]}``.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from msgspec import Meta

from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.header import Header

AUTH = "auth"

UserName = Annotated[str, Meta(min_length=1, max_length=64, description="user name")]
InnerOpt = (
    Annotated[
        str,
        Meta(
            max_length=16,
            description="OrbitMQ: mtls, loopback or none: an inner user's secret alone is not "
            "enough (docs/security.md)",
        ),
    ]
    | None
)
Secret = Annotated[str, Meta(min_length=8, max_length=256, description="secret key (write-only)")]


class CreateUserRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.AUTH_CREATE_USER
    section: ClassVar[str] = AUTH
    response: ClassVar[str] = "SUCCESS; NO_PERMISSION (a Normal user creating a Super one)"
    username: UserName
    password: Secret
    user_type: Annotated[str, Meta(description="Super or Normal")] = "Normal"
    inner: InnerOpt = None


class UpdateUserRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.AUTH_UPDATE_USER
    section: ClassVar[str] = AUTH
    response: ClassVar[str] = "SUCCESS; fields `before`, `after`"
    username: UserName
    password: Secret | None = None
    user_type: Annotated[str, Meta(description="Super or Normal")] | None = None
    user_status: Annotated[str, Meta(description="enable or disable")] | None = None
    inner: InnerOpt = None


class DeleteUserRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.AUTH_DELETE_USER
    section: ClassVar[str] = AUTH
    response: ClassVar[str] = "SUCCESS (the user's ACL goes too)"
    username: UserName


class GetUserRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.AUTH_GET_USER
    section: ClassVar[str] = AUTH
    response: ClassVar[str] = "body: one user, no secret"
    username: UserName


class ListUserRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.AUTH_LIST_USER
    section: ClassVar[str] = AUTH
    response: ClassVar[str] = "body: the users whose name contains `filter`, no secrets"
    filter: str = ""


class CreateAclRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.AUTH_CREATE_ACL
    section: ClassVar[str] = AUTH
    response: ClassVar[str] = "SUCCESS; an entry per resource replaces the one there"
    subject: Annotated[str, Meta(description="User:name")]
    resources: Annotated[list[str], Meta(description="*, Type:*, Type:name, Type:prefix*")]
    actions: Annotated[list[str], Meta(description="Pub Sub Create Update Delete Get List All")]
    decision: Annotated[str, Meta(description="Allow or Deny")] = "Allow"
    source_ips: Annotated[list[str], Meta(description="IPs or CIDRs; none: any")] | None = None


class UpdateAclRequest(CreateAclRequest):
    code: ClassVar[RequestCode] = RequestCode.AUTH_UPDATE_ACL
    response: ClassVar[str] = "SUCCESS; fails when the subject has no ACL yet"


class DeleteAclRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.AUTH_DELETE_ACL
    section: ClassVar[str] = AUTH
    response: ClassVar[str] = "SUCCESS"
    subject: Annotated[str, Meta(description="User:name")]
    resources: Annotated[list[str], Meta(description="entries to remove; none: all")] | None = None


class GetAclRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.AUTH_GET_ACL
    section: ClassVar[str] = AUTH
    response: ClassVar[str] = "body: the subject's ACL"
    subject: Annotated[str, Meta(description="User:name")]


class ListAclRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.AUTH_LIST_ACL
    section: ClassVar[str] = AUTH
    response: ClassVar[str] = "body: every ACL whose subject contains `filter`"
    filter: str = ""

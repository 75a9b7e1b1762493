"""Console login with the cluster's ACL users (issue #12's users; ``[console] acl_login``).

The console never sees the auth store: it asks the cluster. A login (user name, secret key) is
checked by signing one GET_USER request for that user with those credentials and sending it to
a NameServer, whose guard verifies the signature before anything else:

- answered: the user exists and the secret is right; a ``Super`` user is a console admin, a
  ``Normal`` one a viewer;
- NO_PERMISSION saying the authentication failed (unknown user, wrong secret, disabled user):
  refused;
- NO_PERMISSION for the request itself (the user has no right to read users): the
  signature passed, so the user is who they say; a viewer.

A cluster that does not authenticate would accept any secret, so before the first ACL login
the console sends the same request with a random secret: if that is answered too, ACL logins
are refused (the console's own ``[console.users]`` still work).
"""

from __future__ import annotations

import secrets

from orbitmq.client.admin.client import AsyncAdminClient
from orbitmq.common.errors import MQError, NoPermissionError, RemoteError, RequestTimeoutError

AUTH_FAILED_MARK = "authentication failed"
"""What a guard's refusal says when the signature or the user is wrong (auth/guard.py)."""


NOT_AUTHENTICATING = (
    "the cluster does not authenticate (auth_enabled is off): ACL logins are refused"
)


class AclLoginError(Exception):
    """The login is refused; the message says why (shown on the login page)."""


async def _ask(namesrv: tuple[str, ...], user: str, secret: str) -> str:
    """ "super" / "normal" from the user's record; "authenticated" when the guard let the
    signature pass but refused the request. Raises NoPermissionError (authentication) or
    MQError (unreachable)."""
    admin = AsyncAdminClient(namesrv, access_key=user, secret_key=secret, timeout_s=3.0)
    await admin.start()
    try:
        try:
            record = await admin.get_user(user)
        except NoPermissionError as e:
            if AUTH_FAILED_MARK in str(e):
                raise
            return "authenticated"
        return str(record.get("user_type", "Normal")).lower()
    finally:
        await admin.close()


async def acl_role(namesrv: tuple[str, ...], user: str, secret: str) -> str:
    """The console role of an ACL user, or AclLoginError."""
    if not user or not secret:
        raise AclLoginError("wrong user or password")
    try:
        await _ask(namesrv, user, secrets.token_hex(16))
    except NoPermissionError as e:
        if AUTH_FAILED_MARK not in str(e):
            raise AclLoginError(f"unexpected answer to a wrong secret: {e}") from e
        # the cluster checks secrets: go on
    except RequestTimeoutError as e:
        raise AclLoginError(f"cannot reach the cluster to check the login: {e}") from e
    except RemoteError:  # answered without checking (auth off: no user admin either)
        raise AclLoginError(NOT_AUTHENTICATING) from None
    except MQError as e:
        raise AclLoginError(f"cannot reach the cluster to check the login: {e}") from e
    else:
        raise AclLoginError(NOT_AUTHENTICATING)
    try:
        kind = await _ask(namesrv, user, secret)
    except NoPermissionError as e:
        raise AclLoginError("wrong user or password") from e
    except MQError as e:
        raise AclLoginError(f"cannot reach the cluster to check the login: {e}") from e
    return "admin" if kind == "super" else "viewer"

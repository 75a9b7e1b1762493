"""Users, ACLs and the audit log: ``orbitmq user ...``, ``orbitmq acl ...``, ``orbitmq audit
verify`` (docs/security.md).

The user and ACL commands mirror ``mqadmin``'s (createUser -u -p -t, createAcl -s -r -a -d -i)
and go to a NameServer (or, with users in the controller quorum, a controller node:
``--controller`` names the same option) through :class:`orbitmq.client.AsyncAdminClient`;
every server of the cluster reads the same auth store. Requests are signed with the root options ``--access-key``
and ``--secret-key`` (or ORBITMQ_ACCESS_KEY / ORBITMQ_SECRET_KEY). A secret given as ``-p -``
is read from stdin, so that it stays out of the shell history and the process list.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from orbitmq.cli.common import DEFAULT_NAMESRV, admin_config, fail, out, run, split_list
from orbitmq.client import AsyncAdminClient

user_app = typer.Typer(no_args_is_help=True, help="Create, change, delete and list users.")
acl_app = typer.Typer(no_args_is_help=True, help="Create, change, delete, get and list ACLs.")
audit_app = typer.Typer(no_args_is_help=True, help="The audit log of admin changes and refusals.")

NamesrvOpt = Annotated[
    str,
    typer.Option(
        "--namesrv",
        "-n",
        "--controller",
        envvar="ORBITMQ_NAMESRV",
        help="Where users and ACLs are kept: NameServer addresses (file store), or a controller "
        "node (auth_store raft; any node takes changes), host:port separated by ';' or ','.",
        show_envvar=True,
    ),
]
UserOpt = Annotated[str, typer.Option("--username", "-u", help="User name.")]
SecretOpt = Annotated[
    str | None, typer.Option("--password", "-p", help="Secret key ('-': read from stdin).")
]
TypeOpt = Annotated[str | None, typer.Option("--user-type", "-t", help="Super or Normal.")]
InnerOpt = Annotated[
    str | None,
    typer.Option(
        "--inner",
        help="mtls (or loopback, or none): an inner user, e.g. the proxy's; its secret alone is "
        "not enough, a client certificate must name it (docs/security.md).",
    ),
]
SubjectOpt = Annotated[str, typer.Option("--subject", "-s", help="User:<name>.")]
ResourcesOpt = Annotated[
    str, typer.Option("--resources", "-r", help="*, Topic:a, Group:g*, Cluster:c; ',' separated.")
]
ActionsOpt = Annotated[
    str,
    typer.Option("--actions", "-a", help="Pub, Sub, Create, Update, Delete, Get, List, All."),
]
DecisionOpt = Annotated[str, typer.Option("--decision", "-d", help="Allow or Deny.")]
IpsOpt = Annotated[
    str | None, typer.Option("--source-ip", "-i", help="IPs or CIDRs (none: any), ',' separated.")
]


def _secret(value: str | None) -> str | None:
    if value == "-":
        return sys.stdin.readline().rstrip("\n")
    return value


def _admin(namesrv: str) -> AsyncAdminClient:
    return AsyncAdminClient(namesrv, admin_config())


# ------------------------------------------------------------------------------------ users


@user_app.command("create")
def user_create(
    username: UserOpt,
    password: SecretOpt = None,
    user_type: TypeOpt = "Normal",
    inner: InnerOpt = None,
    namesrv: NamesrvOpt = DEFAULT_NAMESRV,
) -> None:
    """Create a user (mqadmin createUser)."""
    secret = _secret(password)
    if not secret:
        fail("a user needs a secret: --password/-p (or -p - to read it from stdin)")

    async def go() -> None:
        async with _admin(namesrv) as admin:
            await admin.create_user(username, secret, user_type or "Normal", inner=inner)

    run(go())
    out().print(f"created user {escape(username)}")


@user_app.command("update")
def user_update(
    username: UserOpt,
    password: SecretOpt = None,
    user_type: TypeOpt = None,
    status: Annotated[str | None, typer.Option("--status", help="enable or disable.")] = None,
    inner: InnerOpt = None,
    namesrv: NamesrvOpt = DEFAULT_NAMESRV,
) -> None:
    """Change a user's secret, type or status (mqadmin updateUser)."""
    secret = _secret(password)

    async def go() -> None:
        async with _admin(namesrv) as admin:
            await admin.update_user(
                username, secret=secret, user_type=user_type, user_status=status, inner=inner
            )

    run(go())
    out().print(f"updated user {escape(username)}")


@user_app.command("delete")
def user_delete(username: UserOpt, namesrv: NamesrvOpt = DEFAULT_NAMESRV) -> None:
    """Delete a user and its ACL (mqadmin deleteUser)."""

    async def go() -> None:
        async with _admin(namesrv) as admin:
            await admin.delete_user(username)

    run(go())
    out().print(f"deleted user {escape(username)}")


@user_app.command("list")
def user_list(
    filter: Annotated[str, typer.Option("--filter", help="Names containing this.")] = "",
    namesrv: NamesrvOpt = DEFAULT_NAMESRV,
) -> None:
    """List users, never their secrets (mqadmin listUser)."""

    async def go() -> list[dict[str, str]]:
        async with _admin(namesrv) as admin:
            return await admin.list_users(filter)

    table = Table("user", "type", "status")
    for u in run(go()):
        table.add_row(escape(u["username"]), u["user_type"], u["user_status"])
    out().print(table)


# ------------------------------------------------------------------------------------ ACLs


def _put(
    subject: str,
    resources: str,
    actions: str,
    decision: str,
    ips: str | None,
    namesrv: str,
    update: bool,
) -> None:
    async def go() -> None:
        async with _admin(namesrv) as admin:
            await admin.create_acl(
                subject,
                split_list(resources),
                split_list(actions),
                decision,
                split_list(ips),
                update=update,
            )

    run(go())
    out().print(f"{'updated' if update else 'created'} ACL of {escape(subject)}")


@acl_app.command("create")
def acl_create(
    subject: SubjectOpt,
    resources: ResourcesOpt,
    actions: ActionsOpt,
    decision: DecisionOpt = "Allow",
    source_ip: IpsOpt = None,
    namesrv: NamesrvOpt = DEFAULT_NAMESRV,
) -> None:
    """Add entries to a subject's ACL (mqadmin createAcl); an entry replaces one on the same
    resource."""
    _put(subject, resources, actions, decision, source_ip, namesrv, update=False)


@acl_app.command("update")
def acl_update(
    subject: SubjectOpt,
    resources: ResourcesOpt,
    actions: ActionsOpt,
    decision: DecisionOpt = "Allow",
    source_ip: IpsOpt = None,
    namesrv: NamesrvOpt = DEFAULT_NAMESRV,
) -> None:
    """Change entries of an existing ACL (mqadmin updateAcl)."""
    _put(subject, resources, actions, decision, source_ip, namesrv, update=True)


@acl_app.command("delete")
def acl_delete(
    subject: SubjectOpt,
    resources: Annotated[
        str | None, typer.Option("--resources", "-r", help="Entries to remove (none: all).")
    ] = None,
    namesrv: NamesrvOpt = DEFAULT_NAMESRV,
) -> None:
    """Remove entries, or the whole ACL (mqadmin deleteAcl)."""

    async def go() -> None:
        async with _admin(namesrv) as admin:
            await admin.delete_acl(subject, split_list(resources) or None)

    run(go())
    out().print(f"deleted from ACL of {escape(subject)}")


def _entries_table(acls: list[dict[str, Any]]) -> Table:
    table = Table("subject", "resource", "actions", "decision", "source ips")
    for acl in acls:
        for e in acl["entries"]:
            table.add_row(
                escape(acl["subject"]),
                escape(e["resource"]),
                ",".join(e["actions"]),
                e["decision"],
                ",".join(e["source_ips"]) or "*",
            )
    return table


@acl_app.command("get")
def acl_get(subject: SubjectOpt, namesrv: NamesrvOpt = DEFAULT_NAMESRV) -> None:
    """One subject's ACL (mqadmin getAcl)."""

    async def go() -> dict[str, Any]:
        async with _admin(namesrv) as admin:
            return await admin.get_acl(subject)

    out().print(_entries_table([run(go())]))


@acl_app.command("list")
def acl_list(
    filter: Annotated[str, typer.Option("--filter", help="Subjects containing this.")] = "",
    namesrv: NamesrvOpt = DEFAULT_NAMESRV,
) -> None:
    """Every ACL (mqadmin listAcl)."""

    async def go() -> list[dict[str, Any]]:
        async with _admin(namesrv) as admin:
            return await admin.list_acls(filter)

    out().print(_entries_table(run(go())))


# ------------------------------------------------------------------------------------ audit


@audit_app.command("verify")
def audit_verify(path: Annotated[Path, typer.Argument(help="An audit log file.")]) -> None:
    """Check the hash chain of an audit log: exit 1 at the first line that was changed,
    removed or reordered."""
    from orbitmq.auth.audit import verify

    report = verify(path)
    if report.broken_at is not None:
        fail(f"{path}: the chain breaks at line {report.broken_at} of {report.lines}")
    out().print(json.dumps({"lines": report.lines, "chain": "ok"}))


# ------------------------------------------------------------------------------------ bench


def bench_auth(
    count: Annotated[int, typer.Option("--count", min=1, help="Requests per mode.")] = 20_000,
    batch: Annotated[int, typer.Option("--batch", min=1, help="Messages per request.")] = 32,
    size: Annotated[int, typer.Option("--size", min=1, help="Body size in bytes.")] = 1024,
) -> None:
    """Cost of the server's authentication and authorization check per SEND_BATCH request
    (off, v1, v2), and of the client's signing (orbitmq.bench.auth)."""
    from orbitmq.bench.auth import run_auth_bench

    table = Table("mode", "requests", "check us/request", "sign us/request", "body HMAC us")
    for r in run_auth_bench(count, batch, size):
        table.add_row(
            r.mode,
            f"{r.requests:,}",
            f"{r.check_us:.1f}",
            f"{r.sign_us:.1f}",
            f"{r.body_hmac_us:.1f}",
        )
    out().print(table)

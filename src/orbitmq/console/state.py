"""Console: what the console's handlers share (config, admin client, producer, poller, the
session signer, the audit log, templates), and how a page is rendered with its session."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from orbitmq.client.admin.client import AsyncAdminClient
from orbitmq.client.producer.producer import AsyncProducer
from orbitmq.common.record import StoredMessage
from orbitmq.console.audit import AuditLog
from orbitmq.console.auth import Session, Signer, parse_user
from orbitmq.console.config import ConsoleConfig
from orbitmq.console.poller import Poller

HERE = Path(__file__).parent
COOKIE = "orbitmq_console"


class Console:
    """What the handlers share: config, clients, poller, signer, audit log."""

    def __init__(self, config: ConsoleConfig) -> None:
        self.config = config
        self.signer = Signer(config.secret)
        self.users = {name: parse_user(entry) for name, entry in config.users.items()}
        self.audit = AuditLog(config.audit_log or "orbitmq-console-audit.jsonl")
        self.templates = Jinja2Templates(directory=str(HERE / "templates"))
        key, secret = config.access_key, config.secret_key  # the console's own, auth on
        self.admin = AsyncAdminClient(config.namesrv_addrs, access_key=key, secret_key=secret)
        self.producer = AsyncProducer(config.namesrv_addrs, access_key=key, secret_key=secret)
        self.poller = Poller(self.admin, config.poll_interval_ms, config.history_s)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.admin.start()
        await self.producer.start()
        self._task = asyncio.get_running_loop().create_task(
            self.poller.run(), name="console-poller"
        )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.producer.close()
        await self.admin.close()

    @property
    def login_required(self) -> bool:
        """Users are configured (the console's own, or the cluster's with ``acl_login``)."""
        return bool(self.users) or self.config.acl_login

    # -- sessions --------------------------------------------------------------------------

    def session(self, request: Request) -> Session | None:
        return self.signer.session(request.cookies.get(COOKIE))

    def render(self, request: Request, template: str, session: Session, **ctx: Any) -> Response:
        ctx.update(
            request=request, session=session, csrf=self.signer.csrf(session), config=self.config
        )
        response = self.templates.TemplateResponse(request, template, ctx)
        self._keep(response, session)
        return response

    def _keep(self, response: Response, session: Session) -> None:
        # over HTTPS the browser must never send the session back over plain HTTP
        secure = bool(self.config.tls_cert_file)
        response.set_cookie(
            COOKIE, self.signer.cookie(session), httponly=True, samesite="strict", secure=secure
        )

    def bodies_shown(self, request: Request) -> bool:
        """Bodies go to this page: allowed by the config (``allow_message_bodies``) and not
        switched off on the page (``bodies=0``, the "hide bodies" switch of the messages and
        DLQ pages, for a screen others can see)."""
        return self.config.allow_message_bodies and request.query_params.get("bodies") != "0"

    def hide(self, msg: StoredMessage, show: bool = True) -> dict[str, Any]:
        """A message as a page may show it: the body only when bodies are allowed (and
        ``show``)."""
        body = None
        if self.config.allow_message_bodies and show:
            body = msg.body[:4096].decode("utf-8", "replace")
        return {
            "msg_id": msg.msg_id,
            "topic": msg.topic,
            "queue_id": msg.queue_id,
            "queue_offset": msg.queue_offset,
            "tags": msg.tags,
            "keys": " ".join(msg.keys),
            "store_ms": msg.store_timestamp_ms,
            "born_ms": msg.born_timestamp_ms,
            "size": len(msg.body),
            "body": body,
            "properties": {k: v for k, v in msg.properties.items() if k not in ("KEYS", "TAGS")},
        }

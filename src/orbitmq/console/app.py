"""The console's Starlette application: pages, actions, the live event stream.

Pages are server-rendered (Jinja2, autoescaped); every number that moves arrives over
Server-Sent Events from the one `Poller`. Every POST passes `_guard`: writes switched on, an
admin session, and the session's CSRF token (form field ``csrf`` or header ``X-CSRF-Token``);
anything else is 403 before the action runs. With users configured, every page but /login and
/static needs a session. Each write is written to the audit log before it is answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from orbitmq.console import views
from orbitmq.console.acl_login import AclLoginError, acl_role
from orbitmq.console.auth import Session, check_password, new_session
from orbitmq.console.config import ConsoleConfig
from orbitmq.console.state import COOKIE, HERE, Console


def create_app(config: ConsoleConfig) -> Starlette:
    console = Console(config)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        await console.start()
        try:
            yield
        finally:
            await console.stop()

    async def page(request: Request) -> Response:
        session = _session_or_none(console, request)
        if session is None:
            return RedirectResponse("/login", status_code=303)
        handler = views.PAGES[request.scope["route"].name]
        return await handler(console, request, session)

    async def action(request: Request) -> Response:
        session = console.session(request)
        form = await request.form()
        denied = _guard(console, request, session, form.get("csrf"))
        if denied is not None:
            return denied
        assert session is not None
        handler = views.ACTIONS[request.scope["route"].name]
        return await handler(
            console,
            request,
            session,
            {k: str(v) for k, v in form.multi_items()},
            form.getlist("pick"),
        )

    async def login_page(request: Request) -> Response:
        if not console.login_required:
            return RedirectResponse("/", status_code=303)
        return console.templates.TemplateResponse(
            request, "login.html", {"error": None, "config": config}
        )

    async def login(request: Request) -> Response:
        form = await request.form()
        user, password = str(form.get("user", "")), str(form.get("password", ""))
        known = console.users.get(user)
        role, error = None, "wrong user or password"
        if known is not None:
            role = known[0] if check_password(password, known[1]) else None
        elif config.acl_login:
            try:
                role = await acl_role(config.namesrv_addrs, user, password)
            except AclLoginError as e:
                error = str(e)
        if role is None:
            console.audit.write(user or "-", _ip(request), "login", "console", "denied")
            return console.templates.TemplateResponse(
                request, "login.html", {"error": error, "config": config}, status_code=403
            )
        console.audit.write(user, _ip(request), "login", "console", f"ok: {role}")
        response = RedirectResponse("/", status_code=303)
        console._keep(response, new_session(user, role))
        return response

    async def logout(_request: Request) -> Response:
        response = RedirectResponse("/login" if console.login_required else "/", status_code=303)
        response.delete_cookie(COOKIE)
        return response

    async def events(request: Request) -> Response:
        if _session_or_none(console, request) is None:
            return PlainTextResponse("login first", status_code=403)
        return StreamingResponse(
            _stream(console, request),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store"},
        )

    routes = [
        Route("/", page, name="overview"),
        Route("/topics", page, name="topics"),
        Route("/topics/{topic}", page, name="topic"),
        Route("/groups", page, name="groups"),
        Route("/groups/{group}", page, name="group"),
        Route("/messages", page, name="messages"),
        Route("/trace", page, name="trace"),
        Route("/dlq", page, name="dlq"),
        Route("/dlq/{group}/export.csv", page, name="dlq_export"),
        Route("/clients", page, name="clients"),
        Route("/timers", page, name="timers"),
        Route("/audit", page, name="audit"),
        Route("/api/lag/{group}", page, name="lag_json"),
        Route("/topics", action, methods=["POST"], name="create_topic"),
        Route("/topics/{topic}/update", action, methods=["POST"], name="update_topic"),
        Route("/topics/{topic}/delete", action, methods=["POST"], name="delete_topic"),
        Route("/topics/{topic}/send", action, methods=["POST"], name="send_test"),
        Route("/groups/{group}/reset", action, methods=["POST"], name="reset_offsets"),
        Route("/dlq/{group}/resend", action, methods=["POST"], name="dlq_resend"),
        Route("/login", login_page, name="login_page"),
        Route("/login", login, methods=["POST"], name="login"),
        Route("/logout", logout, methods=["POST"], name="logout"),
        Route("/events", events, name="events"),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.console = console
    return app


def _session_or_none(console: Console, request: Request) -> Session | None:
    session = console.session(request)
    if session is None and not console.login_required:
        session = new_session("anonymous", "admin")  # no users: loopback dev, everyone admin
    return session


def _guard(
    console: Console, request: Request, session: Session | None, token: Any
) -> Response | None:
    if not console.config.allow_writes:
        return PlainTextResponse("writes are switched off (console.allow_writes)", status_code=403)
    if session is None:
        return PlainTextResponse("login first", status_code=403)
    if not session.admin:
        console.audit.write(
            session.user, _ip(request), request.url.path, "console", "denied: viewer"
        )
        return PlainTextResponse("admin role needed", status_code=403)
    token = token or request.headers.get("x-csrf-token")
    if not console.signer.csrf_ok(session, str(token) if token else None):
        console.audit.write(session.user, _ip(request), request.url.path, "console", "denied: csrf")
        return PlainTextResponse("missing or wrong CSRF token", status_code=403)
    return None


def _ip(request: Request) -> str:
    return request.client.host if request.client else "-"


async def _stream(console: Console, request: Request) -> AsyncIterator[str]:
    q = console.poller.subscribe()
    try:
        snap = console.poller.latest
        yield _sse("hello", json.dumps({"t": time.time()}))
        if snap.at_ms:
            for group, gs in snap.groups.items():
                yield _sse(f"lag-{group}", str(gs.lag))
        while not await request.is_disconnected():
            try:
                ev = await asyncio.wait_for(q.get(), 15)
            except TimeoutError:
                yield ": keep-alive\n\n"
                continue
            for group, (lag, lag_ms) in ev["lags"].items():
                yield _sse(f"lag-{group}", str(lag))
                yield _sse(f"lagms-{group}", views.fmt_ms(lag_ms))
                yield _sse(f"point-{group}", json.dumps([ev["t"], lag]))
            for topic, rate in ev["rates"].items():
                yield _sse(f"rate-{topic}", f"{rate:,.1f}")
    finally:
        console.poller.unsubscribe(q)


def _sse(event: str, data: str) -> str:
    return f"event: {event}\ndata: {data}\n\n"

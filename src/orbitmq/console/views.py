"""The console's page handlers and write actions (routes in app.py name them).

A page handler reads through the admin client and renders a template; an action has passed
the guard (writes on, admin, CSRF) and writes one audit entry with its outcome. Message pages
never hand a body to a template when bodies are switched off (`Console.hide`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from orbitmq.client.admin.types import PullStatus
from orbitmq.client.dlq import DlqMessage
from orbitmq.common.message import Message
from orbitmq.common.trace import (
    TRACE_TOPIC,
    decode_records,
    timeline,
    trace_details,
    trace_label,
)
from orbitmq.console.auth import Session
from orbitmq.console.poller import is_system_topic

if TYPE_CHECKING:
    from orbitmq.console.state import Console

Page = Callable[["Console", Request, Session], Awaitable[Response]]
Action = Callable[["Console", Request, Session, dict[str, str], list[Any]], Awaitable[Response]]
PAGE_SIZE = 50


def fmt_ms(ms: int) -> str:
    if ms < 1000:
        return f"{ms} ms"
    if ms < 120_000:
        return f"{ms / 1000:.1f} s"
    return f"{ms / 60_000:.1f} min"


def fmt_age(ms: int) -> str:
    """An age that may run to days (how long a broker keeps messages)."""
    if ms < 7_200_000:
        return fmt_ms(ms)
    if ms < 172_800_000:
        return f"{ms / 3_600_000:.1f} h"
    return f"{ms / 86_400_000:.1f} d"


def broker_figures(rt: dict[str, Any]) -> dict[str, Any]:
    """What a broker's runtime info says about its store and its request queues, for a page:
    the age of the oldest message it keeps (rocketmq_storage_message_reserve_time) and the
    requests read and not yet answered, long polls left out (rocketmq_processor_watermark)."""
    reserve = rt.get("message_reserve_time_ms")
    queued: dict[str, int] = rt.get("processor_queued") or {}
    busy = sorted(((n, p) for p, n in queued.items() if n), reverse=True)
    return {
        "reserve_ms": reserve,
        "reserve": fmt_age(int(reserve)) if reserve is not None else "-",
        "queued": sum(queued.values()) if queued else None,
        "queued_detail": ", ".join(f"{p} {n}" for n, p in busy) or "none",
    }


async def overview(c: Console, request: Request, s: Session) -> Response:
    info = await c.admin.cluster_info()
    brokers = []
    for name, data in sorted(info.broker_addr_table.items()):
        for broker_id, addr in sorted(data.broker_addrs.items()):
            rt: dict[str, Any] = {}
            with contextlib.suppress(Exception):
                rt = await c.admin.broker_runtime_info(addr)
            brokers.append(
                {
                    "cluster": data.cluster,
                    "name": name,
                    "id": broker_id,
                    "addr": addr,
                    "role": "master" if broker_id == 0 else "slave",
                    "rt": rt,
                    "fig": broker_figures(rt),
                }
            )
    snap = c.poller.latest
    return c.render(
        request,
        "overview.html",
        s,
        brokers=brokers,
        rates=sorted(snap.rates.items()),
        groups=len(snap.groups),
        samples=c.poller.samples,
    )


async def topics(c: Console, request: Request, s: Session) -> Response:
    names = [t for t in await c.admin.list_topics() if not is_system_topic(t)]
    snap = c.poller.latest
    rows = [{"name": t, "total": snap.totals.get(t), "rate": snap.rates.get(t, 0.0)} for t in names]
    return c.render(request, "topics.html", s, topics=rows)


async def topic(c: Console, request: Request, s: Session) -> Response:
    name = request.path_params["topic"]
    desc = await c.admin.describe_topic(name)
    queues = [
        {"broker": st.broker_name, "queue_id": q.queue_id, "min": q.min_offset, "max": q.max_offset}
        for st in desc.stats
        for q in st.queues
    ]
    brokers = []
    for data in sorted(desc.route.broker_datas, key=lambda d: d.broker_name):
        addr = data.master_addr()
        rt: dict[str, Any] = {}
        if addr is not None:
            with contextlib.suppress(Exception):
                rt = await c.admin.broker_runtime_info(addr)
        brokers.append({"name": data.broker_name, "addr": addr, "fig": broker_figures(rt)})
    return c.render(request, "topic.html", s, topic=name, queues=queues, route=desc.route,
                    errors=desc.errors, brokers=brokers)  # fmt: skip


async def groups(c: Console, request: Request, s: Session) -> Response:
    summaries = await c.admin.list_groups()
    snap = c.poller.latest
    rows: list[dict[str, Any]] = []
    for g in summaries:
        sample = snap.groups.get(g.group)
        rows.append(
            {
                "name": g.group,
                "members": g.members,
                "topics": ", ".join(g.topics),
                "lag": sample.lag if sample else None,
                "lag_ms": fmt_ms(sample.lag_ms) if sample else "-",
            }
        )
    rows.sort(key=lambda r: -(r["lag"] or 0))
    return c.render(request, "groups.html", s, groups=rows)


async def group(c: Console, request: Request, s: Session) -> Response:
    name = request.path_params["group"]
    desc = await c.admin.describe_group(name)
    sample = c.poller.latest.groups.get(name)
    history = list(c.poller.lag_history.get(name, ()))
    return c.render(
        request,
        "group.html",
        s,
        group=name,
        desc=desc,
        lag=sum(max(0, q.lag) for q in desc.queues),
        lag_ms=fmt_ms(sample.lag_ms) if sample else "-",
        history=history,
        entries=c.audit.entries(target=name, limit=20),
    )


async def lag_json(c: Console, request: Request, s: Session) -> Response:
    name = request.path_params["group"]
    return JSONResponse({"group": name, "points": list(c.poller.lag_history.get(name, ()))})


async def messages(c: Console, request: Request, s: Session) -> Response:
    q = request.query_params
    found: list[dict[str, Any]] = []
    cursor = ""
    error = None
    try:
        if q.get("msg_id") and q.get("topic"):
            m = await c.admin.get_message_by_id(q["topic"], q["msg_id"].strip())
            found = [c.hide(m)] if m else []
        elif q.get("key") and q.get("topic"):
            found = [
                c.hide(m)
                for m in await c.admin.query_by_key(q["topic"], q["key"].strip(), max_num=64)
            ]
        elif q.get("topic"):
            msgs, cursor = await _scan(c, q["topic"], q.get("since", ""), q.get("cursor", ""))
            found = [c.hide(m) for m in msgs]
    except Exception as e:  # noqa: BLE001  # shown on the page
        error = str(e)
    return c.render(request, "messages.html", s, found=found, q=dict(q), cursor=cursor, error=error)


async def trace(c: Console, request: Request, s: Session) -> Response:
    """A message's trace timeline (Pub, SubBefore, SubAfter, EndTransaction, DLQ, Recall) from the
    records brokers with trace_enable wrote to RMQ_SYS_TRACE_TOPIC. No bodies: safe when
    bodies are hidden."""
    msg_id = request.query_params.get("msg_id", "").strip()
    rows: list[dict[str, Any]] = []
    error = None
    if msg_id:
        try:
            found = await c.admin.query_by_key(TRACE_TOPIC, msg_id, max_num=64)
            records = timeline([r for m in found for r in decode_records(m.body)], msg_id)
            start = records[0].ts if records else 0
            rows = [
                {"ts": r.ts, "after_ms": r.ts - start, "type": trace_label(r), "group": r.group,
                 "cost_ms": r.cost_ms, "success": r.success, "details": trace_details(r)}
                for r in records
            ]  # fmt: skip
        except Exception as e:  # noqa: BLE001  # shown on the page
            error = str(e)
    span = max([r["after_ms"] for r in rows] or [0]) or 1
    return c.render(request, "trace.html", s, msg_id=msg_id, rows=rows, span=span, error=error,
                    topic=request.query_params.get("topic", ""))  # fmt: skip


async def _scan(c: Console, topic: str, since: str, cursor: str) -> tuple[list[Any], str]:
    """A page of a topic from a time (or its start), across queues by store time; the cursor
    holds each queue's next offset, so every message is on exactly one page."""
    queues = sorted(await c.admin.queues(topic), key=lambda m: (m.broker_name, m.queue_id))
    if cursor:
        nexts = [int(x) for x in cursor.split(",")]
    else:
        ts = int(time.time() * 1000) - int(float(since) * 1000) if since else 0
        nexts = [
            await c.admin.search_offset(mq, ts) if ts else await c.admin.min_offset(mq)
            for mq in queues
        ]
    pool: list[tuple[int, Any]] = []
    for i, mq in enumerate(queues):
        res = await c.admin.pull(mq, nexts[i], max_nums=PAGE_SIZE)
        if res.status is PullStatus.FOUND:
            pool += [(i, m) for m in res.messages]
    pool.sort(key=lambda p: (p[1].store_timestamp_ms, p[0], p[1].queue_offset))
    page = pool[:PAGE_SIZE]
    for i, m in page:
        nexts[i] = max(nexts[i], m.queue_offset + 1)
    return [m for _, m in page], ",".join(map(str, nexts)) if len(pool) > PAGE_SIZE or page else ""


async def dlq(c: Console, request: Request, s: Session) -> Response:
    group_name = request.query_params.get("group", "")
    rows: list[dict[str, Any]] = []
    error = None
    if group_name:
        try:
            for d in await c.admin.dlq_messages(group_name):
                row = c.hide(d.message)
                row.update(
                    origin=d.origin_topic,
                    origin_id=d.origin_msg_id,
                    reason=d.reason,
                    reconsume=d.reconsume_times,
                    dlq_offset=d.queue_offset,
                )
                rows.append(row)
        except Exception as e:  # noqa: BLE001  # shown on the page
            error = str(e)
    resent = {
        e.get("origin_id")
        for e in c.audit.entries(target=group_name)
        if e["action"] == "dlq_resend"
    }
    return c.render(request, "dlq.html", s, group=group_name, rows=rows, error=error, resent=resent)


async def audit(c: Console, request: Request, s: Session) -> Response:
    return c.render(request, "audit.html", s, entries=list(reversed(c.audit.entries(limit=500))))


PAGES: dict[str, Page] = {
    "overview": overview,
    "topics": topics,
    "topic": topic,
    "groups": groups,
    "group": group,
    "messages": messages,
    "trace": trace,
    "dlq": dlq,
    "audit": audit,
    "lag_json": lag_json,
}


# -- actions ------------------------------------------------------------------------------------


def _ip(request: Request) -> str:
    return request.client.host if request.client else "-"


async def create_topic(
    c: Console, request: Request, s: Session, form: dict[str, str], _p: list[Any]
) -> Response:
    name, queues = form.get("name", "").strip(), int(form.get("queues") or 8)
    try:
        await c.admin.create_topic(name, read_queue_nums=queues, write_queue_nums=queues)
        result = "ok"
    except Exception as e:  # noqa: BLE001  # reported and audited
        result = f"failed: {e}"
    c.audit.write(s.user, _ip(request), "create_topic", name, result, queues=queues)
    return RedirectResponse(f"/topics?result={result}", status_code=303)


async def delete_topic(
    c: Console, request: Request, s: Session, form: dict[str, str], _p: list[Any]
) -> Response:
    name = request.path_params["topic"]
    try:
        await c.admin.delete_topic(name)
        result = "ok"
    except Exception as e:  # noqa: BLE001  # reported and audited
        result = f"failed: {e}"
    c.audit.write(s.user, _ip(request), "delete_topic", name, result)
    return RedirectResponse(f"/topics?result={result}", status_code=303)


async def send_test(
    c: Console, request: Request, s: Session, form: dict[str, str], _p: list[Any]
) -> Response:
    name = request.path_params["topic"]
    keys = tuple(k for k in form.get("keys", "").split() if k)
    try:
        r = await c.producer.send(
            Message(name, form.get("body", "").encode(), tags=form.get("tags") or None, keys=keys)
        )
        result = f"ok: {r.msg_id} at {r.message_queue} offset {r.queue_offset}"
    except Exception as e:  # noqa: BLE001  # reported and audited
        result = f"failed: {e}"
    c.audit.write(s.user, _ip(request), "send_test", name, result, keys=list(keys))
    return RedirectResponse(f"/topics/{name}?result={result}", status_code=303)


async def reset_offsets(
    c: Console, request: Request, s: Session, form: dict[str, str], _p: list[Any]
) -> Response:
    name, topic = request.path_params["group"], form.get("topic", "")
    position = form.get("position", "timestamp")
    ts = None
    if position == "timestamp":
        ts = int(time.time() * 1000) - int(float(form.get("minutes_ago") or 0) * 60_000)
    try:
        await c.admin.reset_offset(name, topic, position, ts)
        result = "ok"
    except Exception as e:  # noqa: BLE001  # reported and audited
        result = f"failed: {e}"
    c.audit.write(
        s.user, _ip(request), "reset_offsets", name, result, topic=topic, position=position, ts=ts
    )
    return RedirectResponse(f"/groups/{name}?result={result}", status_code=303)


async def dlq_resend(
    c: Console, request: Request, s: Session, form: dict[str, str], picks: list[Any]
) -> Response:
    name = request.path_params["group"]
    if form.get("confirm") != "yes":
        return RedirectResponse(f"/dlq?group={name}&result=not+confirmed", status_code=303)
    wanted = {int(str(p)) for p in picks}
    chosen: list[DlqMessage] = [
        d for d in await c.admin.dlq_messages(name) if d.queue_offset in wanted
    ]
    done = 0
    for d in chosen:
        try:
            await c.producer.send(d.resend_message())
            result = "ok"
            done += 1
        except Exception as e:  # noqa: BLE001  # reported and audited per message
            result = f"failed: {e}"
        c.audit.write(
            s.user,
            _ip(request),
            "dlq_resend",
            name,
            result,
            origin_id=d.origin_msg_id,
            origin_topic=d.origin_topic,
            dlq_offset=d.queue_offset,
        )
    return RedirectResponse(
        f"/dlq?group={name}&result=resent+{done}+of+{len(chosen)}", status_code=303
    )


ACTIONS: dict[str, Action] = {
    "create_topic": create_topic,
    "delete_topic": delete_topic,
    "send_test": send_test,
    "reset_offsets": reset_offsets,
    "dlq_resend": dlq_resend,
}

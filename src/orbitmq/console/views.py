"""The console's page handlers and write actions (routes in app.py name them).

A page handler reads through the admin client and renders a template; an action has passed
the guard (writes on, admin, CSRF) and writes one audit entry with its outcome. Message pages
never hand a body to a template when bodies are switched off (`Console.hide`).
"""

from __future__ import annotations

import contextlib
import csv
import io
import re
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import msgspec
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
from orbitmq.console.runtime_views import all_masters, clients, timers
from orbitmq.protocol.bodies import TopicConfig

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
        "replication": replication_text(rt),
        "tier": tier_text(rt),
    }


def replication_text(rt: dict[str, Any]) -> str:
    """A broker's replication state from its runtime info (``ha_*``, brokers with HA on):
    a master's in-sync count and its replicas' lag, or a slave's link; "-" without HA."""
    role = rt.get("ha_role")
    if role == "master":
        reps: dict[str, list[int]] = rt.get("ha_replicas") or {}
        lags = ", ".join(f"#{b} {fmt_bytes(v[0])} / {fmt_ms(v[1])} behind"
                         for b, v in sorted(reps.items()))  # fmt: skip
        return f"master, epoch {rt.get('ha_epoch')}, {rt.get('ha_in_sync')} in sync" + (
            f"; {lags}" if lags else "; no replica connected"
        )
    if role == "slave":
        link = (
            "linked" if rt.get("ha_connected") else f"not linked ({rt.get('ha_last_error') or '?'})"
        )
        return f"slave of {rt.get('ha_master')}, epoch {rt.get('ha_epoch')}, {link}"
    if role == "none":
        return "no role yet (waiting for the controller)"
    return "-"


def tier_text(rt: dict[str, Any]) -> str:
    """Upload lag of tiered storage (``tier_*``), "-" on a broker without a tier."""
    if "tier_upload_lag_messages" not in rt:
        return "-"
    up = "" if rt.get("tier_available") else " (tier unavailable)"
    return (f"{int(rt['tier_upload_lag_messages']):,} msgs / "
            f"{fmt_age(int(rt.get('tier_upload_lag_ms') or 0))}{up}")  # fmt: skip


def fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


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
    brokers: list[dict[str, Any]] = []
    for data in sorted(desc.route.broker_datas, key=lambda d: d.broker_name):
        addr = data.master_addr()
        rt: dict[str, Any] = {}
        if addr is not None:
            with contextlib.suppress(Exception):
                rt = await c.admin.broker_runtime_info(addr)
        brokers.append({"name": data.broker_name, "addr": addr, "fig": broker_figures(rt)})
    config = await _topic_config(c, [str(b["addr"]) for b in brokers if b["addr"]], name)
    return c.render(request, "topic.html", s, topic=name, queues=queues, route=desc.route,
                    errors=desc.errors, brokers=brokers, tcfg=config,
                    retention=_retention_text(config))  # fmt: skip


async def _topic_config(c: Console, addrs: list[str], name: str) -> TopicConfig | None:
    """The topic's config as the first broker that answers holds it (queues, perm, type,
    retention)."""
    for addr in addrs:
        with contextlib.suppress(Exception):
            for cfg in await c.admin.topic_configs(addr):
                if cfg.topic_name == name:
                    return cfg
    return None


def _retention_text(cfg: TopicConfig | None) -> str:
    if cfg is None:
        return "?"
    parts = []
    if cfg.retention_ms is not None:
        parts.append(f"{fmt_age(cfg.retention_ms)} (local)")
    if cfg.retention_bytes is not None:
        parts.append(f"{cfg.retention_bytes:,} bytes per queue")
    if cfg.tier_retention_ms is not None:
        parts.append(f"{fmt_age(cfg.tier_retention_ms)} in the tier")
    return ", ".join(parts) or "the broker's rules"


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


def parse_time_ms(text: str) -> int | None:
    """A time a form gave: epoch milliseconds, or ISO 8601 (a browser's datetime-local field;
    no zone: UTC). Empty: None. ValueError when it is neither."""
    text = text.strip()
    if not text:
        return None
    if text.isdigit():
        return int(text)
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


async def messages(c: Console, request: Request, s: Session) -> Response:
    """By id, by key, or a time scan: from ``since`` seconds ago, or the range ``start`` ..
    ``end`` (either bound optional), paged with a cursor."""
    q = request.query_params
    show = c.bodies_shown(request)
    found: list[dict[str, Any]] = []
    cursor = ""
    error = None
    try:
        if q.get("msg_id") and q.get("topic"):
            m = await c.admin.get_message_by_id(q["topic"], q["msg_id"].strip())
            found = [c.hide(m, show)] if m else []
        elif q.get("key") and q.get("topic"):
            found = [
                c.hide(m, show)
                for m in await c.admin.query_by_key(q["topic"], q["key"].strip(), max_num=64)
            ]
        elif q.get("topic"):
            start = parse_time_ms(q.get("start", ""))
            if start is None and q.get("since"):
                start = int(time.time() * 1000) - int(float(q["since"]) * 1000)
            end = parse_time_ms(q.get("end", ""))
            msgs, cursor = await _scan(c, q["topic"], start, end, q.get("cursor", ""))
            found = [c.hide(m, show) for m in msgs]
    except Exception as e:  # noqa: BLE001  # shown on the page
        error = str(e)
    return c.render(request, "messages.html", s, found=found, q=dict(q), cursor=cursor,
                    error=error, show=show)  # fmt: skip


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


async def _scan(
    c: Console, topic: str, start: int | None, end: int | None, cursor: str
) -> tuple[list[Any], str]:
    """A page of a topic from a time (or its start) up to ``end`` (or its end), across queues
    by store time; the cursor holds each queue's next offset, so every message is on exactly
    one page."""
    queues = sorted(await c.admin.queues(topic), key=lambda m: (m.broker_name, m.queue_id))
    if cursor:
        nexts = [int(x) for x in cursor.split(",")]
    else:
        nexts = [
            await c.admin.search_offset(mq, start) if start else await c.admin.min_offset(mq)
            for mq in queues
        ]
    pool: list[tuple[int, Any]] = []
    for i, mq in enumerate(queues):
        res = await c.admin.pull(mq, nexts[i], max_nums=PAGE_SIZE)
        if res.status is PullStatus.FOUND:
            pool += [(i, m) for m in res.messages if end is None or m.store_timestamp_ms <= end]
    pool.sort(key=lambda p: (p[1].store_timestamp_ms, p[0], p[1].queue_offset))
    page = pool[:PAGE_SIZE]
    for i, m in page:
        nexts[i] = max(nexts[i], m.queue_offset + 1)
    return [m for _, m in page], ",".join(map(str, nexts)) if len(pool) > PAGE_SIZE or page else ""


async def _dead_letters(c: Console, request: Request, group_name: str) -> list[dict[str, Any]]:
    """A group's dead letters as rows, those matching ``key`` (a key, or the original or DLQ
    message id) when given."""
    key = request.query_params.get("key", "").strip()
    show = c.bodies_shown(request)
    rows: list[dict[str, Any]] = []
    for d in await c.admin.dlq_messages(group_name):
        if key and key not in d.message.keys and key not in (d.origin_msg_id, d.message.msg_id):
            continue
        row = c.hide(d.message, show)
        row.update(origin=d.origin_topic, origin_id=d.origin_msg_id, reason=d.reason,
                   reconsume=d.reconsume_times, dlq_offset=d.queue_offset)  # fmt: skip
        rows.append(row)
    return rows


async def dlq(c: Console, request: Request, s: Session) -> Response:
    group_name = request.query_params.get("group", "")
    rows: list[dict[str, Any]] = []
    error = None
    if group_name:
        try:
            rows = await _dead_letters(c, request, group_name)
        except Exception as e:  # noqa: BLE001  # shown on the page
            error = str(e)
    resent = {
        e.get("origin_id")
        for e in c.audit.entries(target=group_name)
        if e["action"] == "dlq_resend"
    }
    return c.render(request, "dlq.html", s, group=group_name, rows=rows, error=error,
                    resent=resent, key=request.query_params.get("key", ""),
                    show=c.bodies_shown(request))  # fmt: skip


async def dlq_export(c: Console, request: Request, s: Session) -> Response:
    """A group's dead letters (those the page shows: ``key`` filters) as CSV, one row per
    message; the body column is empty when bodies are switched off."""
    group_name = request.path_params["group"]
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(["dlq_offset", "origin_msg_id", "origin_topic", "msg_id", "keys", "tags",
                "reconsume_times", "reason", "store_ms", "size", "body"])  # fmt: skip
    for r in await _dead_letters(c, request, group_name):
        w.writerow([r["dlq_offset"], r["origin_id"], r["origin"], r["msg_id"], r["keys"],
                    r["tags"] or "", r["reconsume"], r["reason"], r["store_ms"], r["size"],
                    r["body"] if r["body"] is not None else ""])  # fmt: skip
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", group_name)
    return Response(out.getvalue(), media_type="text/csv; charset=utf-8",
                    headers={"Content-Disposition": f'attachment; filename="dlq-{name}.csv"'})  # fmt: skip


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
    "dlq_export": dlq_export,
    "audit": audit,
    "clients": clients,
    "timers": timers,
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


def _optional_int(text: str | None) -> int | None:
    text = (text or "").strip()
    return int(text) if text else None


async def update_topic(
    c: Console, request: Request, s: Session, form: dict[str, str], _p: list[Any]
) -> Response:
    """Queues and retention of an existing topic (empty retention: the broker's rules)."""
    name = request.path_params["topic"]
    details: dict[str, Any] = {}
    try:
        queues = int(form.get("queues") or 0)
        hours = form.get("retention_hours", "").strip()
        details = {"queues": queues, "retention_hours": hours or None,
                   "retention_bytes": _optional_int(form.get("retention_bytes"))}  # fmt: skip
        if queues < 1:
            raise ValueError("queues must be at least 1")
        addrs = sorted((await all_masters(c)).values())
        old = await _topic_config(c, addrs, name)
        if old is None:
            raise ValueError(f"no broker has topic {name}")
        new = msgspec.structs.replace(
            old, read_queue_nums=queues, write_queue_nums=queues,
            retention_ms=int(float(hours) * 3_600_000) if hours else None,
            retention_bytes=details["retention_bytes"],
        )  # fmt: skip
        await c.admin.update_topic(new)
        result = "ok"
    except Exception as e:  # noqa: BLE001  # reported and audited
        result = f"failed: {e}"
    c.audit.write(s.user, _ip(request), "update_topic", name, result, **details)
    return RedirectResponse(f"/topics/{name}?result={result}", status_code=303)


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
    try:
        if position == "timestamp":  # an absolute time (UTC or epoch ms), or minutes ago
            ts = parse_time_ms(form.get("at", "")) or int(time.time() * 1000) - int(
                float(form.get("minutes_ago") or 0) * 60_000
            )
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
        c.audit.write(s.user, _ip(request), "dlq_resend", name, "refused: not confirmed")
        return RedirectResponse(f"/dlq?group={name}&result=not+confirmed", status_code=303)
    wanted = {int(str(p)) for p in picks}
    chosen: list[DlqMessage] = [
        d for d in await c.admin.dlq_messages(name) if d.queue_offset in wanted
    ]
    if not chosen:  # audited too: every write the console is asked for is in the log
        c.audit.write(s.user, _ip(request), "dlq_resend", name, "nothing selected",
                      picks=sorted(wanted))  # fmt: skip
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
    "update_topic": update_topic,
    "delete_topic": delete_topic,
    "send_test": send_test,
    "reset_offsets": reset_offsets,
    "dlq_resend": dlq_resend,
}

"""The console's clients page and its timers and half messages page.

Clients: every online member of every consumer group (client id, address, language, version,
last heartbeat) with the group's consume type and messages in flight, from the brokers'
connection lists (GET_CONSUMER_CONNECTION_LIST) and consume stats. Producers are not listed:
brokers keep them per producer group without a request that lists them (their count per
language and version is ``rocketmq_producer_connections``).

Timers and half messages: per master broker, from its runtime info (GET_BROKER_RUNTIME_INFO):
delayed messages waiting (``timer_pending``), fired, rolled and recalled counts, the timer's
enqueue and dequeue lag and latency (the figures behind ``rocketmq_timer_*``), and the half
(prepared) messages not yet committed or rolled back per topic (``rocketmq_half_messages``).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from orbitmq.common.clock import now_ms
from orbitmq.console.auth import Session

if TYPE_CHECKING:
    from orbitmq.console.state import Console

MAX_GROUPS = 200
"""Groups described per clients page (one request per master each)."""


async def all_masters(c: Console) -> dict[str, str]:
    """broker name -> master address over every cluster the NameServers know."""
    info = await c.admin.cluster_info()
    out: dict[str, str] = {}
    for name, data in info.broker_addr_table.items():
        addr = data.master_addr()
        if addr:
            out[name] = addr
    return out


async def clients(c: Console, request: Request, s: Session) -> Response:
    rows: list[dict[str, Any]] = []
    errors: list[str] = []
    summaries = await c.admin.list_groups()
    now = now_ms()
    for g in summaries[:MAX_GROUPS]:
        if not g.members:
            continue
        try:
            desc = await c.admin.describe_group(g.group)
        except Exception as e:  # noqa: BLE001  # shown on the page
            errors.append(f"{g.group}: {e}")
            continue
        inflight = sum(max(0, q.inflight) for q in desc.queues)
        rows += [
            {"group": g.group, "client_id": m.client_id, "addr": m.addr, "language": m.language,
             "version": m.version, "heartbeat_ms": m.last_heartbeat_ms,
             "heartbeat_age": f"{max(0, now - m.last_heartbeat_ms) / 1000:.1f} s ago",
             "consume_type": desc.consume_type, "model": desc.message_model, "inflight": inflight}
            for m in desc.members
        ]  # fmt: skip
    return c.render(request, "clients.html", s, rows=rows, errors=errors,
                    more=max(0, len(summaries) - MAX_GROUPS))  # fmt: skip


async def timers(c: Console, request: Request, s: Session) -> Response:
    brokers: list[dict[str, Any]] = []
    half: list[tuple[str, str, int]] = []
    for name, addr in sorted((await all_masters(c)).items()):
        rt: dict[str, Any] = {}
        with contextlib.suppress(Exception):
            rt = await c.admin.broker_runtime_info(addr)
        brokers.append({"name": name, "addr": addr, "rt": rt})
        half += [(name, t, int(n)) for t, n in sorted((rt.get("half_messages") or {}).items())]
    return c.render(request, "timers.html", s, brokers=brokers, half=half)

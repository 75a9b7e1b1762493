"""The console's operator pages and switches through Starlette's test client against a real
broker: clients (online members with language and version), timers and half messages, the
overview's replication and tier columns, a topic's retention and its update, a time-range scan
with paging, the per-page body switch, the DLQ page's key search and CSV export; and two rules
checked over every POST route the app has: no write without the CSRF token, and every write
(done or refused) in the audit log."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import re
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from starlette.routing import Route
from starlette.testclient import TestClient

from orbitmq.client import AsyncSimpleConsumer, LocalTransactionState, Message
from orbitmq.client.consumer.config import SimpleConfig
from orbitmq.client.transaction.producer import AsyncTransactionProducer
from orbitmq.common.codes import ResponseCode
from orbitmq.console.app import create_app
from orbitmq.console.config import ConsoleConfig
from orbitmq.console.views import parse_time_ms, replication_text, tier_text
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame
from tests.console.conftest import GROUP, TOPIC, Cluster, commit_all, send

pytestmark = pytest.mark.timeout(120)


def _config(c: Cluster, **kw: Any) -> ConsoleConfig:
    return ConsoleConfig(namesrv_addrs=(c.namesrv,), port=0, audit_log=str(c.tmp / "audit.jsonl"),
                         poll_interval_ms=200, **kw)  # fmt: skip


def _csrf(html: str) -> str:
    m = re.search(r'name="csrf-token" content="([0-9a-f]+)"', html)
    assert m, "no CSRF token on the page"
    return m.group(1)


class Undecided:
    """A transaction listener that never decides (the half message stays a half message)."""

    def execute_local_transaction(self, _msg: Message, _arg: Any) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN

    def check_local_transaction(self, _msg: Any) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN


async def test_clients_timers_and_half_messages(cluster: Cluster) -> None:
    consumer = AsyncSimpleConsumer([cluster.namesrv], GROUP, SimpleConfig(await_duration_s=0.2),
                                   subscriptions={TOPIC: "*"})  # fmt: skip
    tx = AsyncTransactionProducer([cluster.namesrv], "PG-console", Undecided())
    await consumer.start()
    await tx.start()
    try:
        await cluster.producer.send(Message(TOPIC, b"later").set_delay_ms(600_000))
        await tx.send_half(Message(TOPIC, b"undecided"))

        def run() -> tuple[str, str, str]:
            with TestClient(create_app(_config(cluster))) as web:
                clients = ""
                for _ in range(50):  # bounded: the consumer's first heartbeat
                    clients = web.get("/clients").text
                    if 'class="client"' in clients:
                        break
                    time.sleep(0.1)
                return clients, web.get("/timers").text, web.get("/").text

        clients, timers, overview = await asyncio.to_thread(run)
    finally:
        await tx.close()
        await consumer.close()
    row = re.search(r'<tr class="client">(.*?)</tr>', clients, re.S)
    assert row, clients
    assert f">{GROUP}<" in row.group(1) and ">PYTHON<" in row.group(1).upper(), row.group(1)
    pending = re.search(r'<td class="num pending">(\d+)</td>', timers)
    assert pending and int(pending.group(1)) >= 1, timers
    half = re.search(rf'<tr class="half"><td>broker-a</td><td><a href="/topics/{TOPIC}">{TOPIC}'
                     r'</a></td><td class="num">(\d+)</td>', timers)  # fmt: skip
    assert half and int(half.group(1)) == 1, timers
    # a broker without HA or a tier says so
    assert (
        '<td class="replication">-</td>' in overview and '<td class="num tier">-</td>' in overview
    )


def test_replication_and_tier_texts() -> None:
    master = {"ha_role": "master", "ha_epoch": 3, "ha_in_sync": 2,
              "ha_replicas": {"1": [2048, 1500]}}  # fmt: skip
    assert replication_text(master) == "master, epoch 3, 2 in sync; #1 2.0 KiB / 1.5 s behind"
    slave = {"ha_role": "slave", "ha_epoch": 3, "ha_master": "h:1", "ha_connected": False,
             "ha_last_error": "refused"}  # fmt: skip
    assert replication_text(slave) == "slave of h:1, epoch 3, not linked (refused)"
    assert replication_text({}) == "-"
    assert tier_text({}) == "-"
    tier = {"tier_upload_lag_messages": 1200, "tier_upload_lag_ms": 90_000, "tier_available": 0}
    assert tier_text(tier) == "1,200 msgs / 90.0 s (tier unavailable)"
    assert parse_time_ms("2026-11-26T10:00:00") == int(
        datetime(2026, 11, 26, 10, tzinfo=UTC).timestamp() * 1000
    )
    assert parse_time_ms("1700000000000") == 1_700_000_000_000 and parse_time_ms(" ") is None


async def test_topic_retention_update_range_scan_and_body_switch(cluster: Cluster) -> None:
    await send(cluster, 10, prefix="before")
    await asyncio.sleep(0.05)
    start = int(time.time() * 1000)
    await send(cluster, 70, prefix="inside")
    end = int(time.time() * 1000)
    await asyncio.sleep(0.05)
    await send(cluster, 10, prefix="after")

    def run() -> None:
        with TestClient(create_app(_config(cluster))) as web:
            page = web.get(f"/topics/{TOPIC}").text
            assert "the broker's rules" in page and "2 read / 2 write queues" in page
            token = _csrf(page)
            done = web.post(f"/topics/{TOPIC}/update",
                            data={"queues": "3", "retention_hours": "2", "csrf": token})  # fmt: skip
            assert "result=ok" in str(done.url), done.url
            page = web.get(f"/topics/{TOPIC}").text
            assert "3 read / 3 write queues" in page
            assert '<b id="retention">2.0 h (local)</b>' in page, page
            # a time range, paged: exactly the 70 messages stored inside it, each once
            seen: list[str] = []
            url = f"/messages?topic={TOPIC}&start={start}&end={end}"
            for _ in range(10):  # bounded
                page = web.get(url).text
                seen += re.findall(r"<pre>([a-z]+-\d+)</pre>", page)
                nxt = re.search(r'id="next" href="([^"]+)"', page)
                if not nxt:
                    break
                url = nxt.group(1).replace("&amp;", "&")
            assert sorted(seen) == sorted(f"inside-{i}" for i in range(70))
            # the page's switch hides bodies, keys stay; its link turns them back on
            page = web.get("/messages", params={"topic": TOPIC, "key": "inside-key-3"}).text
            assert "<pre>inside-3</pre>" in page and ">hide bodies<" in page
            hidden = web.get("/messages", params={"topic": TOPIC, "key": "inside-key-3",
                                                  "bodies": "0"}).text  # fmt: skip
            assert "inside-3<" not in hidden.replace("inside-key-3<", "") and "hidden" in hidden
            assert ">show bodies<" in hidden and 'name="bodies" value="0"' in hidden

    await asyncio.to_thread(run)


async def test_dlq_key_search_and_csv_export(cluster: Cluster) -> None:
    broker = next(iter((await cluster.admin.cluster_info()).broker_addr_table.values()))
    addr = broker.master_addr()
    assert addr
    for i, key in enumerate(("dead-a", "dead-b")):
        sent = await cluster.producer.send(Message(TOPIC, f"poison-{i}".encode(), keys=[key]))
        frame = Frame(RequestCode.CONSUMER_SEND_MSG_BACK,
                      fields={"group": "GDead", "offset": sent.offset, "max_reconsume_times": 0})  # fmt: skip
        resp = await cluster.admin.remoting.invoke(addr, frame, 5.0)
        assert resp.code == ResponseCode.SUCCESS and resp.fields["dlq"] is True

    def run() -> None:
        with TestClient(create_app(_config(cluster))) as web:
            page = ""
            for _ in range(50):  # bounded: the DLQ topic's route
                page = web.get("/dlq", params={"group": "GDead"}).text
                if page.count('class="dead"') == 2:
                    break
                time.sleep(0.1)
            assert page.count('class="dead"') == 2, page
            one = web.get("/dlq", params={"group": "GDead", "key": "dead-b"}).text
            assert one.count('class="dead"') == 1 and "dead-b" in one and "dead-a" not in one
            link = re.search(r'id="export" href="([^"]+)"', one)
            assert link, one
            got = web.get(link.group(1).replace("&amp;", "&"))
            assert got.headers["content-type"].startswith("text/csv")
            rows = list(csv.DictReader(io.StringIO(got.text)))
            assert [(r["keys"], r["origin_topic"], r["body"]) for r in rows] == [
                ("dead-b", TOPIC, "poison-1")
            ]
            both = web.get("/dlq/GDead/export.csv", params={"bodies": "0"}).text
            rows = list(csv.DictReader(io.StringIO(both)))
            assert sorted(r["keys"] for r in rows) == ["dead-a", "dead-b"]
            assert all(r["body"] == "" and r["origin_msg_id"] for r in rows)
        with TestClient(create_app(_config(cluster, allow_message_bodies=False))) as web:
            text = web.get("/dlq/GDead/export.csv").text
            assert "poison" not in text and "dead-a" in text
            page = web.get("/dlq", params={"group": "GDead", "bodies": "1"}).text
            assert "poison" not in page and "dead-a" in page and "hidden" in page
            assert "bodies-switch" not in page  # nothing to switch on

    await asyncio.to_thread(run)


POST_FORMS: dict[str, dict[str, str]] = {
    "create_topic": {"name": "audited", "queues": "1"},
    "update_topic": {"queues": "2"},
    "send_test": {"body": "b"},
    "reset_offsets": {"topic": TOPIC, "position": "earliest"},
    "dlq_resend": {"confirm": "yes"},
    "delete_topic": {},
}


async def test_every_post_route_needs_csrf_and_every_write_is_audited(cluster: Cluster) -> None:
    await send(cluster, 4)
    await commit_all(cluster, 4)  # the group exists, so its reset succeeds

    def run() -> None:
        app = create_app(_config(cluster))
        writes = {r.name: r.path for r in app.routes
                  if isinstance(r, Route) and "POST" in (r.methods or ())
                  and r.name not in ("login", "logout")}  # fmt: skip
        assert set(writes) == set(POST_FORMS), "a new write route: add it to POST_FORMS"
        paths = {n: p.replace("{topic}", "audited").replace("{group}", GROUP)
                 for n, p in writes.items()}  # fmt: skip
        paths["reset_offsets"] = writes["reset_offsets"].replace("{group}", GROUP)
        with TestClient(app) as web:
            token = _csrf(web.get("/").text)  # the session cookie
            for name, path in paths.items():
                denied = web.post(path, data=POST_FORMS[name], follow_redirects=False)
                assert denied.status_code == 403, (name, denied.status_code)
                wrong = web.post(path, data={**POST_FORMS[name], "csrf": "0" * 64},
                                 follow_redirects=False)  # fmt: skip
                assert wrong.status_code == 403, name
            for name, path in paths.items():  # create first, delete last
                done = web.post(path, data={**POST_FORMS[name], "csrf": token},
                                follow_redirects=False)  # fmt: skip
                assert done.status_code == 303, (name, done.status_code, done.text)
        entries = [
            json.loads(line) for line in (cluster.tmp / "audit.jsonl").read_text().splitlines()
        ]
        denied_paths = [e["action"] for e in entries if e["result"] == "denied: csrf"]
        assert sorted(denied_paths) == sorted(list(paths.values()) * 2)
        done_actions = {e["action"] for e in entries if e["result"] != "denied: csrf"}
        assert done_actions == set(POST_FORMS), done_actions  # a resend of nothing included
        results = {e["action"]: e["result"] for e in entries if e["result"] != "denied: csrf"}
        for action, result in results.items():
            want = "nothing selected" if action == "dlq_resend" else "ok"
            assert result.split(":")[0] == want, (action, result)
        assert all(e["user"] == "anonymous" and e["ip"] for e in entries)
        # writes switched off: every route refuses, token or not
        with TestClient(create_app(_config(cluster, allow_writes=False))) as web:
            token = _csrf(web.get("/").text)
            for name, path in paths.items():
                off = web.post(path, data={**POST_FORMS[name], "csrf": token},
                               follow_redirects=False)  # fmt: skip
                assert off.status_code == 403 and "allow_writes" in off.text, name

    await asyncio.to_thread(run)


async def test_group_page_members_lag_in_time_and_reset_by_time(cluster: Cluster) -> None:
    """The group page lists the online member, shows the lag in time, and a reset to a time
    moves the committed offsets to the first message stored at or after it."""
    await send(cluster, 10, prefix="old")
    await asyncio.sleep(0.05)
    middle = int(time.time() * 1000)
    await asyncio.sleep(0.05)
    await send(cluster, 6, prefix="new")
    await commit_all(cluster, 16)
    consumer = AsyncSimpleConsumer([cluster.namesrv], GROUP, SimpleConfig(await_duration_s=0.2),
                                   subscriptions={TOPIC: "*"})  # fmt: skip
    await consumer.start()
    try:

        def run() -> tuple[str, str, str]:
            with TestClient(create_app(_config(cluster))) as web:
                page = ""
                for _ in range(50):  # bounded: the member's heartbeat
                    page = web.get(f"/groups/{GROUP}").text
                    if consumer.client_id in page:
                        break
                    time.sleep(0.1)
                done = web.post(f"/groups/{GROUP}/reset", data={
                    "topic": TOPIC, "position": "timestamp", "at": str(middle),
                    "csrf": _csrf(page)})  # fmt: skip
                lagged = ""
                for _ in range(50):  # bounded: the poller's next sample
                    lagged = web.get(f"/groups/{GROUP}").text
                    if 'id="lag" sse-swap="lag-billing">6<' in lagged and " s</b> old" in lagged:
                        break
                    time.sleep(0.1)
                return page, done.text, lagged

        page, after, lagged = await asyncio.to_thread(run)
    finally:
        await consumer.close()
    assert consumer.client_id in page, page
    assert 'id="result">ok<' in after, after
    assert 'id="lag" sse-swap="lag-billing">6<' in lagged, lagged  # the 6 "new" ones
    lag_ms = re.search(r'id="lagms" sse-swap="lagms-billing">([0-9.]+) (ms|s)</b>', lagged)
    assert lag_ms and lag_ms.group(2) in ("ms", "s") and float(lag_ms.group(1)) > 0, lagged

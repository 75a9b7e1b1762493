"""deploy/: the Grafana dashboard and the Prometheus alert rules parse, and every metric their
expressions name is one an OrbitMQ broker exports (so a renamed metric breaks this test, not a
production dashboard). ``promtool check rules`` runs too where Prometheus is installed."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from orbitmq.broker.controller import BrokerController
from orbitmq.proxy.metrics import ProxyMetrics
from orbitmq.testing import small_broker_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "rocketmq-alerts.yaml"
DASHBOARD = DEPLOY / "grafana" / "orbitmq-rocketmq-overview.json"

# PromQL words that are not metric names (functions are recognised by the "(" after them).
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
            "unless", "bool", "offset", "inf", "nan"}  # fmt: skip
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    s = re.sub(r"\{[^}]*\}", "", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", "", s)  # range and subquery windows
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", s)
    s = re.sub(r"\boffset\s+\w+", "", s)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        word = m.group(0)
        rest = s[m.end() :].lstrip()
        if rest.startswith("(") or word.lower() in KEYWORDS:
            continue
        if m.start() > 0 and (s[m.start() - 1].isdigit() or s[m.start() - 1] == "."):
            continue  # the exponent of 1e9
        names.add(word)
    return names


@pytest.fixture(scope="module")
def labelled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """Every sample name the broker's and the proxy's registries can expose (families without
    samples yet included) with the label names it carries (the union over both registries),
    plus ``up``, which Prometheus adds per target with ``job`` and ``instance``."""
    b = BrokerController(small_broker_config(tmp_path_factory.mktemp("deploy") / "s"))
    out: dict[str, set[str]] = {"up": {"job", "instance"}}
    for registry in (b.metrics.registry, ProxyMetrics("C", "127.0.0.1:8081").registry):
        for fam in registry.collect():
            labels = set(getattr(fam, "_labelnames", ()))  # the labels a family was built with
            for suffix in SUFFIXES.get(fam.type, ("",)):
                extra = {"le"} if suffix == "_bucket" else set()
                out.setdefault(fam.name + suffix, set()).update(labels | extra)
            for sample in fam.samples:
                out.setdefault(sample.name, set()).update(sample.labels)
    return out


@pytest.fixture(scope="module")
def exported(labelled: dict[str, set[str]]) -> set[str]:
    return set(labelled)


@pytest.fixture(scope="module")
def broker_exported(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The family names of the broker's registry alone."""
    b = BrokerController(small_broker_config(tmp_path_factory.mktemp("deploy-b") / "s"))
    return {fam.name for fam in b.metrics.registry.collect()}


# The RocketMQ 5 families of transactions, timers, Pop revive and the proxy: each exported
# and used by an alert rule or a dashboard panel.
SERVICE_FAMILIES = (
    "rocketmq_commit_messages_total", "rocketmq_rollback_messages_total",
    "rocketmq_half_messages", "rocketmq_finish_message_latency_bucket",
    "rocketmq_timer_enqueue_lag", "rocketmq_timer_dequeue_lag",
    "rocketmq_timer_enqueue_latency_milliseconds", "rocketmq_timer_dequeue_latency_milliseconds",
    "rocketmq_pop_revive_in_message_total", "rocketmq_pop_revive_out_message_total",
    "rocketmq_pop_revive_lag", "rocketmq_pop_revive_latency_milliseconds",
    "rocketmq_pop_offset_buffer_size", "rocketmq_pop_checkpoint_buffer_size",
    "rocketmq_proxy_up", "rocketmq_producer_connections",
    "rocketmq_processor_watermark", "rocketmq_storage_message_reserve_time_milliseconds",
    "rocketmq_pop_revive_retry_messages_total",
    "rocketmq_pop_buffer_scan_time_consume_milliseconds_bucket",
)  # fmt: skip

BROKER_FAMILIES = (
    "rocketmq_processor_watermark", "rocketmq_storage_message_reserve_time_milliseconds",
    "rocketmq_pop_revive_retry_messages", "rocketmq_pop_buffer_scan_time_consume_milliseconds",
    "rocketmq_producer_connections", "rocketmq_consumer_connections",
)  # fmt: skip
"""Exported by the broker itself (the proxy has its own producer and consumer connections)."""


def test_broker_exports_its_families(broker_exported: set[str]) -> None:
    for name in BROKER_FAMILIES:
        assert name in broker_exported, name


def test_service_and_proxy_families_are_exported_and_used(exported: set[str]) -> None:
    used = set().union(*(metric_names(r["expr"]) for r in rules()))
    doc = json.loads(DASHBOARD.read_text())
    used |= set().union(
        *(metric_names(e.replace("$__rate_interval", "1m")) for e in dashboard_exprs(doc))
    )
    for name in SERVICE_FAMILIES:
        assert name in exported, name
        assert name in used, name


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_alert_rules_parse_and_name_only_exported_metrics(exported: set[str]) -> None:
    found = rules()
    assert len(found) >= 10
    for rule in found:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert rule["alert"] and rule["labels"]["severity"] in {"info", "warning", "critical"}
        names = metric_names(rule["expr"])
        assert names, rule["alert"]
        assert names <= exported, (rule["alert"], names - exported)
    used = set().union(*(metric_names(r["expr"]) for r in found))
    assert any(n.startswith("rocketmq_consumer_lag") for n in used)


def dashboard_exprs(doc: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    for var in doc["templating"]["list"]:
        m = re.fullmatch(r"label_values\((.*),\s*\w+\)", var.get("query", ""))
        if var["type"] == "query":
            assert m, var
            exprs.append(m.group(1))
    return exprs


def test_dashboard_is_grafana_json_on_exported_metrics(exported: set[str]) -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] and doc["title"] and doc["panels"]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    titles = " ".join(p["title"].lower() for p in doc["panels"])
    for topic in ("lag", "in / s", "out / s", "storage", "latency"):
        assert topic in titles, topic
    for expr in dashboard_exprs(doc):
        names = metric_names(expr.replace("$__rate_interval", "1m"))
        assert names and names <= exported, (expr, names - exported)


def all_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [r["expr"] for r in rules()] + dashboard_exprs(doc)
    return [e.replace("$__rate_interval", "1m") for e in exprs]


def label_uses(expr: str) -> tuple[dict[str, set[str]], set[str]]:
    """(metric name -> label names its matchers test, label names of by/on/... clauses)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    matched: dict[str, set[str]] = {}
    for m in re.finditer(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^}]*)\}", s):
        names = set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", m.group(2)))
        matched.setdefault(m.group(1), set()).update(names)
    grouped: set[str] = set()
    for m in re.finditer(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", s):
        grouped.update(x.strip() for x in m.group(1).split(",") if x.strip())
    return matched, grouped


TARGET_LABELS = {"job", "instance"}
"""Added by Prometheus to every series it scrapes."""


def test_alert_and_panel_labels_exist(labelled: dict[str, set[str]]) -> None:
    """Every label a rule or a panel matches on or groups by is one its metrics carry (the
    is_system / is_retry / processor / put_status labels included): a renamed label fails."""
    for expr in all_exprs():
        matched, grouped = label_uses(expr)
        carried = set(TARGET_LABELS)
        for name in metric_names(expr):
            carried |= labelled.get(name, set())
        for name, labels in matched.items():
            has = labelled[name] | TARGET_LABELS
            assert labels <= has, (expr, name, labels - has)
        assert grouped <= carried, (expr, grouped - carried)


def test_label_use_extraction() -> None:
    matched, grouped = label_uses(
        'sum by (topic, is_retry) (rate(a_total{is_system="false", x=~"y"}[1m])) > on (cluster) b'
    )
    assert matched == {"a_total": {"is_system", "x"}}
    assert grouped == {"topic", "is_retry", "cluster"}


def test_metric_name_extraction() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, code) (rate(a_bucket{x=~"b|c"}[5m]))) > 1e9 '
        "and b_total offset 10m unless on (x) c"
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "c"}


@pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool (Prometheus) not installed: `make promtool` installs Debian's prometheus",
)
def test_promtool_checks_the_rules() -> None:
    out = subprocess.run(
        ["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules())} rules found" in out.stdout, out.stdout


@pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool (Prometheus) not installed: `make promtool` installs Debian's prometheus",
)
def test_promtool_unit_tests_of_the_alerts() -> None:
    """tests/deploy/rocketmq-alerts.test.yaml: the watermark, producers-gone, near-retention
    and Pop retry-put alerts fire on the series they are written for, and only then."""
    here = Path(__file__).parent
    out = subprocess.run(
        ["promtool", "test", "rules", "rocketmq-alerts.test.yaml"],
        capture_output=True, text=True, timeout=60, cwd=here,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout, out.stdout


def test_console_doc_lists_every_exported_family(labelled: dict[str, set[str]]) -> None:
    """docs/console.md#metrics names every rocketmq_* family a broker or a proxy exports."""
    doc = (DEPLOY.parent / "docs" / "console.md").read_text()
    listed = set(re.findall(r"`(rocketmq_[a-z_]+)`", doc))
    families = {n for n in labelled if n.startswith("rocketmq_")}
    for name in sorted(families):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in listed or base in listed, name


# ``promtool check metrics`` asks for base units; RocketMQ 5 (and the dashboards and rules
# written for it) name these in milliseconds, so this one complaint is expected for them and
# only for them. Every other lint it makes (help text, counter suffixes, reserved names,
# parse errors) is enforced.
MS_UNIT = re.compile(
    r'^(rocketmq_\w+_milliseconds) use base unit "seconds" instead of "milliseconds"$'
)


def promtool_problems(text: bytes) -> tuple[list[str], set[str]]:
    """(lint lines other than RocketMQ's millisecond names, the millisecond names it named)."""
    out = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, timeout=60
    )
    assert out.returncode in (0, 3), out.stderr.decode()  # 1: it could not parse the text
    lines = (out.stdout + out.stderr).decode().splitlines()
    named = {m.group(1) for line in lines if (m := MS_UNIT.match(line.strip()))}
    return [ln for ln in lines if ln.strip() and not MS_UNIT.match(ln.strip())], named


def test_promtool_filter_keeps_other_complaints() -> None:
    assert MS_UNIT.match('rocketmq_pop_revive_latency_milliseconds use base unit "seconds" '
                         'instead of "milliseconds"')  # fmt: skip
    assert not MS_UNIT.match('orbitmq_x_milliseconds use base unit "seconds" instead of '
                             '"milliseconds"')  # fmt: skip
    assert not MS_UNIT.match('rocketmq_messages_in counter metrics should have "_total" suffix')


@pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool (Prometheus) not installed: `make promtool` installs Debian's prometheus",
)
async def test_promtool_checks_the_exported_metrics(tmp_path: Path) -> None:
    """The text a broker (after a send, a pull and a commit, so the lag families have samples)
    and a proxy serve passes ``promtool check metrics``, but for the millisecond names."""
    from prometheus_client import generate_latest

    from orbitmq.net.client import RemotingClient
    from tests.broker.test_broker import pull_frame, send_frame

    b = BrokerController(small_broker_config(tmp_path / "s"))
    await b.start()
    client = RemotingClient()
    try:
        assert (await client.invoke(b.address, send_frame("T", [b"a", b"b"]))).code == 0
        await asyncio.to_thread(b.store.wait_for_dispatch)
        assert (await client.invoke(b.address, pull_frame("T", 0, 0, group="G"))).code == 0
        b.offsets.set("G", "T", 0, 1)
        broker_text = generate_latest(b.metrics.registry)
    finally:
        await client.close()
        await b.stop()
    assert b"rocketmq_consumer_lag_latency_milliseconds{" in broker_text
    proxy_text = generate_latest(ProxyMetrics("C", "127.0.0.1:8081").registry)
    for text in (broker_text, proxy_text):
        problems, named = promtool_problems(text)
        assert problems == [], problems
        assert all(n.encode() + b"{" in text or n.encode() + b" " in text for n in named)

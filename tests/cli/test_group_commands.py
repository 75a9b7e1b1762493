"""`orbitmq group ...` and `orbitmq consume` against a real cluster (1 NameServer, 2 brokers).

Commands run in-process through typer's CliRunner; `consume` starts a real PushConsumer there.
Each test uses its own topics and groups. Waits are bounded polls, never timed assertions.
"""

from __future__ import annotations

import datetime
import re
import time

import pytest
import typer
from typer.testing import CliRunner, Result

from orbitmq.cli.common import message_line
from orbitmq.cli.group import parse_time
from orbitmq.cli.main import app
from orbitmq.client import BlockingAdminClient, Message, MessageQueue, Producer
from orbitmq.client.consumer.config import PushConfig
from orbitmq.client.consumer.push import PushConsumer
from orbitmq.client.consumer_types import ConsumedMessage, ConsumeFromWhere, ConsumeResult
from orbitmq.common.errors import SubscriptionGroupNotExistError
from orbitmq.common.record import StoredMessage
from tests.cli.conftest import CliCluster

pytestmark = pytest.mark.integration

WAIT_S = 15.0


def cli(cluster: CliCluster, *args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(
        app, list(args), env={"ORBITMQ_NAMESRV": cluster.namesrv, "COLUMNS": "250"}
    )
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == code, (args, result.output)
    assert "Traceback" not in result.output
    return result


def lines_of(output: str) -> list[list[str]]:
    """consume/tail lines split in columns: broker/queue, offset, id, tags=, keys=, body."""
    return [line.split("  ") for line in output.splitlines() if line.strip()]


def total_lag(describe_output: str) -> int:
    match = re.search(r"^total lag (\d+)$", describe_output, re.M)
    assert match, describe_output
    return int(match.group(1))


def queue_rows(describe_output: str, topic: str) -> list[list[str]]:
    """Rows of the describe queue table for ``topic``: topic, broker, queue, broker offset,
    consumer offset, lag, inflight, last consume time."""
    rows = []
    for line in describe_output.splitlines():
        cells = line.split()
        if len(cells) >= 7 and cells[0] == topic and cells[2].isdigit():
            rows.append(cells)
    return rows


def fill(cluster: CliCluster, topic: str) -> list[str]:
    """Topic with 2 queues on each broker; 20 messages: even i tag b / region us, odd i tag a;
    i < 6 region eu. Returns the bodies."""
    cli(cluster, "topic", "create", "-t", topic, "-q", "2")
    bodies = []
    with Producer(cluster.namesrv) as producer:
        for i in range(20):
            body = f"{topic}-{i}"
            producer.send(
                Message(
                    topic,
                    body.encode(),
                    tags="a" if i % 2 else "b",
                    properties={"region": "eu" if i < 6 else "us"},
                )
            )
            bodies.append(body)
    return bodies


def test_consume_count_commits_exactly_and_group_list_describe(cli_cluster: CliCluster) -> None:
    t, g = "GrpCount", "GrpCountG"
    bodies = fill(cli_cluster, t)

    first = lines_of(cli(cli_cluster, "consume", "-t", t, "-g", g, "--from-beginning",
                         "--count", "5").stdout)  # fmt: skip
    assert len(first) == 5
    for line in first:
        assert re.fullmatch(r"broker-[ab]/[01]", line[0]) and line[1].isdigit()
        assert re.fullmatch(r"[0-9A-F]{32}", line[2]) and line[3] in ("tags=a", "tags=b")
        assert line[4] == "keys=-" and line[5] in bodies

    # What was printed is committed, and only that: the group's lag is the rest.
    out = cli(cli_cluster, "group", "describe", g).stdout
    assert total_lag(out) == 15, out
    rows = queue_rows(out, t)
    assert {(r[1], r[2]) for r in rows} == {(b, q) for b in ("broker-a", "broker-b")
                                             for q in ("0", "1")}  # fmt: skip
    assert sum(int(r[3]) for r in rows) == 20
    assert sum(int(r[4]) for r in rows if r[4] != "-") == 5
    assert "no member online" in out

    # The same group continues where it stopped: the other 15, none twice.
    rest = lines_of(cli(cli_cluster, "consume", "-t", t, "-g", g, "--count", "15").stdout)
    seen = [(line[0], line[1]) for line in first + rest]
    assert len(seen) == len(set(seen)) == 20
    assert sorted(line[5] for line in first + rest) == sorted(bodies)
    assert total_lag(cli(cli_cluster, "group", "describe", g).stdout) == 0

    listed = cli(cli_cluster, "group", "list").stdout
    row = next(line for line in listed.splitlines() if f" {g} " in line)
    assert t in row
    assert g in cli(cli_cluster, "group", "list", "-q").stdout.split()


def test_consume_with_tag_and_sql_filters(cli_cluster: CliCluster) -> None:
    t = "GrpFilter"
    bodies = fill(cli_cluster, t)
    tagged = lines_of(cli(cli_cluster, "consume", "-t", t, "-g", "GrpFilterTag",
                          "--from-beginning", "--tag", "a", "--count", "10").stdout)  # fmt: skip
    assert {line[3] for line in tagged} == {"tags=a"}
    assert sorted(line[5] for line in tagged) == sorted(bodies[1::2])

    eu = lines_of(cli(cli_cluster, "consume", "-t", t, "-g", "GrpFilterSql", "--from-beginning",
                      "--sql", "region = 'eu' AND TAGS = 'b'", "--count", "3").stdout)  # fmt: skip
    assert sorted(line[5] for line in eu) == sorted(bodies[0:6:2])

    # --timeout: nothing more matches, so it stops after a quiet second with a count.
    r = cli(cli_cluster, "consume", "-t", t, "-g", "GrpFilterSql", "--sql", "region = 'eu'",
            "--timeout", "1")  # fmt: skip
    assert r.stdout == "" and "no message for 1 s; 0 messages" in r.stderr


def test_consume_errors_are_one_line(cli_cluster: CliCluster) -> None:
    t = "GrpErrors"
    cli(cli_cluster, "topic", "create", "-t", t, "-q", "1")
    r = cli(cli_cluster, "consume", "-t", t, "-g", "GrpBadSql", "--sql", "region = = 'eu'",
            code=1)  # fmt: skip
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: SUBSCRIPTION_PARSE_FAILED"), r.stderr
    assert "region = = 'eu'" in lines[0]
    r = cli(cli_cluster, "consume", "-t", "GrpNoSuchTopic", "-g", "G", "--timeout", "1", code=1)
    assert "no route for topic 'GrpNoSuchTopic'" in r.stderr
    r = cli(cli_cluster, "consume", "-t", t, "-g", "G", "--tag", "a", "--sql", "x = 1", code=2)
    assert "not both" in r.output


def test_unknown_group_is_an_error(cli_cluster: CliCluster) -> None:
    for args in (["group", "describe", "GrpNobody"],
                 ["group", "reset-offset", "GrpNobody", "-t", "GrpErrors", "--to-latest"]):  # fmt: skip
        r = cli(cli_cluster, *args, code=1)
        assert r.stderr.startswith("error: consumer group 'GrpNobody' is unknown"), r.stderr
    with (
        BlockingAdminClient(cli_cluster.namesrv) as admin,
        pytest.raises(SubscriptionGroupNotExistError),
    ):
        admin.consume_stats("GrpNobody")


def test_reset_offset_earliest_latest_timestamp(cli_cluster: CliCluster) -> None:
    t, g = "GrpReset", "GrpResetG"
    cli(cli_cluster, "topic", "create", "-t", t, "-q", "2")
    with Producer(cli_cluster.namesrv) as producer:
        for i in range(6):
            producer.send(Message(t, f"old-{i}".encode()))
        time.sleep(0.05)  # store times: old < cut <= new (ms resolution)
        cut_ms = int(time.time() * 1000)
        time.sleep(0.05)
        for i in range(4):
            producer.send(Message(t, f"new-{i}".encode()))
    cli(cli_cluster, "consume", "-t", t, "-g", g, "--from-beginning", "--count", "10")
    assert total_lag(cli(cli_cluster, "group", "describe", g).stdout) == 0

    r = cli(cli_cluster, "group", "reset-offset", g, "-t", t, "--to-earliest")
    assert f"reset group {g} on topic {t} to earliest: 4 queues on 2 brokers" in r.stdout
    assert total_lag(cli(cli_cluster, "group", "describe", g).stdout) == 10

    cli(cli_cluster, "group", "reset-offset", g, "-t", t, "--to-latest")
    assert total_lag(cli(cli_cluster, "group", "describe", g).stdout) == 0

    r = cli(cli_cluster, "group", "reset-offset", g, "-t", t, "--to-timestamp", str(cut_ms))
    assert f"({cut_ms})" in r.stdout
    assert total_lag(cli(cli_cluster, "group", "describe", g).stdout) == 4
    again = lines_of(cli(cli_cluster, "consume", "-t", t, "-g", g, "--count", "4").stdout)
    assert sorted(line[5] for line in again) == [f"new-{i}" for i in range(4)]

    for bad in ([], ["--to-earliest", "--to-latest"], ["--to-timestamp", "yesterday"]):
        r = cli(cli_cluster, "group", "reset-offset", g, "-t", t, *bad, code=2)
        assert "--to-" in r.output


def test_admin_sees_online_members_and_resets_them(cli_cluster: CliCluster) -> None:
    """describe_group while a PushConsumer runs: one member (merged over both brokers), its
    subscription; a reset to earliest reaches it and it consumes everything again."""
    t, g = "GrpOnline", "GrpOnlineG"
    bodies = fill(cli_cluster, t)
    got: list[str] = []

    def listener(msgs: list[ConsumedMessage]) -> ConsumeResult:
        got.extend(m.body.decode() for m in msgs)
        return ConsumeResult.SUCCESS

    consumer = PushConsumer(
        cli_cluster.namesrv,
        g,
        PushConfig(consume_from_where=ConsumeFromWhere.FIRST_OFFSET, auto_commit_interval_s=0.2),
    )
    consumer.subscribe(t, "a || b")
    consumer.register_listener(listener)
    consumer.start()
    try:
        _wait_until(lambda: len(got) >= 20)
        with BlockingAdminClient(cli_cluster.namesrv) as admin:
            _wait_until(lambda: admin.describe_group(g).total_lag == 0)
            desc = admin.describe_group(g)
            assert [m.client_id for m in desc.members] == [consumer.client_id]
            assert desc.consume_type == "PUSH" and desc.message_model == "CLUSTERING"
            (sub,) = [s for s in desc.members[0].subscriptions if s.topic == t]
            assert sub.expression == "a || b"
            mine = [q for q in desc.queues if q.topic == t]
            assert {q.broker_name for q in mine} == {"broker-a", "broker-b"}
            summary = next(s for s in admin.list_groups() if s.group == g)
            assert summary.members == 1 and t in summary.topics

            reset = admin.reset_offset(g, t, "earliest")
            assert set(reset) == {"broker-a", "broker-b"}
            assert all(o.offset == 0 for offs in reset.values() for o in offs)
            _wait_until(lambda: len(got) >= 40)
        assert sorted(got) == sorted(bodies * 2)
        out = cli(cli_cluster, "group", "describe", g).stdout
        assert consumer.client_id in out and "members (1)" in out
    finally:
        consumer.shutdown()


def _wait_until(check: object, timeout_s: float = WAIT_S) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {check}")
        time.sleep(0.05)


# ---------------------------------------------------------------------------- no cluster


def test_parse_time() -> None:
    assert parse_time("1795338000000") == 1795338000000
    assert parse_time("2026-11-22T10:00:00+01:00") == 1795338000000
    assert parse_time("2026-11-22T09:00:00Z") == 1795338000000
    local = datetime.datetime(2026, 11, 22, 10, 0).astimezone()
    assert parse_time("2026-11-22 10:00") == int(local.timestamp() * 1000)
    for bad in ("yesterday", "2026-13-01", "-5"):
        with pytest.raises(typer.BadParameter):
            parse_time(bad)


def test_message_line_is_shared_by_tail_and_consume() -> None:
    msg = StoredMessage(
        total_size=0, queue_id=1, flag=0, queue_offset=7, physical_offset=0, sys_flag=0,
        born_timestamp_ms=0, born_host=("", 0), store_timestamp_ms=0, store_host=("", 0),
        reconsume_times=0, prepared_transaction_offset=0, body=b"hello\nworld", topic="T",
        properties={"TAGS": "paid", "KEYS": "k1 k2", "UNIQ_CLIENT_MESSAGE_ID_KEYIDX": "AB"},
    )  # fmt: skip
    line = message_line(MessageQueue("T", "broker-a", 1), msg, 80)
    assert line == "broker-a/1  7  AB  tags=paid  keys=k1,k2  hello\\nworld"


def test_group_config_show_set_delete(cli_cluster: CliCluster) -> None:
    g = "GrpConfigG"
    shown = cli(cli_cluster, "group", "config", "show", g).stdout
    assert re.search(r"retry max times\s+16", shown), shown  # RocketMQ's defaults
    assert re.search(r"retry delays\s+10s 30s 1m 2m", shown), shown

    r = cli(cli_cluster, "group", "config", "set", g, "--retry-max-times", "3",
            "--retry-delays", "5s, 30s,1m", "--pop-retry-delays", "none")  # fmt: skip
    assert "updated on 2 brokers" in r.stdout
    with BlockingAdminClient(cli_cluster.namesrv) as admin:
        configs = admin.group_configs()
        for broker in ("broker-a", "broker-b"):
            (cfg,) = [c for c in configs[broker] if c.group_name == g]
            assert cfg.retry_max_times == 3 and cfg.retry_delays_ms == [5000, 30000, 60000]
            assert cfg.pop_retry_delays_ms == []
    # Settings not given keep their values.
    cli(cli_cluster, "group", "config", "set", g, "--orderly-retry-interval", "250ms")
    shown = cli(cli_cluster, "group", "config", "show", g).stdout
    assert re.search(r"retry max times\s+3\b", shown) and "250ms" in shown, shown
    assert "none (the invisible time alone)" in shown

    for bad in (["--retry-delays", "soon"], ["--orderly-retry-interval", "-1s"], []):
        r = cli(cli_cluster, "group", "config", "set", g, *bad, code=2)
    r = cli(cli_cluster, "group", "config", "set", g, "--retry-max-times", "5000", code=1)
    assert r.stderr.startswith("error:") and "retry_max_times" in r.stderr, r.stderr

    r = cli(cli_cluster, "group", "config", "delete", g)
    assert "broker-a" in r.stdout and "broker-b" in r.stdout
    shown = cli(cli_cluster, "group", "config", "show", g).stdout
    assert re.search(r"retry max times\s+16", shown), shown

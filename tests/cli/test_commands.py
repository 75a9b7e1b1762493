"""The client commands of `orbitmq` against a real cluster (1 NameServer, 2 brokers, processes).

Commands run in-process through typer's CliRunner, except where a test needs a live process
(tail following new messages, Ctrl-C): those run `orbitmq` as a child process, stopped by PID.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from orbitmq.bench.__main__ import main as bench_main
from orbitmq.bench.produce import run as produce_run
from orbitmq.cli.main import app
from orbitmq.client import BlockingAdminClient, Message, Producer
from tests.cli.conftest import CliCluster
from tests.harness import REPO, ProcessCluster

pytestmark = pytest.mark.integration

ID = re.compile(r"\b[0-9A-F]{32}\b")


def cli(cluster: CliCluster, *args: str, code: int = 0) -> Result:
    runner = CliRunner()
    result = runner.invoke(
        app, list(args), env={"ORBITMQ_NAMESRV": cluster.namesrv, "COLUMNS": "250"}
    )
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == code, (args, result.output)
    assert "Traceback" not in result.output
    return result


def tail_lines(output: str) -> list[list[str]]:
    return [line.split("  ") for line in output.splitlines() if line.strip()]


def queue_rows(output: str, broker: str) -> list[list[str]]:
    """Rows of the describe queue table for one broker: [broker, queue, min, max, count, ...]."""
    rows = []
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if len(cells) >= 5 and cells[0] == broker and cells[1].isdigit():
            rows.append(cells)
    return rows


def test_topic_create_list_describe_update_delete(cli_cluster: CliCluster) -> None:
    t = "CliTopicLife"
    r = cli(cli_cluster, "topic", "create", "-t", t, "--queues", "3", "--type", "fifo",
            "--retention-ms", "600000")  # fmt: skip
    assert "created topic CliTopicLife" in r.output and "3 read / 3 write" in r.output
    assert "FIFO" in r.output
    # Creating it again is refused: create never silently resets a topic.
    r = cli(cli_cluster, "topic", "create", "-t", t, code=1)
    assert "already exists" in r.stderr

    assert t in cli(cli_cluster, "topic", "list", "-q").stdout.split()
    table = cli(cli_cluster, "topic", "list").stdout
    row = next(line for line in table.splitlines() if t in line)
    assert "broker-a, broker-b" in row and "3/3, 3/3" in row and "FIFO" in row
    assert "600000 ms" in row

    cli(cli_cluster, "send", "-t", t, "--count", "30", "--size", "16")
    out = cli(cli_cluster, "topic", "describe", "-t", t).stdout
    assert "type FIFO, perm RW" in out
    for broker, addr in cli_cluster.brokers.items():
        assert re.search(rf"{broker}\s*│ DefaultCluster\s*│ {addr}\s*│\s*3 │\s*3 │ RW", out), out
        rows = queue_rows(out, broker)
        assert [r[1] for r in rows] == ["0", "1", "2"], out
    counts = [int(r[4]) for b in cli_cluster.brokers for r in queue_rows(out, b)]
    assert sum(counts) == 30
    assert re.search(r"total\s*│.*│\s*30\s*│", out), out

    # update keeps what is not given: type and retention stay, queues and perm change.
    r = cli(cli_cluster, "topic", "update", "-t", t, "--write-queues", "2", "--perm", "R")
    assert "3 read / 2 write queues, perm R-, type FIFO" in r.stdout
    with BlockingAdminClient(cli_cluster.namesrv) as admin:
        for addr in cli_cluster.brokers.values():
            (config,) = [c for c in admin.topic_configs(addr) if c.topic_name == t]
            assert (config.read_queue_nums, config.write_queue_nums) == (3, 2)
            assert config.perm == 4 and config.message_type == "FIFO"
            assert config.retention_ms == 600000
    r = cli(cli_cluster, "send", "-t", t, "--body", "x", code=1)  # read-only now
    assert "error:" in r.stderr

    r = cli(cli_cluster, "topic", "delete", "-t", t)
    assert "deleted topic CliTopicLife" in r.stdout
    assert t not in cli(cli_cluster, "topic", "list", "-q").stdout.split()
    r = cli(cli_cluster, "topic", "describe", "-t", t, code=1)
    assert "no route for topic 'CliTopicLife'" in r.stderr
    r = cli(cli_cluster, "topic", "update", "-t", t, "--queues", "2", code=1)
    assert "does not exist" in r.stderr


def test_topic_create_on_one_broker_by_name(cli_cluster: CliCluster) -> None:
    t = "CliOneBroker"
    r = cli(cli_cluster, "topic", "create", "-t", t, "-q", "2", "--broker", "broker-b")
    assert cli_cluster.brokers["broker-b"] in r.stdout
    assert cli_cluster.brokers["broker-a"] not in r.stdout
    out = cli(cli_cluster, "topic", "describe", "-t", t).stdout
    assert queue_rows(out, "broker-b") and not queue_rows(out, "broker-a")
    r = cli(cli_cluster, "topic", "create", "-t", "CliNoSuch", "--broker", "broker-z", code=1)
    assert "no broker 'broker-z'" in r.stderr
    r = cli(cli_cluster, "topic", "create", "-t", "CliBadPerm", "--perm", "X", code=2)
    assert "--perm" in r.output  # a usage error, not a runtime one


def test_send_then_tail_from_beginning(cli_cluster: CliCluster) -> None:
    t = "CliRoundTrip"
    cli(cli_cluster, "topic", "create", "-t", t, "-q", "2")
    single = cli(cli_cluster, "send", "-t", t, "--tag", "paid", "--key", "k1;k2",
                 "--body", "hello\tworld", "-p", "origin=test").stdout  # fmt: skip
    (single_id,) = ID.findall(single)
    assert "SEND_OK" in single
    r = cli(cli_cluster, "send", "-t", t, "--count", "40", "--size", "32", "--async")
    assert re.search(r"sent 40 messages .* msgs/s", r.stdout), r.stdout
    cli(cli_cluster, "send", "-t", t, "--count", "5", "--size", "20", "--sync", "--tag", "s")

    out = cli(cli_cluster, "tail", "-t", t, "--from-beginning", "--count", "46").stdout
    lines = tail_lines(out)
    assert len(lines) == 46, out
    ids = [line[2] for line in lines]
    assert len(set(ids)) == 46 and single_id in ids
    # Every message of every queue of both brokers, each queue in offset order from 0.
    per_queue: dict[str, list[int]] = {}
    for line in lines:
        per_queue.setdefault(line[0], []).append(int(line[1]))
    with BlockingAdminClient(cli_cluster.namesrv) as admin:
        stored = {
            f"{s.broker_name}/{q.queue_id}": q.max_offset
            for s in admin.describe_topic(t).stats
            for q in s.queues
            if q.max_offset
        }
    assert {k: len(v) for k, v in per_queue.items()} == stored
    assert all(offs == list(range(len(offs))) for offs in per_queue.values())
    bodies = {line[5] for line in lines}
    assert {f"message {i} " + "x" * (32 - len(f"message {i} ")) for i in range(40)} <= bodies
    (hello,) = [line for line in lines if line[2] == single_id]
    assert hello[3:] == ["tags=paid", "keys=k1,k2", "hello\\tworld"]

    tagged = cli(cli_cluster, "tail", "-t", t, "--from-beginning", "--count", "5", "--tag", "s")
    assert [line[3] for line in tail_lines(tagged.stdout)] == ["tags=s"] * 5


def test_send_body_from_stdin_and_binary_preview(cli_cluster: CliCluster) -> None:
    t = "CliStdin"
    runner = CliRunner()
    env = {"ORBITMQ_NAMESRV": cli_cluster.namesrv, "COLUMNS": "250"}
    r = runner.invoke(app, ["send", "-t", t, "--body", "-"], input=b"\x00\xffbin", env=env)
    assert r.exit_code == 0, r.output
    (msg_id,) = ID.findall(r.stdout)
    out = cli(cli_cluster, "message", "get", "-t", t, "--id", msg_id).stdout
    assert "hex:00ff62696e" in out
    r = runner.invoke(app, ["send", "-t", t, "--body", "-"], input=b"", env=env)
    assert r.exit_code == 1 and "body" in r.stderr and "Traceback" not in r.output


def test_message_get_and_query(cli_cluster: CliCluster) -> None:
    t = "CliLookup"
    cli(cli_cluster, "topic", "create", "-t", t, "-q", "2")
    first = cli(cli_cluster, "send", "-t", t, "--key", "order-7", "--tag", "A",
                "--body", "first", "-p", "region=eu").stdout  # fmt: skip
    cli(cli_cluster, "send", "-t", t, "--key", "order-7", "--body", "second")
    cli(cli_cluster, "send", "-t", t, "--key", "order-8", "--body", "other")
    (msg_id,) = ID.findall(first)

    out = cli(cli_cluster, "message", "get", "-t", t, "--id", msg_id).stdout
    assert msg_id in out
    for expected in ("tags               A", "keys               order-7", "region=eu",
                     "body               5 bytes", "queue offset", "store time"):  # fmt: skip
        assert expected in out, out
    assert out.rstrip().endswith("first")

    out = cli(cli_cluster, "message", "query", "-t", t, "--key", "order-7").stdout
    assert out.count("keys               order-7") == 2
    assert "\nfirst\n" in out and "\nsecond\n" in out and "other" not in out
    assert "2 messages" in out

    r = cli(cli_cluster, "message", "get", "-t", t, "--id", "0" * 32, code=1)
    assert f"no message {'0' * 32}" in r.stderr
    r = cli(cli_cluster, "message", "query", "-t", t, "--key", "nope", code=1)
    assert "no message with key 'nope'" in r.stderr


def test_cluster_list(cli_cluster: CliCluster) -> None:
    out = cli(cli_cluster, "cluster", "list").stdout
    assert "cluster DefaultCluster" in out
    for name, addr in cli_cluster.brokers.items():
        row = next(line for line in out.splitlines() if name in line)
        assert re.search(
            rf"{name}\s+{addr}\s+[\d.]+ (B|KiB|MiB)\s+\d+ B\s+\d+%\s+[\d.]+ (B|KiB|MiB|GiB)\s+"
            "ASYNC_FLUSH",
            row,
        )


def _orbitmq(cluster: CliCluster, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", "from orbitmq.cli.main import main; main()", *args],
        cwd=REPO,
        env=dict(os.environ, ORBITMQ_NAMESRV=cluster.namesrv, PYTHONUNBUFFERED="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _read_lines(proc: subprocess.Popen[str], into: list[str]) -> threading.Thread:
    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            into.append(line.rstrip("\n"))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def test_tail_follows_new_messages_and_stops_on_ctrl_c(cli_cluster: CliCluster) -> None:
    t = "CliFollow"
    with Producer(cli_cluster.namesrv) as producer:
        for i in range(5):
            producer.send(Message(t, f"old {i}".encode()))
        proc = _orbitmq(cli_cluster, "tail", "-t", t)
        lines: list[str] = []
        reader = _read_lines(proc, lines)
        try:
            # tail starts at the max offsets: keep sending until it shows three messages.
            deadline = time.monotonic() + 30
            sent = 0
            while len(lines) < 3 and time.monotonic() < deadline and proc.poll() is None:
                producer.send(Message(t, f"new {sent}".encode(), tags="live"))
                sent += 1
                time.sleep(0.2)
            assert len(lines) >= 3, (lines, proc.poll())
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=15)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        reader.join(5)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and re.search(r"\d+ messages", err), err
    bodies = [line.split("  ")[5] for line in lines]
    assert all(b.startswith("new ") for b in bodies), lines  # nothing from before it started
    assert all("tags=live" in line for line in lines)


def test_bench_produce_async_in_process(cli_cluster: CliCluster, tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    r = cli(cli_cluster, "bench", "produce", "--topic", "CliBench", "--count", "300",
            "--size", "100", "--queues", "2", "--json", str(report))  # fmt: skip
    out = r.stdout
    assert "mode async, automatic batching, 1 producer, 100 B bodies, 300 msgs" in out
    assert "broker flush: broker-a ASYNC_FLUSH, broker-b ASYNC_FLUSH" in out
    assert re.search(r"throughput [\d,]+ msgs/s, [\d.]+ MiB/s", out), out
    assert re.search(r"p50 [\d.]+  p90 [\d.]+  p99 [\d.]+  p99.9 [\d.]+  max [\d.]+", out)
    data = json.loads(report.read_text())
    assert data["messages"] == 300 and data["errors"] == 0
    # Every answered message (and the warm-up: one per broker) reached the queues.
    assert data["warmup"] == 2 and data["stored"] == 302
    lat = data["latency_ms"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p99.9"] <= lat["max"]


def test_bench_produce_two_processes_sync_batches(cli_cluster: CliCluster, tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    r = cli(cli_cluster, "bench", "produce", "--topic", "CliBench2", "--producers", "2",
            "--count", "101", "--size", "64", "--mode", "sync", "--batch", "10",
            "--json", str(report))  # fmt: skip
    assert "2 producers" in r.stdout and "round trip" in r.stdout
    data = json.loads(report.read_text())
    assert [w["messages"] for w in data["workers"]] == [51, 50]
    assert data["messages"] == 101 and data["stored"] == 101 + data["warmup"]


def test_bench_produce_blocking_api(cli_cluster: CliCluster, tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    r = cli(cli_cluster, "bench", "produce", "--topic", "CliBenchB", "--count", "300",
            "--size", "100", "--api", "blocking", "--json", str(report))  # fmt: skip
    assert "mode async, automatic batching, blocking Producer, 1 producer" in r.stdout
    assert re.search(r"client CPU [\d.,]+ us/msg", r.stdout), r.stdout
    data = json.loads(report.read_text())
    assert data["messages"] == 300 and data["errors"] == 0
    assert data["stored"] == 300 + data["warmup"]
    assert data["client_cpu_us_per_msg"] > 0
    lat = data["latency_ms"]
    assert 0 < lat["p50"] <= lat["max"]
    # Two processes, sync sends of batches of 10 through the blocking Producer.
    r = cli(cli_cluster, "bench", "produce", "--topic", "CliBenchB", "--producers", "2",
            "--count", "41", "--size", "64", "--mode", "sync", "--batch", "10",
            "--api", "blocking", "--json", str(report))  # fmt: skip
    data = json.loads(report.read_text())
    assert [w["messages"] for w in data["workers"]] == [21, 20] and data["errors"] == 0


def test_python_m_bench_produce_oneway_for_a_duration_at_a_rate(
    cli_cluster: CliCluster,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    report = tmp_path / "r.json"
    monkeypatch.setattr(produce_run, "STATUS_S", 0.1)  # status lines while it runs
    rc = bench_main(["produce", "--namesrv", cli_cluster.namesrv, "--topic", "CliBench3",
                     "--mode", "oneway", "--duration", "0.5", "--rate", "200", "--size", "10",
                     "--json", str(report)])  # fmt: skip
    assert rc == 0
    captured = capsys.readouterr()
    out = captured.out
    assert re.search(r"running \d+ s: [\d,]+ stored \([\d,]+ msgs/s\)", captured.err), captured.err
    assert "mode oneway" in out and "0.5 s" in out and "rate 200 msgs/s" in out
    assert "-m orbitmq.bench produce --namesrv" in out
    data = json.loads(report.read_text())
    # Paced: never more than the rate allows in the window, and some got through.
    assert 0 < data["messages"] <= 0.5 * 200
    assert data["seconds"] >= 0.5
    assert data["stored"] == data["messages"] + data["warmup"]  # oneway: all arrived here


def test_tail_reports_a_lost_broker_once_and_reads_on_after_its_restart(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    ns = cluster.namesrv()
    store = tmp_path / "restarted"
    broker = cluster.broker("broker-r", [ns.address], store=store)
    port = int(broker.address.rsplit(":", 1)[1])
    own = CliCluster(ns.address, {"broker-r": broker.address})
    t = "CliRestart"
    cli(own, "topic", "create", "-t", t, "-q", "2")
    proc = _orbitmq(own, "tail", "-t", t)
    lines: list[str] = []
    reader = _read_lines(proc, lines)

    def send_until_shown(body: bytes) -> None:
        with Producer(ns.address) as producer:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and proc.poll() is None:
                if any(line.endswith(body.decode()) for line in lines):
                    return
                producer.send(Message(t, body))
                time.sleep(0.3)

    try:
        send_until_shown(b"before")  # tail is up and polling
        broker.stop()
        time.sleep(2.5)  # several failed pulls on both queues
        cluster.broker("broker-r", [ns.address], store=store, port=port)
        send_until_shown(b"after restart")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    reader.join(5)
    assert proc.returncode == 0, err
    bodies = [line.split("  ")[5] for line in lines]
    assert bodies and bodies[0] == "before" and bodies[-1] == "after restart", lines
    assert set(bodies) == {"before", "after restart"}
    # One line for the lost broker (not one per queue or per retry), one when it is back,
    # and none of the client library's own warnings.
    assert err.count("broker-r: ") == 2, err
    assert "retrying" in err and "broker-r: reading again" in err, err
    assert "Traceback" not in err and "WARNING" not in err

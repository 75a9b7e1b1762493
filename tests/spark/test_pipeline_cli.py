"""``orbitmq pipeline archive|aggregate|dlq-reprocess`` against a real cluster (processes) on
the shared local SparkSession (the commands reuse the active session), plus what the commands
promise without Spark work: a clear message without the spark extra, ``orbitmq --help``
without importing pyspark, one-line errors, the session settings."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from orbitmq.cli import pipeline as pipeline_cli
from orbitmq.cli.main import app
from orbitmq.client import BlockingAdminClient, Message, Producer
from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame
from orbitmq.spark.session import SessionOptions, is_local_master, session_conf
from tests.spark.conftest import OrbitCluster


def cli(cluster: OrbitCluster, *args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(
        app, ["pipeline", *args], env={"ORBITMQ_NAMESRV": cluster.namesrv, "COLUMNS": "250"}
    )
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == code, (args, result.output)
    assert "Traceback" not in result.output
    return result


def send(cluster: OrbitCluster, topic: str, bodies: list[str]) -> list[Any]:
    with Producer(cluster.namesrv) as producer:
        return [
            producer.send(Message(topic, b.encode(), tags="t", keys=[f"k{i}"]))
            for i, b in enumerate(bodies)
        ]


def bodies(cluster: OrbitCluster, topic: str) -> list[str]:
    """Every body in ``topic``, read with plain pulls (cheaper than a Spark job)."""
    out: list[str] = []
    with BlockingAdminClient(cluster.namesrv) as admin:
        for mq in admin.queues(topic):
            offset = admin.min_offset(mq)
            while offset < admin.max_offset(mq):
                result = admin.pull(mq, offset, max_nums=256)
                out += [m.body.decode() for m in result.messages]
                offset = result.next_begin_offset
    return out


def test_archive_command(spark: Any, orbit_cluster: OrbitCluster, tmp_path: Path) -> None:
    topic, path = orbit_cluster.topic("cli-arch"), tmp_path / "archive"
    send(orbit_cluster, topic, [f"m{i}" for i in range(20)])
    out = cli(orbit_cluster, "archive", "-t", topic, "--to", str(path)).output
    assert f"archived 20 messages of {topic}" in out
    assert (path / "_checkpoint").is_dir()  # a rerun resumes: see test_examples
    archived = spark.read.parquet(str(path))
    assert sorted(r["value"].decode() for r in archived.select("value").collect()) == sorted(
        f"m{i}" for i in range(20)
    )
    today = {p.name for p in path.iterdir() if p.name.startswith("date=")}
    assert today and all(p.startswith("date=20") for p in today)


def test_aggregate_command(spark: Any, orbit_cluster: OrbitCluster, tmp_path: Path) -> None:
    source, results = orbit_cluster.topic("cli-clicks"), orbit_cluster.topic("cli-counts")
    t0 = dt.datetime(2026, 1, 1, 10, 0, tzinfo=dt.UTC)
    events = [("/", 5), ("/", 20), ("/docs", 30), ("/", 70), ("/docs", 75), ("/", 600)]
    send(
        orbit_cluster,
        source,
        [
            json.dumps({"page": p, "ts": (t0 + dt.timedelta(seconds=s)).isoformat()})
            for p, s in events
        ]
        + ["not json", '{"page": "/no-time"}'],
    )
    out = cli(
        orbit_cluster, "aggregate", "-t", source, "--to", results,
        "--schema", "page STRING, ts TIMESTAMP", "--time-field", "ts", "--group-by", "page",
        "--window", "1 minute", "--watermark", "30 seconds", "--checkpoint", str(tmp_path / "ck"),
    ).output  # fmt: skip
    assert f"aggregated 8 messages of {source} into {results}" in out
    got = sorted(
        (r["window_start"], r["page"], r["count"])
        for r in map(json.loads, bodies(orbit_cluster, results))
    )
    assert got == [
        ("2026-01-01T10:00:00.000Z", "/", 2),
        ("2026-01-01T10:00:00.000Z", "/docs", 1),
        ("2026-01-01T10:01:00.000Z", "/", 1),
        ("2026-01-01T10:01:00.000Z", "/docs", 1),
    ]  # 10:10 is still open: its window closes when later events move the watermark


def dead_letter(cluster: OrbitCluster, group: str, topic: str, texts: list[str]) -> None:
    """Send each body to ``topic`` and dead-letter it for ``group`` (a send-back with
    ``max_reconsume_times`` 0: what a consumer whose retries are used up does)."""
    sent = send(cluster, topic, texts)

    async def back() -> None:
        client = RemotingClient()
        try:
            for r in sent:
                fields = {"group": group, "offset": r.offset, "max_reconsume_times": 0}
                for _ in range(50):  # the broker may not have indexed the message yet
                    frame = Frame(RequestCode.CONSUMER_SEND_MSG_BACK, fields=fields)
                    resp = await client.invoke(cluster.broker_addr, frame, 5.0)
                    if resp.code == ResponseCode.SUCCESS:
                        break
                    await asyncio.sleep(0.1)
                assert resp.code == ResponseCode.SUCCESS and resp.fields["dlq"] is True, resp
        finally:
            await client.close()

    asyncio.run(back())


def test_dlq_reprocess_command(spark: Any, orbit_cluster: OrbitCluster) -> None:
    topic, group = orbit_cluster.topic("cli-dlq", queues=1), f"G-{uuid.uuid4().hex[:6]}"
    dead_letter(orbit_cluster, group, topic, ["bad one", "fine", "bad two"])
    args = ["dlq-reprocess", "-g", group, "--where", "body like 'bad%'"]
    args += ["--fix", "replace(body, 'bad', 'good')"]
    dry = cli(orbit_cluster, *args, "--dry-run").output
    assert f"would resend 2 to {topic}" in dry and "3 dead letters read" in dry
    assert len(bodies(orbit_cluster, topic)) == 3  # nothing sent

    out = cli(orbit_cluster, *args).output
    assert f"resent 2 to {topic}" in out
    assert sorted(bodies(orbit_cluster, topic)) == sorted(
        ["bad one", "fine", "bad two", "good one", "good two"]
    )
    offsets = out.split("--starting-offsets '", 1)[1].split("'", 1)[0]
    assert json.loads(offsets) == {f"%DLQ%{group}": {"broker-a/0": 3}}
    again = cli(orbit_cluster, "dlq-reprocess", "-g", group, "--starting-offsets", offsets).output
    assert "0 dead letters read, 0 resent" in again


def test_dlq_reprocess_without_dlq(spark: Any, orbit_cluster: OrbitCluster) -> None:
    out = cli(orbit_cluster, "dlq-reprocess", "-g", f"never-{uuid.uuid4().hex[:6]}").output
    assert "0 dead letters read, 0 resent" in out


def test_bad_source_option_is_one_line(
    spark: Any, orbit_cluster: OrbitCluster, tmp_path: Path
) -> None:
    topic = orbit_cluster.topic("cli-bad")
    result = cli(
        orbit_cluster, "archive", "-t", topic, "--to", str(tmp_path / "a"),
        "--starting-offsets", "nonsense", code=1,
    )  # fmt: skip
    assert "error:" in result.output and "startingOffsets" in result.output
    assert len(result.output.strip().splitlines()) <= 3


def test_bad_options_exit_2(orbit_cluster: OrbitCluster) -> None:
    cli(orbit_cluster, "archive", "-t", "T", "--to", "x", "--conf", "no-equals-sign", code=2)
    out = cli(
        orbit_cluster, "aggregate", "-t", "T", "--to", "R", "--schema", "a INT",
        "--group-by", "b", code=2,
    ).output  # fmt: skip
    assert "'b' is not in the event schema" in out


def test_without_the_spark_extra(
    orbit_cluster: OrbitCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = pipeline_cli.importlib.util.find_spec

    def find_spec(name: str, *a: Any) -> Any:
        return None if name == "pyspark" else real(name, *a)

    monkeypatch.setattr(pipeline_cli.importlib.util, "find_spec", find_spec)
    out = cli(orbit_cluster, "archive", "-t", "T", "--to", "x", code=1).output
    assert "pyspark is not installed" in out and "pip install 'orbitmq[spark]'" in out


def test_help_does_not_import_pyspark() -> None:
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from orbitmq.cli.main import app\n"
        "r = CliRunner().invoke(app, ['pipeline', '--help'])\n"
        "assert r.exit_code == 0 and 'dlq-reprocess' in r.output, r.output\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('pyspark', 'pyarrow', 'py4j')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_session_settings() -> None:
    assert (
        is_local_master("local[*]") and is_local_master("local") and is_local_master("local[2,3]")
    )
    assert not is_local_master("spark://h:7077") and not is_local_master("yarn")
    conf = session_conf(SessionOptions(conf={"spark.sql.session.timeZone": "Europe/Paris"}))
    assert conf["spark.sql.session.timeZone"] == "Europe/Paris"  # the user's setting wins
    assert conf["spark.ui.enabled"] == "false" and "log4j2" in conf["spark.driver.extraJavaOptions"]
    assert "spark.sql.shuffle.partitions" not in session_conf(SessionOptions(master="yarn"))
    with pytest.raises(ValueError, match="log level"):
        session_conf(SessionOptions(log_level="LOUD"))


def test_spark_error_is_one_line() -> None:
    wrapped = (
        "[STREAM_FAILED] Query terminated with exception: [PYTHON_DATA_SOURCE_ERROR] Failed to "
        "plan Python data source: Traceback (most recent call last):\n"
        '  File "options.py", line 129, in parse_offsets_json\n'
        "orbitmq.spark.options.OptionError: option startingOffsets: not earliest, latest or JSON\n"
        "\nDuring handling of the above exception, another exception occurred:\n\n"
        "Traceback (most recent call last):\n"
        "UnboundLocalError: cannot access local variable 'reader'\n SQLSTATE: 38000"
    )
    line = pipeline_cli._spark_error(RuntimeError(wrapped))
    assert "\n" not in line and "Traceback" not in line
    assert line.endswith("OptionError: option startingOffsets: not earliest, latest or JSON")
    assert pipeline_cli._spark_error(RuntimeError("plain failure")) == "plain failure"

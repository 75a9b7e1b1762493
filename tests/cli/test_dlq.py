"""`orbitmq dlq list|resend` against a real cluster (1 NameServer, 2 brokers, as processes).

A message is dead-lettered by sending it back with ``max_reconsume_times`` 0 (what a consumer
whose retries are used up does); the commands then read the DLQ, which consumers cannot pull,
and send its messages back to their original topic.
"""

from __future__ import annotations

import asyncio

import pytest
from typer.testing import CliRunner, Result

from orbitmq.cli.main import app
from orbitmq.client import BlockingAdminClient, Message, Producer
from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame
from tests.cli.conftest import CliCluster

pytestmark = pytest.mark.integration


def cli(cluster: CliCluster, *args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(
        app, list(args), env={"ORBITMQ_NAMESRV": cluster.namesrv, "COLUMNS": "250"}
    )
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == code, (args, result.output)
    assert "Traceback" not in result.output
    return result


def dead_letter(cluster: CliCluster, group: str, topic: str, bodies: list[bytes]) -> list[str]:
    """Send each body to ``topic`` and dead-letter it for ``group``; the message ids."""
    cli(cluster, "topic", "create", "-t", topic, "-q", "1")
    sent = []
    with Producer(cluster.namesrv) as producer:
        for i, body in enumerate(bodies):
            msg = Message(topic, body, tags="t", keys=[f"{topic}-k{i}"], properties={"p": str(i)})
            sent.append(producer.send(msg))

    async def back() -> None:
        client = RemotingClient()
        try:
            for r in sent:
                addr = cluster.brokers[r.message_queue.broker_name]
                fields = {"group": group, "offset": r.offset, "max_reconsume_times": 0}
                frame = Frame(RequestCode.CONSUMER_SEND_MSG_BACK, fields=fields)
                resp = await client.invoke(addr, frame, 5.0)
                assert resp.code == ResponseCode.SUCCESS and resp.fields["dlq"] is True
        finally:
            await client.close()

    asyncio.run(back())
    return [r.msg_id for r in sent]


def test_dlq_list_and_resend(cli_cluster: CliCluster) -> None:
    ids = dead_letter(cli_cluster, "G-DLQ", "DLQT", [b"first body", b"second body"])
    out = cli(cli_cluster, "dlq", "list", "--group", "G-DLQ").output
    for msg_id in ids:
        assert msg_id in out
    assert out.count("DLQT") == 2 and "max_reconsume_times" in out and "first body" in out
    assert "2 messages" in out

    out = cli(cli_cluster, "dlq", "resend", "--group", "G-DLQ", "--msg-id", ids[1]).output
    assert f"resent {ids[1]} to DLQT" in out and "1 resent, 0 failed" in out
    with BlockingAdminClient(cli_cluster.namesrv) as admin:
        copies = admin.query_by_key("DLQT", "DLQT-k1")
        assert len(copies) == 2  # the original and the resent one
        resent = max(copies, key=lambda m: m.queue_offset)
        assert resent.body == b"second body" and resent.tags == "t"
        assert resent.properties["p"] == "1" and resent.msg_id == ids[1]
        assert "DLQ_ORIGIN_TOPIC" not in resent.properties
        assert resent.reconsume_times == 0
        assert len(admin.dlq_messages("G-DLQ")) == 2  # the DLQ keeps its copies

    out = cli(cli_cluster, "dlq", "resend", "--group", "G-DLQ", "--all").output
    assert "2 resent, 0 failed" in out
    assert "resending 0/2 (" in out  # off a terminal: status lines (stderr) instead of a bar
    with BlockingAdminClient(cli_cluster.namesrv) as admin:
        assert len(admin.query_by_key("DLQT", "DLQT-k0")) == 2


def test_dlq_bad_usage(cli_cluster: CliCluster) -> None:
    out = cli(cli_cluster, "dlq", "list", "--group", "G-EMPTY").output
    assert "no dead-lettered message for group G-EMPTY" in out
    res = cli(cli_cluster, "dlq", "resend", "--group", "G-EMPTY", code=2)
    assert "exactly one of --msg-id ID and --all" in res.output
    cli(cli_cluster, "dlq", "resend", "--group", "G-EMPTY", "--all", "--msg-id", "x", code=2)
    res = cli(cli_cluster, "dlq", "resend", "--group", "G-EMPTY", "--all", code=1)
    assert "no dead-lettered message for group G-EMPTY" in res.output
    res = cli(cli_cluster, "dlq", "list", "--group", "bad group!", code=1)
    assert "group" in res.output
    cli(cli_cluster, "dlq", "list", code=2)  # --group is required

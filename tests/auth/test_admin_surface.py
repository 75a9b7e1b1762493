"""The safe admin surface: runtime config changes only through a typed allowlist, admin rights
needed, and the CVE-2023-33246 / CVE-2023-37582 payloads refused with nothing written."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from orbitmq.broker.config import BrokerConfig
from orbitmq.broker.runtime_config import RUNTIME_KEYS
from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.config_requests import parse_properties
from orbitmq.protocol.fields import FieldError
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.messages import encode_send_body
from orbitmq.protocol.signature import Signer
from tests.auth.conftest import SECRETS, Cluster

ADMIN = Signer("admin", SECRETS["admin"])

# CVE-2023-33246: rocketmqHome + filterServerNums made the broker run a shell script.
CVE_2023_33246 = (
    b"filterServerNums=1\nrocketmqHome=-c $@|sh . echo touch /tmp/orbitmq-pwned-33246;\n"
)
# CVE-2023-37582: configStorePath, then the NameServer wrote its config (attacker text) there.
CVE_2023_37582 = b"configStorePath=/tmp/orbitmq-pwned-37582\nproductEnvName=test\\n* * * * * id\n"


async def _ask(addr: str, frame: Frame, who: Signer | None = ADMIN) -> Frame:
    client = RemotingClient(signer=who)
    try:
        return await client.invoke(addr, frame, 5.0)
    finally:
        await client.close()


def _update(code: int, body: bytes) -> Frame:
    return Frame(code, body=body)


def _files(root: Path) -> set[str]:
    return {str(p) for p in root.rglob("*")}


async def test_cve_payloads_are_refused_and_write_nothing(cluster: Cluster, tmp_path: Path) -> None:
    before = _files(tmp_path)
    for addr, code, body in (
        (cluster.broker.address, RequestCode.UPDATE_BROKER_CONFIG, CVE_2023_33246),
        (cluster.namesrv.address, RequestCode.UPDATE_NAMESRV_CONFIG, CVE_2023_37582),
        (cluster.broker.address, RequestCode.UPDATE_BROKER_CONFIG, CVE_2023_37582),
    ):
        for who in (ADMIN, Signer("carol", SECRETS["carol"]), None):  # even a Super user
            resp = await _ask(addr, _update(code, body), who)
            assert resp.code == ResponseCode.NO_PERMISSION, (code, who, resp)
    assert not os.path.exists("/tmp/orbitmq-pwned-33246")
    assert not os.path.exists("/tmp/orbitmq-pwned-37582")
    after = _files(tmp_path)
    new = {p for p in after - before if not p.endswith((".jsonl", ".lock"))}
    assert not new, new  # only the audit logs grew


async def test_every_immutable_setting_is_refused(cluster: Cluster) -> None:
    addr = cluster.broker.address
    for field in dataclasses.fields(BrokerConfig):
        if field.name in RUNTIME_KEYS:
            continue
        resp = await _ask(
            addr, _update(RequestCode.UPDATE_BROKER_CONFIG, f"{field.name}=1\n".encode())
        )
        assert resp.code == ResponseCode.NO_PERMISSION, field.name
        assert field.name in resp.remark
    assert cluster.broker.config.auto_create_topic is True


async def test_an_allowed_change_applies_and_a_bad_value_changes_nothing(cluster: Cluster) -> None:
    addr = cluster.broker.address
    get = await _ask(addr, Frame(RequestCode.GET_BROKER_CONFIG))
    assert parse_properties(get.body)["auto_create_topic"] == "true"
    bad = await _ask(
        addr,
        _update(
            RequestCode.UPDATE_BROKER_CONFIG, b"auto_create_topic=false\nlong_polling_max_ms=-5\n"
        ),
    )
    assert bad.code == ResponseCode.NO_PERMISSION and cluster.broker.config.auto_create_topic
    ok = await _ask(
        addr, _update(RequestCode.UPDATE_BROKER_CONFIG, b"autoCreateTopicEnable=false\n")
    )
    assert ok.code == ResponseCode.SUCCESS, ok.remark
    send = Frame(RequestCode.SEND_MESSAGE, fields={"topic": "brand-new", "queue_id": 0},
                 body=encode_send_body([b"x"], [b""]))  # fmt: skip
    assert (await _ask(addr, send)).code == ResponseCode.TOPIC_NOT_EXIST
    # admin rights are needed: bob may send to ord* but not change the broker
    bob = Signer("bob", SECRETS["bob"])
    refused = await _ask(
        addr, _update(RequestCode.UPDATE_BROKER_CONFIG, b"auto_create_topic=true\n"), bob
    )
    assert (
        refused.code == ResponseCode.NO_PERMISSION and not cluster.broker.config.auto_create_topic
    )
    audit = (cluster.broker.config.store.store_path / "audit.jsonl").read_text()
    assert '"UPDATE_BROKER_CONFIG"' in audit and '"auto_create_topic": "false"' in audit


@pytest.mark.parametrize(
    "body",
    [
        b"\xff\xfe",
        b"novalue\n",
        b"a b=1\n",
        b"k=1\nk=2\n",
        b"x" * 20000,
        b"".join(b"k%d=1\n" % i for i in range(65)),
    ],
)
def test_config_bodies_are_decoded_strictly(body: bytes) -> None:
    with pytest.raises(FieldError):
        parse_properties(body)

"""Byte-rate quotas per AK/SK user on a broker port (issue #16, Kafka's user quotas): two users
signing from one IP address each get their own quota, so one flooding is throttled while the
other, on the same address, is answered at once."""

from __future__ import annotations

import time
from pathlib import Path

from orbitmq.auth.store import AuthStore
from orbitmq.broker.controller import BrokerController
from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.messages import encode_send_body
from orbitmq.protocol.signature import Signer
from orbitmq.testing import small_broker_config
from tests.auth.conftest import SECRETS, seed

RATE = 50_000.0  # bytes per second, for each user
CHUNK = 25_000


def send() -> Frame:
    body = encode_send_body([bytes(CHUNK)], [b""])
    return Frame(RequestCode.SEND_MESSAGE, fields={"topic": "orders", "queue_id": 0}, body=body)


async def test_two_users_from_one_ip_have_their_own_quotas(tmp_path: Path) -> None:
    auth_file = tmp_path / "auth.json"
    seed(AuthStore(auth_file))
    broker = BrokerController(
        small_broker_config(
            tmp_path / "store",
            auth_enabled=True,
            auth_file=str(auth_file),
            access_key="admin",
            secret_key=SECRETS["admin"],
            produce_quota_bytes_per_s=RATE,
        )
    )
    await broker.start()
    alice = RemotingClient(signer=Signer("alice", SECRETS["alice"], version=2))
    bob = RemotingClient(signer=Signer("bob", SECRETS["bob"], version=2))
    try:
        # alice sends 4 x 25 kB: her 1 s burst (50 kB) is spent, then she is held to 50 kB/s
        throttled = []
        for _ in range(4):
            reply = await alice.invoke(broker.address, send(), 10.0)
            assert reply.code == ResponseCode.SUCCESS, reply.remark
            throttled.append(int(reply.fields.get("throttle_time_ms", 0)))
        assert max(throttled) > 0, throttled
        # bob, from the same 127.0.0.1, has his own account: no throttle, no wait
        start = time.monotonic()
        for _ in range(2):
            reply = await bob.invoke(broker.address, send(), 10.0)
            assert reply.code == ResponseCode.SUCCESS, reply.remark
            assert "throttle_time_ms" not in reply.fields
        assert time.monotonic() - start < 0.5
        # and alice is still over hers
        reply = await alice.invoke(broker.address, send(), 10.0)
        assert int(reply.fields.get("throttle_time_ms", 0)) > 0
    finally:
        await alice.close()
        await bob.close()
        await broker.stop()

"""The gRPC proxy's connections to brokers over mutual TLS (issue #16: "replication and
proxy->broker reject missing or wrong certificates before any application byte").

The proxy's Remoting connections take the process's client TLS context, which ``orbitmq
--tls-ca/--tls-cert/--tls-key proxy`` sets (``cli/tls_options.client_tls``, called here as
the command does). The broker requires TLS and client certificates; the NameServer uses a
certificate of another CA, so a proxy that does not trust the broker's CA still gets routes
and fails only at the broker: a send through it is refused and the broker counts a failed
handshake, and nothing is stored. A proxy without a client certificate is refused alike."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc

from orbitmq.broker.controller import BrokerController
from orbitmq.cli.tls_options import client_tls
from orbitmq.client import AsyncAdminClient
from orbitmq.namesrv.config import NamesrvConfig
from orbitmq.namesrv.controller import NamesrvController
from orbitmq.net.client import set_default_ssl_context
from orbitmq.net.limits import REASON_TLS
from orbitmq.proxy.config import ProxyConfig
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.grpc_v2 import service_pb2 as svc
from orbitmq.proxy.grpc_v2 import service_pb2_grpc
from orbitmq.proxy.server import ProxyServer
from orbitmq.testing import small_broker_config
from tests.net.pki import Ca
from tests.proxy.conftest import metadata, res

TOPIC = "TlsOrders"


def _message(body: bytes) -> pb.Message:
    sp = pb.SystemProperties(
        message_id="01" + body.hex().upper().ljust(32, "0")[:32],
        message_type=pb.MessageType.NORMAL,
        body_encoding=pb.Encoding.IDENTITY,
        born_host="127.0.0.1",
    )
    sp.born_timestamp.GetCurrentTime()
    return pb.Message(topic=res(TOPIC), system_properties=sp, body=body)


async def _send_through(namesrv: str, body: bytes) -> bool:
    """Start a proxy with the process's current client TLS context; True if its send of
    ``body`` succeeded."""
    proxy = await ProxyServer(ProxyConfig(namesrv_addrs=(namesrv,), port=0)).start()
    try:
        async with grpc.aio.insecure_channel(proxy.address) as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            try:
                reply = await stub.SendMessage(
                    svc.SendMessageRequest(messages=[_message(body)]),
                    metadata=metadata("tls-proxy"),
                    timeout=15,
                )
            except grpc.aio.AioRpcError:
                return False
            return bool(reply.status.code == pb.Code.OK)
    finally:
        await proxy.stop(0)


async def test_proxy_to_broker_over_mutual_tls_and_refused_with_a_wrong_ca(
    tmp_path: Path,
) -> None:
    dirs = {name: tmp_path / name for name in ("b", "n", "p")}
    for d in dirs.values():
        d.mkdir()
    broker_ca, ns_ca = Ca.make(dirs["b"], "broker-ca"), Ca.make(dirs["n"], "ns-ca")
    b_cert, b_key = broker_ca.issue(dirs["b"], "localhost", ip="127.0.0.1")
    n_cert, n_key = ns_ca.issue(dirs["n"], "localhost", ip="127.0.0.1")
    p_cert, p_key = broker_ca.issue(dirs["p"], "proxy")
    both = tmp_path / "both-cas.pem"
    both.write_bytes(broker_ca.file.read_bytes() + ns_ca.file.read_bytes())
    try:
        # every Remoting client of this process: trusts both CAs, shows the proxy certificate
        client_tls(tls_ca=both, tls_cert=p_cert, tls_key=p_key)
        ns = NamesrvController(
            NamesrvConfig(
                port=0, tls_mode="required", tls_cert_file=str(n_cert), tls_key_file=str(n_key)
            )
        )
        await ns.start()
        broker = BrokerController(
            small_broker_config(
                tmp_path / "store",
                namesrv_addrs=(ns.address,),
                tls_mode="required",
                tls_cert_file=str(b_cert),
                tls_key_file=str(b_key),
                tls_ca_file=str(broker_ca.file),
                tls_client_auth="required",
            )
        )
        try:
            await broker.start()
            async with AsyncAdminClient([ns.address]) as admin:
                await admin.create_topic(TOPIC, read_queue_nums=1, write_queue_nums=1)
                deadline = time.monotonic() + 10
                while not await _routed(admin):
                    assert time.monotonic() < deadline, "topic not routed"
                    await asyncio.sleep(0.05)
                assert await _send_through(ns.address, b"mtls-ok")
                failed_before = broker.server.refusals.counts[REASON_TLS]
                # a proxy that trusts only the NameServer's CA: refuses the broker's certificate
                client_tls(tls_ca=ns_ca.file, tls_cert=p_cert, tls_key=p_key)
                assert not await _send_through(ns.address, b"wrong-ca")
                after_wrong_ca = broker.server.refusals.counts[REASON_TLS]
                assert after_wrong_ca > failed_before  # it gave up in the handshake
                # a proxy without a client certificate: the broker refuses it in the handshake
                client_tls(tls_ca=both)
                assert not await _send_through(ns.address, b"no-cert")
                assert broker.server.refusals.counts[REASON_TLS] > after_wrong_ca
                client_tls(tls_ca=both, tls_cert=p_cert, tls_key=p_key)
                offsets = await admin.queues(TOPIC)
                assert len(offsets) == 1
                stored = await admin.max_offset(offsets[0])
                assert stored == 1, "only the mutual-TLS proxy's message is stored"
        finally:
            await broker.stop()
            await ns.stop()
    finally:
        set_default_ssl_context(None)


async def _routed(admin: AsyncAdminClient) -> bool:
    try:
        return bool(await admin.queues(TOPIC))
    except Exception:  # noqa: BLE001 - not registered yet
        return False

"""SASL and ACLs on the Kafka listener, with the real clients and with exact frames.

Users of one auth store (the brokers' kind): ``alice`` may Pub/Sub/Create/Get topics ``ok*``
and Sub group ``ga``; ``bob`` may only Sub/Get topics ``ok*``; ``carol`` is a user without any
ACL. PLAIN and SCRAM work with librdkafka and kafka-python; a wrong password is
SASL_AUTHENTICATION_FAILED then a closed connection; a refused Produce stores nothing; a user
without group rights cannot join; Metadata hides what a user may not see; and no API key from
an unprivileged user reaches a handler that touches data.
"""

from __future__ import annotations

import asyncio
import base64
import struct
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orbitmq.auth.model import PolicyEntry, UserType
from orbitmq.auth.scram import client_proof
from orbitmq.auth.store import AuthStore
from orbitmq.kafka.config import KafkaConfig
from orbitmq.kafka.server import KafkaGateway
from orbitmq.protocol.kafka.records import Record, build_batch
from orbitmq.testing import run_broker, run_namesrv, small_broker_config
from tests.kafka.raw import RawClient

kafka = pytest.importorskip("kafka")
confluent = pytest.importorskip("confluent_kafka")

pytestmark = pytest.mark.timeout(90)

SECRETS = {"alice": "alice-secret-0001", "bob": "bob-secret-00001", "carol": "carol-secret-001"}


@dataclass
class Secure:
    bootstrap: str
    gateway: KafkaGateway
    store: AuthStore
    audit: Path


def make_store(path: Path) -> AuthStore:
    store = AuthStore(path)
    store.create_user("admin", "admin-secret-0001", UserType.SUPER)
    for name, secret in SECRETS.items():
        store.create_user(name, secret)
    store.put_entries("alice", [
        PolicyEntry.make("Topic:ok*", ["Pub", "Sub", "Create", "Get"], "Allow"),
        PolicyEntry.make("Group:ga", ["Sub"], "Allow"),
    ], create=True)  # fmt: skip
    store.put_entries("bob", [PolicyEntry.make("Topic:ok*", ["Sub", "Get"], "Allow")], create=True)
    return store


@pytest.fixture
async def secure(tmp_path: Path) -> AsyncIterator[Secure]:
    async with secure_gateway(tmp_path) as s:
        yield s


@asynccontextmanager
async def secure_gateway(tmp_path: Path, **extra: Any) -> AsyncIterator[Secure]:
    store = make_store(tmp_path / "auth.json")
    async with run_namesrv() as ns:
        addr = f"127.0.0.1:{ns.port}"
        async with run_broker(small_broker_config(tmp_path / "store", namesrv_addrs=(addr,))):
            gw = KafkaGateway(KafkaConfig(
                namesrv_addrs=(addr,), port=0, default_partitions=1, auth_enabled=True,
                auth_file=str(tmp_path / "auth.json"), audit_file=str(tmp_path / "audit.log"),
                **extra,
            ))  # fmt: skip
            await gw.start()
            try:
                for topic in ("ok1", "secret1"):
                    assert await gw.control._create(topic, 1, 10_000) == 0
                yield Secure(f"127.0.0.1:{gw.port}", gw, store, tmp_path / "audit.log")
            finally:
                await gw.stop()


def sasl(user: str, mechanism: str = "PLAIN", secret: str | None = None) -> dict[str, Any]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
            "sasl.username": user, "sasl.password": secret or SECRETS[user]}  # fmt: skip


def login(bootstrap: str, user: str, secret: str | None = None) -> RawClient:
    c = RawClient(bootstrap)
    assert c.call(17, 1, {"mechanism": "PLAIN"})["error_code"] == 0
    token = f"\0{user}\0{secret or SECRETS[user]}".encode()
    assert c.call(36, 2, {"auth_bytes": token})["error_code"] == 0
    return c


def closed(c: RawClient) -> bool:
    try:
        return c.sock.recv(1) == b""
    except ConnectionError:  # reset: closed too
        return True
    except TimeoutError:
        return False


async def stored(gw: KafkaGateway, topic: str) -> int:
    assert gw.admin is not None
    return sum([await gw.admin.max_offset(q) for q in await gw.admin.queues(topic)])


async def test_plain_and_scram_produce_and_consume_with_the_clients(secure: Secure) -> None:
    def run() -> list[bytes]:
        got: list[bytes] = []
        for mech in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
            p = confluent.Producer({"bootstrap.servers": secure.bootstrap, **sasl("alice", mech),
                                    "enable.idempotence": True})  # fmt: skip
            p.produce("ok1", value=f"c-{mech}".encode())
            assert p.flush(20) == 0
        kp = kafka.KafkaProducer(
            bootstrap_servers=secure.bootstrap, security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="alice",
            sasl_plain_password=SECRETS["alice"],
        )  # fmt: skip
        kp.send("ok1", b"k-scram").get(20)
        kp.close()
        consumer = kafka.KafkaConsumer(
            "ok1", bootstrap_servers=secure.bootstrap, group_id="ga",
            auto_offset_reset="earliest", security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="PLAIN", sasl_plain_username="alice",
            sasl_plain_password=SECRETS["alice"],
        )  # fmt: skip
        end = time.monotonic() + 30
        while len(got) < 4 and time.monotonic() < end:
            for records in consumer.poll(timeout_ms=500).values():
                got += [r.value for r in records]
        consumer.commit()
        consumer.close()
        return got

    got = await asyncio.to_thread(run)
    assert sorted(got) == sorted([b"c-PLAIN", b"c-SCRAM-SHA-256", b"c-SCRAM-SHA-512", b"k-scram"])

    # aiokafka too (SCRAM-SHA-512), in this loop
    aiokafka = pytest.importorskip("aiokafka")
    producer = aiokafka.AIOKafkaProducer(
        bootstrap_servers=secure.bootstrap, security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="alice",
        sasl_plain_password=SECRETS["alice"],
    )  # fmt: skip
    await producer.start()
    try:
        await producer.send_and_wait("ok1", b"aio-scram")
    finally:
        await producer.stop()
    assert await stored(secure.gateway, "ok1") == 5


async def test_wrong_password_is_refused_and_closed(secure: Secure) -> None:
    def raw() -> tuple[dict[str, Any], bool]:
        c = RawClient(secure.bootstrap)
        versions = {a["api_key"] for a in c.call(18, 3, {})["api_keys"]}
        assert {17, 36} <= versions
        hs = c.call(17, 1, {"mechanism": "PLAIN"})
        assert hs["error_code"] == 0 and "SCRAM-SHA-256" in hs["mechanisms"]
        answer = c.call(36, 2, {"auth_bytes": b"\0alice\0wrong-password"})
        was_closed = closed(c)
        c.close()
        return answer, was_closed

    answer, was_closed = await asyncio.to_thread(raw)
    assert answer["error_code"] == 58 and was_closed

    def scram_wrong() -> int:
        c = RawClient(secure.bootstrap)
        assert c.call(17, 1, {"mechanism": "SCRAM-SHA-256"})["error_code"] == 0
        first_bare = "n=alice,r=abcdefgh"
        server_first = c.call(36, 2, {"auth_bytes": f"n,,{first_bare}".encode()})["auth_bytes"]
        final, _ = client_proof("alice", "not-the-secret", first_bare, server_first.decode())
        code = int(c.call(36, 2, {"auth_bytes": final.encode()})["error_code"])
        was_closed = closed(c)
        c.close()
        return code if was_closed else -1

    assert await asyncio.to_thread(scram_wrong) == 58

    def real_client() -> list[Any]:
        errors: list[Any] = []
        p = confluent.Producer({"bootstrap.servers": secure.bootstrap,
                                **sasl("alice", "SCRAM-SHA-512", "wrong-password-1"),
                                "error_cb": errors.append})  # fmt: skip
        p.produce("ok1", b"x")
        end = time.monotonic() + 10
        while not errors and time.monotonic() < end:
            p.poll(0.2)
        return errors

    errors = await asyncio.to_thread(real_client)
    assert errors and errors[0].code() == confluent.KafkaError._AUTHENTICATION
    assert await stored(secure.gateway, "ok1") == 0
    assert secure.gateway.auth is not None and secure.gateway.auth.refused >= 3
    assert secure.gateway.refusals.counts["auth_failed"] >= 3  # orbitmq_net_refused_total
    assert '"reason": "SASL' in secure.audit.read_text()


async def test_requests_before_authentication_close_the_connection(secure: Secure) -> None:
    def run() -> bool:
        c = RawClient(secure.bootstrap)
        c.send(3, 9, {"topics": None, "allow_auto_topic_creation": False})
        was_closed = closed(c)
        c.close()
        return was_closed

    assert await asyncio.to_thread(run)
    assert secure.gateway.refusals.counts["auth_failed"] == 1
    assert '"reason": "not authenticated"' in secure.audit.read_text()


async def test_produce_without_pub_is_refused_and_stores_nothing(secure: Secure) -> None:
    def run() -> Any:
        p = kafka.KafkaProducer(
            bootstrap_servers=secure.bootstrap, security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="PLAIN", sasl_plain_username="bob", sasl_plain_password=SECRETS["bob"],
            retries=0, max_block_ms=10_000,
        )  # fmt: skip
        try:
            p.send("ok1", b"denied").get(20)
        except Exception as exc:  # noqa: BLE001  # the error is what is checked
            return exc
        finally:
            p.close()
        return None

    exc = await asyncio.to_thread(run)
    assert isinstance(exc, kafka.errors.TopicAuthorizationFailedError), exc
    assert await stored(secure.gateway, "ok1") == 0

    # one request naming a denied and an allowed topic: only the allowed one is stored
    def mixed() -> dict[str, int]:
        c = login(secure.bootstrap, "alice")
        batch = build_batch([Record(0, 0, None, b"m")], base_timestamp=1_700_000_000_000)
        body = {"acks": -1, "timeout_ms": 5000, "topic_data": [
            {"name": t, "partition_data": [{"index": 0, "records": batch}]}
            for t in ("secret1", "ok1")]}  # fmt: skip
        answer = c.call(0, 8, body)
        c.close()
        return {t["name"]: t["partition_responses"][0]["error_code"] for t in answer["responses"]}

    assert await asyncio.to_thread(mixed) == {"secret1": 29, "ok1": 0}
    assert await stored(secure.gateway, "secret1") == 0
    assert await stored(secure.gateway, "ok1") == 1


async def test_group_without_rights_cannot_join(secure: Secure) -> None:
    def run() -> Any:
        consumer = kafka.KafkaConsumer(
            "ok1", bootstrap_servers=secure.bootstrap, group_id="gz",
            security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
            sasl_plain_username="alice", sasl_plain_password=SECRETS["alice"],
        )  # fmt: skip
        try:
            end = time.monotonic() + 15
            while time.monotonic() < end:
                consumer.poll(timeout_ms=300)
        except Exception as exc:  # noqa: BLE001  # the error is what is checked
            return exc
        finally:
            consumer.close(autocommit=False)
        return None

    exc = await asyncio.to_thread(run)
    assert isinstance(exc, kafka.errors.GroupAuthorizationFailedError), exc
    assert not secure.gateway.coordinator.groups.get("gz")


async def test_metadata_shows_only_what_the_user_may_see(secure: Secure) -> None:
    def run() -> tuple[set[str], dict[str, int], dict[str, int]]:
        c = login(secure.bootstrap, "bob")
        listed = {t["name"] for t in c.call(3, 9, {"topics": None})["topics"]}
        named = c.call(3, 9, {"topics": [{"name": "secret1"}, {"name": "ok1"}, {"name": "ok-new"}],
                              "allow_auto_topic_creation": True})["topics"]  # fmt: skip
        c.close()
        a = login(secure.bootstrap, "alice")
        created = a.call(3, 9, {"topics": [{"name": "ok-auto"}, {"name": "nope"}],
                                "allow_auto_topic_creation": True})["topics"]  # fmt: skip
        a.close()
        return (listed, {t["name"]: t["error_code"] for t in named},
                {t["name"]: t["error_code"] for t in created})  # fmt: skip

    listed, named, created = await asyncio.to_thread(run)
    assert "ok1" in listed and "secret1" not in listed
    # bob may see ok* but not create them (no Create): 29 for the new one, as Kafka answers
    assert named == {"secret1": 29, "ok1": 0, "ok-new": 29}
    assert created == {"ok-auto": 0, "nope": 29}


def request_bodies() -> dict[int, dict[str, Any]]:
    """One request per served API naming the topic secret1 and the group gs."""
    batch = build_batch([Record(0, 0, None, b"x")], base_timestamp=1_700_000_000_000)
    topic = [{"name": "secret1", "partitions": [{"partition_index": 0, "timestamp": -1,
                                                 "committed_offset": 1}],
              "partition_indexes": [0]}]  # fmt: skip
    return {
        0: {"acks": -1, "timeout_ms": 1000, "topic_data": [
            {"name": "secret1", "partition_data": [{"index": 0, "records": batch}]}]},
        1: {"max_wait_ms": 10, "topics": [{"topic": "secret1", "partitions": [
            {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1024}]}]},
        2: {"topics": topic}, 3: {"topics": [{"name": "secret1"}], "allow_auto_topic_creation": True},
        8: {"group_id": "gs", "generation_id_or_member_epoch": -1, "topics": topic},
        9: {"group_id": "gs", "topics": topic,
            "groups": [{"group_id": "gs", "topics": topic}]},
        10: {"key": "gs", "key_type": 0, "coordinator_keys": ["gs"]},
        11: {"group_id": "gs", "session_timeout_ms": 10_000, "rebalance_timeout_ms": 10_000,
             "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": b""}]},
        12: {"group_id": "gs", "generation_id": 1, "member_id": "m"},
        13: {"group_id": "gs", "member_id": "m", "members": [{"member_id": "m"}]},
        14: {"group_id": "gs", "generation_id": 1, "member_id": "m", "assignments": []},
        15: {"groups": ["gs"]}, 16: {}, 18: {},
        19: {"topics": [{"name": "secret2", "num_partitions": 1, "replication_factor": 1}],
             "timeout_ms": 1000},
        20: {"topic_names": ["secret1"], "timeout_ms": 1000},
        22: {"transactional_id": None, "transaction_timeout_ms": 1000},
        17: {"mechanism": "PLAIN"}, 36: {"auth_bytes": b""},
    }  # fmt: skip


def error_codes(answer: Any) -> list[int]:
    """Every error_code anywhere in an answer."""
    if isinstance(answer, dict):
        own = [answer["error_code"]] if "error_code" in answer else []
        return own + [c for v in answer.values() for c in error_codes(v)]
    if isinstance(answer, list):
        return [c for v in answer for c in error_codes(v)]
    return []


async def test_no_api_key_reaches_a_data_handler_unauthorized(
    secure: Secure, monkeypatch: pytest.MonkeyPatch
) -> None:
    gw = secure.gateway
    reached: list[str] = []

    def spy(obj: Any, name: str) -> None:
        real = getattr(obj, name)
        if asyncio.iscoroutinefunction(real):

            async def wrapped_async(*a: Any, **k: Any) -> Any:
                reached.append(f"{name}{a!r}{k!r}")
                return await real(*a, **k)

            monkeypatch.setattr(obj, name, wrapped_async)
        else:

            def wrapped(*a: Any, **k: Any) -> Any:
                reached.append(f"{name}{a!r}{k!r}")
                return real(*a, **k)

            monkeypatch.setattr(obj, name, wrapped)

    for name in ("produce", "fetch", "list_offsets"):
        spy(gw.data, name)
    for name in (
        "_topic_metadata",
        "create_topics",
        "delete_topics",
        "find_coordinator",
        "init_producer_id",
        "offset_commit",
        "offset_fetch",
        "describe_groups",
    ):
        spy(gw.control, name)  # fmt: skip
    for name in ("join", "sync", "heartbeat", "leave"):
        spy(gw.coordinator, name)
    assert gw.admin is not None
    for name in (
        "create_topic",
        "delete_topic",
        "commit_offsets",
        "committed_offset",
        "pull_raw",
        "pull",
        "max_offset",
        "min_offset",
        "search_offset",
    ):
        spy(gw.admin, name)  # fmt: skip
    spy(gw.producer, "send_packed")
    bodies = request_bodies()

    def run() -> dict[int, str]:
        outcome: dict[int, str] = {}
        for key in range(81):
            for user in ("carol", "bob"):
                c = login(secure.bootstrap, user)
                try:
                    if key not in served:  # a header and a few body bytes: refused, closed
                        frame = struct.pack(">hhih", key, 0, 99, -1) + bytes(8)
                        c.sock.sendall(struct.pack(">i", len(frame)) + frame)
                        outcome[key] = "closed" if closed(c) else "answered"
                        continue
                    lo, hi = served[key]
                    # a SASL request after authentication is answered, then the end
                    for v in sorted({hi} if key in (17, 36) else {lo, hi}):
                        codes = set(error_codes(c.call(key, v, bodies[key])))
                        if key not in (16, 17, 18, 36):  # the rest name secret1 or gs
                            assert codes & {29, 30, 31, 53}, (key, v, codes)
                    outcome[key] = "answered"
                finally:
                    c.close()
        return outcome

    served = gw.supported
    outcome = await asyncio.to_thread(run)
    # nothing of secret1, secret2 or gs touched for carol or bob (bob may look at ok1)
    touched = [r for r in reached if "secret" in r or "'gs'" in r]
    assert touched == [], touched
    assert all("ok1" in r for r in reached), reached
    assert {k for k, v in outcome.items() if v == "answered"} == set(served)
    assert await stored(gw, "secret1") == 0
    assert "secret2" not in await gw.admin.list_topics()
    assert gw.refusals.counts["acl_denied"] >= 20  # every refused API counted
    assert '"code": 19' in secure.audit.read_text()  # and audited (CreateTopics here)


async def test_byte_quotas_throttle_one_user_not_another(tmp_path: Path) -> None:
    """100 KB/s for each user: alice's 300 KB take about 2 s beyond the 1 s burst, each answer
    over the quota saying throttle_time_ms; the admin's first request right after is not
    throttled (quotas are per user, not per gateway). Fetching the 350 KB back at once is
    answered with its throttle time, and the connection is not read meanwhile."""
    async with secure_gateway(
        tmp_path, produce_quota_bytes_per_s=100_000, fetch_quota_bytes_per_s=100_000
    ) as s:

        def run() -> tuple[float, list[int], int]:
            value = bytes(range(256)) * 200  # ~50 KB, incompressible enough: sent as is
            batch = build_batch([Record(0, 0, None, value)], base_timestamp=1_700_000_000_000)
            body = {"acks": -1, "timeout_ms": 5000, "topic_data": [
                {"name": "ok1", "partition_data": [{"index": 0, "records": batch}]}]}  # fmt: skip
            c = login(s.bootstrap, "alice")
            started = time.monotonic()
            throttles = [c.call(0, 8, body)["throttle_time_ms"] for _ in range(6)]
            elapsed = time.monotonic() - started
            c.close()
            admin = login(s.bootstrap, "admin", "admin-secret-0001")
            other = admin.call(0, 8, body)["throttle_time_ms"]
            admin.close()
            return elapsed, throttles, other

        elapsed, throttles, other = await asyncio.to_thread(run)
        assert throttles[0] == 0 and all(t > 0 for t in throttles[3:]), throttles
        assert elapsed >= 1.0, elapsed  # held: 300 KB at 100 KB/s after a 100 KB burst
        assert other == 0
        assert s.gateway.quotas is not None and s.gateway.quotas.throttled >= 3
        assert s.gateway.refusals.counts["quota_throttled"] >= 3

        def fetch() -> tuple[int, int, float]:
            c = login(s.bootstrap, "alice")
            body = {"max_wait_ms": 0, "max_bytes": 4 << 20, "topics": [{"topic": "ok1", "partitions": [
                {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 4 << 20}]}]}  # fmt: skip
            first = c.call(1, 12, body)
            got = len(first["responses"][0]["partitions"][0]["records"] or b"")
            started = time.monotonic()
            c.call(18, 3, {})  # the connection is not read until the throttle is over
            held = time.monotonic() - started
            c.close()
            return got, first["throttle_time_ms"], held

        got, throttle_ms, held = await asyncio.to_thread(fetch)
        assert got > 300_000 and throttle_ms > 1000, (got, throttle_ms)
        assert held >= throttle_ms / 1000 - 0.2, (held, throttle_ms)
        assert await stored(s.gateway, "ok1") == 7


async def test_refusals_are_exported_with_the_broker_metrics() -> None:
    """Beside a broker (`orbitmq up`, `orbitmq broker --kafka-port`) the gateway's refusals are
    series of the broker's orbitmq_net_refused_total, listener="kafka"."""
    from prometheus_client import CollectorRegistry, generate_latest

    from orbitmq.cli.server import local_kafka

    registry = CollectorRegistry()
    async with run_namesrv() as ns:
        config = KafkaConfig(namesrv_addrs=(f"127.0.0.1:{ns.port}",), port=0)
        async with local_kafka(config, {}, required=True, registry=registry):
            page = generate_latest(registry).decode()
        assert 'orbitmq_net_refused_total{listener="kafka",reason="acl_denied"} 0.0' in page
        assert "kafka" not in generate_latest(registry).decode()  # removed with the gateway


def test_beside_an_authenticating_broker_the_kafka_port_authenticates(tmp_path: Path) -> None:
    """`orbitmq up` / `orbitmq broker` with the broker's auth on: the gateway takes its users
    (no open Kafka port beside it) and its credentials; an explicit [kafka] choice stands."""
    import dataclasses

    from orbitmq.broker.config import BrokerConfig
    from orbitmq.cli.server import local_kafka_config
    from orbitmq.cli.settings import Settings

    broker = BrokerConfig(auth_enabled=True, auth_file=str(tmp_path / "a.json"),
                          access_key="inner", secret_key="s" * 12)  # fmt: skip
    on = local_kafka_config(dataclasses.replace(Settings(), broker=broker), ("n:1",), 0)
    assert on.auth_enabled and on.auth_file == str(tmp_path / "a.json")
    assert (on.access_key, on.secret_key) == ("inner", "s" * 12)
    off = local_kafka_config(Settings(), ("n:1",), 0)
    assert not off.auth_enabled and off.access_key is None
    chosen = dataclasses.replace(Settings(), broker=broker, sources={"kafka.auth_enabled": "toml"})
    assert not local_kafka_config(chosen, ("n:1",), 0).auth_enabled


async def test_a_disabled_user_is_refused_on_its_open_connection(secure: Secure) -> None:
    def run() -> tuple[int, int]:
        c = login(secure.bootstrap, "alice")
        batch = build_batch([Record(0, 0, None, b"r")], base_timestamp=1_700_000_000_000)
        body = {"acks": -1, "timeout_ms": 5000, "topic_data": [
            {"name": "ok1", "partition_data": [{"index": 0, "records": batch}]}]}  # fmt: skip

        def code() -> int:
            return int(c.call(0, 8, body)["responses"][0]["partition_responses"][0]["error_code"])

        before = code()
        secure.store.update_user("alice", enabled=False)
        end = time.monotonic() + 3
        after = code()
        while after == 0 and time.monotonic() < end:  # the store is re-read within a second
            time.sleep(0.1)
            after = code()
        c.close()
        return before, after

    assert await asyncio.to_thread(run) == (0, 29)


async def test_sasl_handshake_v0_with_bare_tokens(secure: Secure) -> None:
    """Clients before KIP-152 (kafka-python 2.0.2, Sarama <= 1.40.1): SaslHandshake v0, then
    the SASL tokens in bare frames; PLAIN and SCRAM work, a wrong password closes."""

    def bare(c: RawClient, token: bytes) -> bytes | None:
        c.sock.sendall(struct.pack(">i", len(token)) + token)
        try:
            (size,) = struct.unpack(">i", c._read(4))
            return c._read(size)
        except ConnectionError:
            return None

    def run() -> tuple[bytes | None, int, bytes | None, bytes | None]:
        c = RawClient(secure.bootstrap)
        assert c.call(17, 0, {"mechanism": "PLAIN"})["error_code"] == 0
        plain = bare(c, f"\0alice\0{SECRETS['alice']}".encode())
        topics = c.call(3, 1, {"topics": [{"name": "ok1"}]})["topics"]
        c.close()
        s = RawClient(secure.bootstrap)
        assert s.call(17, 0, {"mechanism": "SCRAM-SHA-512"})["error_code"] == 0
        first_bare = "n=bob,r=v0nonce"
        server_first = bare(s, f"n,,{first_bare}".encode())
        assert server_first is not None
        final, signature = client_proof(
            "bob", SECRETS["bob"], first_bare, server_first.decode(), hash_name="sha512"
        )
        server_final = bare(s, final.encode())
        s.close()
        w = RawClient(secure.bootstrap)
        assert w.call(17, 0, {"mechanism": "PLAIN"})["error_code"] == 0
        wrong = bare(w, b"\0alice\0not-it")
        w.close()
        ok = server_final == b"v=" + base64.b64encode(signature)
        return plain, topics[0]["error_code"], b"ok" if ok else server_final, wrong

    plain, code, scram, wrong = await asyncio.to_thread(run)
    assert plain == b"" and code == 0  # PLAIN's empty answer, then an ordinary request
    assert scram == b"ok"
    assert wrong is None  # closed without an answer, as Kafka does with bare tokens


async def test_an_authenticating_broker_behind_the_gateway(tmp_path: Path) -> None:
    """The broker checks signatures too: the gateway signs its own requests as its user
    (``access_key``), a Kafka user's record is stored and read back through it."""
    make_store(tmp_path / "auth.json")
    auth = {"auth_enabled": True, "auth_file": str(tmp_path / "auth.json"),
            "access_key": "admin", "secret_key": "admin-secret-0001"}  # fmt: skip
    async with run_namesrv() as ns:
        addr = f"127.0.0.1:{ns.port}"
        broker = small_broker_config(tmp_path / "store", namesrv_addrs=(addr,), **auth)
        async with run_broker(broker):
            gw = KafkaGateway(KafkaConfig(namesrv_addrs=(addr,), port=0, default_partitions=1,
                                          **auth))  # fmt: skip
            await gw.start()
            try:

                def run() -> list[bytes]:
                    conf = {"bootstrap.servers": f"127.0.0.1:{gw.port}", **sasl("alice")}
                    p = confluent.Producer(conf)
                    p.produce("ok-signed", b"through a signing gateway")
                    assert p.flush(20) == 0
                    c = confluent.Consumer({**conf, "group.id": "ga",
                                            "auto.offset.reset": "earliest"})  # fmt: skip
                    c.assign([confluent.TopicPartition("ok-signed", 0, 0)])
                    got: list[bytes] = []
                    end = time.monotonic() + 15
                    while not got and time.monotonic() < end:
                        m = c.poll(0.5)
                        if m is not None and not m.error():
                            got.append(m.value())
                    c.close()
                    return got

                assert await asyncio.to_thread(run) == [b"through a signing gateway"]
            finally:
                await gw.stop()


async def test_an_api_without_a_rule_is_refused_even_to_a_super_user(secure: Secure) -> None:
    """Every served API has a rule; one served without a rule (here CreatePartitions, 37, and
    DescribeConfigs, 32, and DescribeCluster, 60, whose codecs exist) is refused, never passed through: with
    CLUSTER_AUTHORIZATION_FAILED where the answer has a top-level error code, else by closing
    the connection (the first two have none)."""
    from orbitmq.kafka.authz import RULES

    gw = secure.gateway
    assert set(gw.supported) <= set(RULES)
    gw.supported = {**gw.supported, 37: (0, 3), 32: (0, 4), 60: (0, 0)}

    def run() -> tuple[bool, bool, int]:
        c = login(secure.bootstrap, "admin", "admin-secret-0001")
        body = {"topics": [{"name": "ok1", "count": 2, "assignments": None}], "timeout_ms": 1000}
        c.send(37, 3, body)
        refused_37 = closed(c)
        c.close()
        c = login(secure.bootstrap, "admin", "admin-secret-0001")
        c.send(32, 4, {"resources": [{"resource_type": 2, "resource_name": "ok1"}]})
        refused_32 = closed(c)
        c.close()
        c = login(secure.bootstrap, "admin", "admin-secret-0001")
        code = int(c.call(60, 0, {})["error_code"])  # DescribeCluster: a top-level code
        c.close()
        return refused_37, refused_32, code

    assert await asyncio.to_thread(run) == (True, True, 31)
    assert '"reason": "API 37 has no ACL rule"' in secure.audit.read_text()


async def test_an_inner_user_needs_its_certificate_not_only_its_secret(secure: Secure) -> None:
    """An inner (Super) principal's secret alone is refused over SASL; loopback-marked ones are
    admitted from loopback, as on Remoting, gRPC and MQTT (auth.model.inner_refusal)."""
    secure.store.create_user("inner-gw", "inner-secret-0001", UserType.SUPER, inner="mtls")
    secure.store.create_user("inner-lo", "inner-secret-0002", UserType.SUPER, inner="loopback")
    auth = secure.gateway.auth
    assert auth is not None
    for _ in range(50):  # the gateway re-reads the store at most every 0.25 s
        if auth.user("inner-gw") is not None and auth.user("inner-lo") is not None:
            break
        await asyncio.sleep(0.05)

    def plain(user: str, secret: str) -> tuple[int, bool]:
        c = RawClient(secure.bootstrap)
        assert c.call(17, 1, {"mechanism": "PLAIN"})["error_code"] == 0
        code = int(c.call(36, 2, {"auth_bytes": f"\0{user}\0{secret}".encode()})["error_code"])
        was_closed = closed(c)
        c.close()
        return code, was_closed

    assert await asyncio.to_thread(plain, "inner-gw", "inner-secret-0001") == (58, True)
    code, _ = await asyncio.to_thread(plain, "inner-lo", "inner-secret-0002")
    assert code == 0
    assert "inner user inner-gw authenticates only over mutual TLS" in secure.audit.read_text()

"""ACL: a proxy with access keys accepts the official client signing with the right secret and
refuses one signing with a wrong secret or an unknown key (UNAUTHORIZED in the response body;
the client reports the failure)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.compat.conftest import Orbit, unique
from tests.harness import ServerProcess

pytestmark = [pytest.mark.compat, pytest.mark.integration]

AK, SK = "CompatAccessKey", "compat-secret-key"
ACL_ARGS = ["--acl", "--access-key", f"{AK}:{SK}"]


@pytest.fixture(scope="module")
def acl_proxy(orbit: Orbit) -> Iterator[ServerProcess]:
    proxy = orbit.start_proxy(*ACL_ARGS)
    try:
        yield proxy
    finally:
        proxy.stop()


def _send_and_receive(orbit: Orbit, topic: str) -> list[dict[str, object]]:
    return [
        {"op": "producer", "name": "p", "topics": [topic]},
        {
            "op": "send",
            "producer": "p",
            "messages": [{"topic": topic, "body": "signed"}],
            "expect_error": True,
        },
        {"op": "simple_consumer", "name": "c", "group": unique("CompatAG"), "topics": {topic: "*"}},
        {"op": "receive", "consumer": "c", "expect": 0, "expect_error": True},
    ]


def test_right_secret_is_accepted(orbit: Orbit, acl_proxy: ServerProcess) -> None:
    topic = orbit.topic(unique("CompatAcl"))
    out = orbit.run(_send_and_receive(orbit, topic), endpoint=acl_proxy.address, ak=AK, sk=SK)
    send, receive = out["results"][1], out["results"][3]
    assert send["error"] is None and send["receipts"][0]["message_id"]
    assert receive["error"] is None


@pytest.mark.parametrize(("ak", "sk"), [(AK, "wrong-secret"), ("UnknownKey", SK), ("", "")])
def test_wrong_credentials_are_refused(
    orbit: Orbit, acl_proxy: ServerProcess, ak: str, sk: str
) -> None:
    topic = orbit.topic(unique("CompatAcl"))
    out = orbit.run(_send_and_receive(orbit, topic), endpoint=acl_proxy.address, ak=ak, sk=sk)
    send, receive = out["results"][1], out["results"][3]
    assert send["error"], "an unauthorized client must not send"
    assert receive["error"], "an unauthorized client must not receive"
    log = out["client_log"].read_text(errors="replace")
    assert "UNAUTHORIZED" in log.upper() or "40100" in log, log[-3000:]


# ---------------------------------------------------------------------------- ACL 2.0 users


@pytest.fixture(scope="module")
def store_proxy(orbit: Orbit, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A proxy whose users and ACLs come from an auth store (docs/security.md)."""
    from orbitmq.auth.model import PolicyEntry
    from orbitmq.auth.store import AuthStore
    from orbitmq.testing import settings_toml

    base = tmp_path_factory.mktemp("acl2")
    store = AuthStore(base / "auth.json")
    store.create_user("compat-alice", "compat-alice-secret")
    store.put_entries(
        "compat-alice",
        [
            PolicyEntry.make("Topic:CompatAllowed*", ["Pub", "Sub"], "Allow"),
            PolicyEntry.make("Group:CompatAG*", ["Sub"], "Allow"),
        ],
        create=True,
    )
    config = base / "proxy.toml"
    config.write_text(
        settings_toml({"proxy": {"acl_enabled": True, "auth_file": str(base / "auth.json")}})
    )
    proxy = orbit.start_proxy("--config", str(config))
    try:
        yield proxy
    finally:
        proxy.stop()


def test_acl2_user_is_authorized_per_topic(orbit: Orbit, store_proxy: ServerProcess) -> None:
    allowed = orbit.topic(unique("CompatAllowed"))
    out = orbit.run(
        _send_and_receive(orbit, allowed),
        endpoint=store_proxy.address,
        ak="compat-alice",
        sk="compat-alice-secret",
    )
    send, receive = out["results"][1], out["results"][3]
    assert send["error"] is None and send["receipts"][0]["message_id"]
    assert receive["error"] is None
    denied = orbit.topic(unique("CompatDenied"))
    out = orbit.run(
        _send_and_receive(orbit, denied),
        endpoint=store_proxy.address,
        ak="compat-alice",
        sk="compat-alice-secret",
    )
    assert out["results"][1]["error"], "a topic outside the ACL must be refused"
    log = out["client_log"].read_text(errors="replace")
    assert "FORBIDDEN" in log.upper() or "40300" in log, log[-3000:]
    wrong = orbit.run(
        _send_and_receive(orbit, allowed),
        endpoint=store_proxy.address,
        ak="compat-alice",
        sk="not-her-secret",
    )
    assert wrong["results"][1]["error"]

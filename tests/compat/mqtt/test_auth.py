"""MQTT username/password against the password file (``[mqtt] auth_enabled``)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from orbitmq.common.errors import ConfigError
from orbitmq.mqtt.auth import Authenticator, load_password_file
from tests.compat.mqtt.conftest import MqttServer, mqtt

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[MqttServer]:
    users = tmp_path / "users.txt"
    users.write_text(f"# devices\nsensor1:{hashlib.sha256(b's3cret').hexdigest()}\n")
    s = MqttServer(tmp_path, auth_enabled=True, password_file=str(users))
    try:
        yield s
    finally:
        s.close()


@pytest.mark.parametrize("version", [mqtt.MQTTv311, mqtt.MQTTv5])
def test_password_checked(secured: MqttServer, version: int) -> None:
    results = []
    for user, password in (
        ("sensor1", "s3cret"),
        ("sensor1", "wrong"),
        ("nobody", "s3cret"),
        (None, None),
    ):
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=version)
        if user is not None:
            c.username_pw_set(user, password)
        try:
            c.connect("127.0.0.1", secured.port)
            for _ in range(100):  # until the CONNACK (or the refusal's close) is read
                if c.loop(0.05) != mqtt.MQTT_ERR_SUCCESS or c.is_connected():
                    break
            results.append(c.is_connected())
        finally:
            c.disconnect()
    assert results == [True, False, False, False]


def test_password_file_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("user-without-hash\n")
    with pytest.raises(ConfigError):
        load_password_file(str(bad))
    with pytest.raises(ConfigError):
        load_password_file(str(tmp_path / "missing.txt"))
    assert Authenticator(False, None).check(None, None)

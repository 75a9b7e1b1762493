"""``orbitmq.client`` imports its names on first use: every public name must resolve."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

import orbitmq.client as client
from orbitmq.common.config import documented
from orbitmq.common.errors import ClientError


def test_every_public_name_resolves_to_its_module() -> None:
    for name in client.__all__:
        value = getattr(client, name)
        home = importlib.import_module(client._WHERE[name])
        assert value is getattr(home, name), name
    assert set(client.__all__) == set(client._WHERE)


def test_client_configs_document_every_setting_and_refuse_bad_values() -> None:
    """Each client config declares its fields with orbitmq.common.config (a doc per field); a
    bad value is a ClientError naming the field, whichever config it is."""
    bad = {
        client.ProducerConfig: {"linger_ms": -1},
        client.PushConfig: {"consume_threads": 0},
        client.LitePullConfig: {"poll_max": 0},
        client.SimpleConfig: {"await_duration_s": -1},
        client.TransactionConfig: {"check_concurrency": 0},
        client.AdminConfig: {"timeout_s": 0},
    }
    for cls, values in bad.items():
        names = {f.name for f in dataclasses.fields(cls)}
        assert {d.name for d in documented(cls)} == names, cls
        cls()  # the defaults are valid
        with pytest.raises(ClientError, match=next(iter(values))):
            cls(**values)

"""``orbitmq.client`` imports its names on first use: every public name must resolve."""

from __future__ import annotations

import importlib

import orbitmq.client as client


def test_every_public_name_resolves_to_its_module() -> None:
    for name in client.__all__:
        value = getattr(client, name)
        home = importlib.import_module(client._WHERE[name])
        assert value is getattr(home, name), name
    assert set(client.__all__) == set(client._WHERE)

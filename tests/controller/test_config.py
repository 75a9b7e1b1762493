"""ControllerConfig's field checks (on construction, naming the setting) and its generated doc."""

from __future__ import annotations

import dataclasses
import json

import pytest

from orbitmq.common.config import documented
from orbitmq.common.errors import ConfigError
from orbitmq.controller.config import ControllerConfig


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"port": 0}, r"controller\.port = 0: must be 1\.\.65535"),
        ({"raft_port": 65536}, r"controller\.raft_port"),
        ({"master_lease_ms": 0}, r"controller\.master_lease_ms"),
        ({"leader_fallback_ms": 100}, r"controller\.leader_fallback_ms = 100: must be > 100"),
        ({"election_margin_ms": -1}, r"controller\.election_margin_ms"),
        ({"broker_heartbeat_timeout_ms": 0}, r"controller\.broker_heartbeat_timeout_ms"),
        ({"scan_interval_ms": -5}, r"controller\.scan_interval_ms"),
        ({"commit_timeout_ms": 0}, r"controller\.commit_timeout_ms"),
        ({"metrics_port": 70000}, r"controller\.metrics_port"),
        ({"raft_secret": ""}, r"controller\.raft_secret"),
        ({"data_dir": ""}, r"controller\.data_dir"),
        ({"peers": ("127.0.0.1:9878/0",)}, "ports must be in"),
        ({"peers": ("9878/9880",)}, "not host:port/raft_port"),
    ],
)
def test_a_bad_field_is_refused_on_construction(change: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ControllerConfig(**change)  # type: ignore[arg-type]  # values of every field's type


def test_defaults_pass_and_json_round_trips() -> None:
    config = ControllerConfig(peers=("127.0.0.1:9878/9880", "127.0.0.2:9878/9880"))
    config.check()
    again = ControllerConfig(**json.loads(json.dumps(dataclasses.asdict(config))))
    assert again == config and isinstance(again.peers, tuple)
    assert ControllerConfig(metrics_port=0).metrics_port == 0


def test_every_field_is_documented() -> None:
    docs = {d.name: d for d in documented(ControllerConfig)}
    assert set(docs) == {f.name for f in dataclasses.fields(ControllerConfig)}
    assert all(d.doc for d in docs.values())
    assert docs["port"].default == 9878 and docs["raft_port"].default == 9880
    assert (docs["master_lease_ms"].default, docs["leader_fallback_ms"].default) == (2000, 1500)

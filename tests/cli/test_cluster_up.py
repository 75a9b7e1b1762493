"""``orbitmq cluster up``'s pieces without starting it (tests/chaos/test_cluster_up.py starts
it for real): ports, the plan of processes and their config files, and bad arguments."""

from __future__ import annotations

import socket
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orbitmq.cli.cluster_up import DEFAULT_PORTS, _ephemeral_low, free_port, parse_sets, plan
from orbitmq.cli.main import app


def test_free_ports_are_below_the_ephemeral_range_and_not_reused() -> None:
    taken: set[int] = set()
    ports = [free_port("127.0.0.1", pair=True, taken=taken) for _ in range(20)]
    assert all(20_000 <= p < _ephemeral_low() for p in ports)
    assert len(taken) == 40  # each port and its HA port, all different
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[0] + 1))  # the pair's second port was free too


def test_the_plan_of_a_three_replica_cluster(tmp_path: Path) -> None:
    hosts = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    p = plan(hosts, tmp_path, "broker-a", "sync", 2, "ASYNC_FLUSH")
    assert [c.name for c in p.children] == [
        "namesrv-1", "namesrv-2", "namesrv-3", "broker-a-1", "broker-a-2", "broker-a-3",
    ]  # fmt: skip
    peers = {c.args[c.args.index("--controller-peers") + 1] for c in p.namesrvs}
    assert len(peers) == 1  # every node the same peer list, naming all three
    assert [h in next(iter(peers)) for h in hosts] == [True] * 3
    configs = [tomllib.loads((tmp_path / f"broker-a-{i}.toml").read_text()) for i in (1, 2, 3)]
    for host, config in zip(hosts, configs, strict=True):
        broker = config["broker"]
        assert broker["host"] == host and broker["broker_name"] == "broker-a"
        assert len(broker["namesrv_addrs"]) == 3 and len(broker["controller_addrs"]) == 3
        assert (broker["replication_mode"], broker["min_in_sync_replicas"]) == ("sync", 2)
        assert config["store"]["store_path"].endswith(f"broker-a-{hosts.index(host) + 1}")


def test_in_namespaces_replicas_use_the_default_ports(tmp_path: Path) -> None:
    hosts = ["10.1.2.1", "10.1.2.2", "10.1.2.3"]
    p = plan(hosts, tmp_path, "g", "async", 1, "SYNC_FLUSH", ["n1", "n2", "n3"])
    assert [c.netns for c in p.children] == ["n1", "n2", "n3"] * 2
    broker = tomllib.loads((tmp_path / "g-2.toml").read_text())["broker"]
    assert (broker["host"], broker["port"]) == ("10.1.2.2", DEFAULT_PORTS[3])
    assert broker["controller_addrs"][0] == f"10.1.2.1:{DEFAULT_PORTS[1]}"


def test_bad_arguments_are_refused_before_anything_starts(tmp_path: Path) -> None:
    runner = CliRunner()
    for args, says in [
        (["--replicas", "3", "--hosts", "127.0.0.1,127.0.0.2"], "2 hosts for 3 replicas"),
        (["--replication-mode", "fast"], "sync or async"),
        (["--netns", "a,b,c"], "--netns"),
        (["--replicas", "0"], "replicas"),
    ]:
        result = runner.invoke(app, ["cluster", "up", "--data-dir", str(tmp_path), *args])
        assert result.exit_code != 0, args
        assert says in result.output, (args, result.output)
    assert not (tmp_path / "logs").exists()  # nothing planned, nothing started


def test_set_reaches_every_process_and_the_cluster_keeps_its_own_choices(tmp_path: Path) -> None:
    sets = parse_sets(
        ["controller.master_lease_ms=600", "broker.master_lease_ms=600", "broker.port=1",
         "store.max_index_num=100", 'namesrv.metrics_port=0']
    )  # fmt: skip
    p = plan(["127.0.0.1", "127.0.0.2"], tmp_path, "g", "sync", 1, "ASYNC_FLUSH", None, sets)
    for i, ns in enumerate(p.namesrvs, 1):
        config = tomllib.loads((tmp_path / f"namesrv-{i}.toml").read_text())
        assert config["controller"] == {"master_lease_ms": 600}
        assert config["namesrv"] == {"metrics_port": 0}
        assert ns.args[ns.args.index("--config") + 1] == str(tmp_path / f"namesrv-{i}.toml")
    broker = tomllib.loads((tmp_path / "g-1.toml").read_text())
    assert broker["broker"]["master_lease_ms"] == 600
    assert broker["broker"]["port"] != 1  # the cluster picks ports
    assert broker["store"]["max_index_num"] == 100
    for bad in ["master_lease_ms=1", "kafka.port=1", "controller.x"]:
        with pytest.raises(ValueError, match=r"TABLE\.FIELD=VALUE"):
            parse_sets([bad])
    assert parse_sets(["broker.broker_name=abc"]) == {"broker": {"broker_name": "abc"}}

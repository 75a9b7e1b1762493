"""``orbitmq cluster up --replicas 3``: a local replicated cluster, to try failover on one
machine (docs/ha.md, "Trying it on one machine").

It starts, as separate processes of this Python (``python -m orbitmq ...``), N NameServers each
with an embedded controller node (one Raft group of N) and one broker group of N replicas in
controller mode, replica i on 127.0.0.i (on Linux every 127.x address is loopback, no setup;
``--hosts`` names others), on ports chosen free there (a broker's port + 1, its HA port, free
too). It waits for every ready line, prints the addresses and PIDs (and writes them to
``<data-dir>/cluster.json`` for scripts), then prints its own ready line::

    orbitmq cluster ready namesrv=127.0.0.1:P;127.0.0.2:P;... controller=...;... brokers=...

and supervises: a process that exits (kill the master with ``kill -9 PID`` to watch a
failover) is reported, not restarted (``--restart-after S`` restarts it after S seconds). Ctrl-C
or SIGTERM stops every process it started, by PID: SIGTERM, then SIGKILL after 15 s. Each
process logs to ``<data-dir>/logs/<name>.log``. Stores are small (64 MiB CommitLog files): this
is for trying things, not for load. ``--netns`` (root) runs replica i inside network namespace
i, made beforehand, on the default ports: partition tests cut a namespace off.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Annotated, Any

import typer

from orbitmq.cli.cluster_auth import ADMIN_USER, ClusterAuth, prepare_auth
from orbitmq.cli.common import fail
from orbitmq.cli.runner import parse_ready_line, ready_line
from orbitmq.testing.config import settings_toml

CLUSTER_STORE: dict[str, Any] = {
    "mapped_file_size_commit_log": 64 * 1024 * 1024,
    "max_hash_slot_num": 16384,
    "max_index_num": 65536,
    "consume_queue_entries_per_file": 16384,
}
"""Small store files (RocketMQ's sizes preallocate 1.4 GiB per replica before one message)."""

STOP_TIMEOUT_S = 15.0
START_TIMEOUT_S = 60.0


def _ephemeral_low() -> int:
    """The first port the kernel hands out to outgoing connections (Linux; else 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str, *, pair: bool = False, taken: set[int] | None = None) -> int:
    """A port free on ``host`` (``pair``: and the next one, a broker's HA port), below the
    ephemeral range: a process restarted on its port must not find it taken by some client's
    outgoing connection meanwhile. Ports in ``taken`` are skipped; the one chosen is added."""
    rng = random.Random()
    taken = set() if taken is None else taken
    high = max(_ephemeral_low() - 2, 20_002)
    for _ in range(500):
        port = rng.randrange(20_000, high)
        if port in taken or (pair and port + 1 in taken):
            continue
        with contextlib.ExitStack() as stack:
            try:
                for p in (port, port + 1) if pair else (port,):
                    s = stack.enter_context(socket.socket())
                    s.bind((host, p))
            except OSError:
                continue
            taken.update((port, port + 1) if pair else (port,))
            return port
    raise OSError(f"no free port{' pair' if pair else ''} on {host}")


@dataclass
class Child:
    """One process of the cluster."""

    name: str
    role: str
    args: list[str]
    log_path: Path
    netns: str | None = None
    """A network namespace to run in (``ip netns exec``), or None."""
    env: dict[str, str] = field(default_factory=dict)
    """Variables for this process only (the brokers' inner secret with ``--auth``)."""
    proc: subprocess.Popen[bytes] | None = None
    endpoints: dict[str, str] = field(default_factory=dict)
    reported: bool = False
    exited_at: float = 0.0
    ready: threading.Event = field(default_factory=threading.Event)

    def launch(self) -> None:
        self.ready.clear()
        self.reported = False
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        # ORBITMQ_<TABLE>_<FIELD> settings apply to every process; a --config file would not
        # (each process has its own, written here).
        env = {k: v for k, v in os.environ.items() if k != "ORBITMQ_CONFIG"}
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.env)
        where = ["ip", "netns", "exec", self.netns] if self.netns else []
        self.proc = subprocess.Popen(  # ip netns exec execs the command: the PID is Python's
            [*where, sys.executable, "-m", "orbitmq", *self.args],
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # Ctrl-C reaches the supervisor, which stops them in order
        )
        log.close()
        assert self.proc.stdout is not None
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, out: IO[bytes]) -> None:
        """Find the ready line, then keep draining stdout (a full pipe would block the child)."""
        for raw in out:
            found = parse_ready_line(raw.decode(errors="replace").rstrip("\n"), self.role)
            if found is not None and not self.ready.is_set():
                self.endpoints = found
                self.ready.set()
        out.close()

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else -1

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def address(self) -> str:
        return self.endpoints.get(self.role, "")

    def terminate(self) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)

    def wait_or_kill(self, deadline: float) -> None:
        if self.proc is None:
            return
        try:
            self.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()  # SIGKILL to this child's PID only
            self.proc.wait(10)


@dataclass
class Plan:
    namesrvs: list[Child]
    brokers: list[Child]

    @property
    def children(self) -> list[Child]:
        return [*self.namesrvs, *self.brokers]


SET_TABLES = {"namesrv": "namesrv", "controller": "namesrv", "broker": "broker", "store": "broker"}
"""``--set`` tables, and which processes' config files take them."""


def parse_sets(items: list[str]) -> dict[str, dict[str, Any]]:
    """``--set TABLE.FIELD=VALUE`` items -> tables (VALUE as TOML: ``800``, ``true``,
    ``"text"``; anything that is not TOML is a string). ValueError naming a bad item."""
    tables: dict[str, dict[str, Any]] = {}
    for item in items:
        key, eq, text = item.partition("=")
        table, dot, name = key.strip().partition(".")
        if not eq or not dot or not name or table not in SET_TABLES:
            raise ValueError(
                f"--set {item!r}: TABLE.FIELD=VALUE, TABLE one of {', '.join(SET_TABLES)}"
            )
        try:
            value = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            value = text
        tables.setdefault(table, {})[name] = value
    return tables


DEFAULT_PORTS = (9876, 9878, 9880, 10911)
"""NameServer, controller, Raft and broker ports of a replica in a namespace of its own."""


def plan(
    hosts: list[str],
    data_dir: Path,
    broker_name: str,
    mode: str,
    min_in_sync: int,
    flush: str,
    netns: list[str] | None = None,
    sets: dict[str, dict[str, Any]] | None = None,
    auth: ClusterAuth | None = None,
) -> Plan:
    """The processes, their ports and config files (written under ``data_dir``). With
    ``netns``, replica i runs in namespace i on the default ports (free there, and not
    checkable from here). ``sets``: more settings per table (:func:`parse_sets`), in every
    NameServer's (``namesrv``, ``controller``) or broker's (``broker``, ``store``) file; the
    cluster's own choices (addresses, ports, paths, mode) win. ``auth``: authentication on
    everywhere (:mod:`orbitmq.cli.cluster_auth`)."""
    sets = sets or {}
    logs = data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    taken: set[int] = set()

    def port(host: str, i: int, *, pair: bool = False) -> int:
        return DEFAULT_PORTS[i] if netns else free_port(host, pair=pair, taken=taken)

    ns_ports = [port(h, 0) for h in hosts]
    ctl_ports = [port(h, 1) for h in hosts]
    raft_ports = [port(h, 2) for h in hosts]
    peers = ",".join(f"{h}:{c}/{r}" for h, c, r in zip(hosts, ctl_ports, raft_ports, strict=True))
    namesrv_addrs = [f"{h}:{p}" for h, p in zip(hosts, ns_ports, strict=True)]
    controller_addrs = [f"{h}:{p}" for h, p in zip(hosts, ctl_ports, strict=True)]
    namesrvs: list[Child] = []
    brokers: list[Child] = []
    for i, host in enumerate(hosts, 1):
        ns_config = data_dir / f"namesrv-{i}.toml"
        ns_config.write_text(
            settings_toml(
                {
                    "namesrv": {
                        **sets.get("namesrv", {}),
                        **(auth.namesrv_table() if auth else {}),
                    },
                    "controller": dict(sets.get("controller", {})),
                }
            )
        )
        args = [
            "namesrv", "--config", str(ns_config), "--host", host, "--port", str(ns_ports[i - 1]), "--controller",
            "--controller-port", str(ctl_ports[i - 1]),
            "--controller-raft-port", str(raft_ports[i - 1]),
            "--controller-peers", peers,
            "--controller-data-dir", str(data_dir / f"controller-{i}"),
        ]  # fmt: skip
        ns = netns[i - 1] if netns else None
        namesrvs.append(Child(f"namesrv-{i}", "namesrv", args, logs / f"namesrv-{i}.log", ns))
        broker_port = port(host, 3, pair=True)
        config = data_dir / f"{broker_name}-{i}.toml"
        tables: dict[str, dict[str, Any]] = {
            "broker": {
                **sets.get("broker", {}),
                "broker_name": broker_name,
                "host": host,
                "port": broker_port,
                "namesrv_addrs": namesrv_addrs,
                "controller_addrs": controller_addrs,
                "replication_mode": mode,
                "min_in_sync_replicas": min_in_sync,
                "auto_create_topic": True,
                "register_interval_s": 1.0,
                **(auth.broker_table() if auth else {}),
            },
            "store": {
                **CLUSTER_STORE,
                **sets.get("store", {}),
                "store_path": str(data_dir / f"{broker_name}-{i}"),
                "flush_disk_type": flush,
            },
        }
        config.write_text(settings_toml(tables))
        brokers.append(
            Child(
                f"{broker_name}-{i}",
                "broker",
                ["broker", "--config", str(config)],
                logs / f"{broker_name}-{i}.log",
                ns,
                auth.broker_env() if auth else {},
            )
        )
    return Plan(namesrvs, brokers)


def start(children: list[Child], timeout_s: float = START_TIMEOUT_S) -> None:
    """Launch them all, then wait for every ready line; RuntimeError naming the first that
    exits or stays silent (with its log's end)."""
    for child in children:
        child.launch()
    deadline = time.monotonic() + timeout_s
    for child in children:
        while not child.ready.wait(0.1):
            if not child.running or time.monotonic() > deadline:
                tail = child.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{child.name} did not start; its log ends:\n{tail}")


def stop(children: list[Child]) -> None:
    """SIGTERM each (brokers first: they deregister while the NameServers still run), then
    SIGKILL whatever has not exited STOP_TIMEOUT_S later."""
    for group in (
        [c for c in children if c.role == "broker"],
        [c for c in children if c.role != "broker"],
    ):
        for child in group:
            child.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for child in group:
            child.wait_or_kill(deadline)


def state(p: Plan) -> dict[str, Any]:
    """What ``cluster.json`` holds: every process with its PID, endpoints and log."""
    return {
        "namesrv": ";".join(c.address for c in p.namesrvs),
        "controller": ";".join(c.endpoints.get("controller", "") for c in p.namesrvs),
        "processes": [
            {"name": c.name, "role": c.role, "pid": c.pid, "args": c.args,
             "endpoints": c.endpoints, "log": str(c.log_path)}
            for c in p.children
        ],
    }  # fmt: skip


def write_state(p: Plan, path: Path) -> None:
    """``cluster.json``, replaced atomically (a script may read it at any moment)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state(p), indent=2) + "\n")
    tmp.replace(path)


def supervise(
    p: Plan, restart_after_s: float | None, stopping: threading.Event, state_file: Path
) -> None:
    """Report (and, with ``restart_after_s``, restart) processes that exit, until stopped;
    ``state_file`` is rewritten with the new PID after each restart."""
    while not stopping.wait(0.1):
        for child in p.children:
            if child.running or child.proc is None:
                continue
            if not child.reported:
                child.reported = True
                child.exited_at = time.monotonic()
                code = child.proc.returncode
                print(f"{child.name} (pid {child.pid}) exited with status {code}", flush=True)
            if restart_after_s is not None and (
                time.monotonic() - child.exited_at >= restart_after_s
            ):
                child.launch()
                write_state(p, state_file)
                print(f"{child.name} restarted: pid {child.pid}", flush=True)


def cluster_up(
    replicas: Annotated[
        int, typer.Option(min=1, max=9, help="Replicas: NameServers+controllers, and brokers.")
    ] = 3,
    data_dir: Annotated[Path, typer.Option(help="Folder for all data and logs.")] = Path(
        "orbitmq-cluster"
    ),
    hosts: Annotated[
        str | None,
        typer.Option(help="Hosts of the replicas, ','-separated (default 127.0.0.1..N)."),
    ] = None,
    broker_name: Annotated[str, typer.Option(help="The broker group's name.")] = "broker-a",
    replication_mode: Annotated[str, typer.Option(help="sync or async.")] = "sync",
    min_in_sync_replicas: Annotated[
        int | None,
        typer.Option(
            help="sync: replicas in sync (master counted) to take a send; default "
            "2 with 3 replicas or more, else 1."
        ),
    ] = None,
    flush: Annotated[str, typer.Option(help="ASYNC_FLUSH or SYNC_FLUSH.")] = "ASYNC_FLUSH",
    restart_after: Annotated[
        float | None,
        typer.Option(help="Restart a process that exits after this many seconds (default: no)."),
    ] = None,
    netns: Annotated[
        str | None,
        typer.Option(
            help="Linux, as root: run replica i in network namespace i (','-separated, "
            "made beforehand, with --hosts their addresses) on the default ports."
        ),
    ] = None,
    auth: Annotated[
        bool,
        typer.Option(
            "--auth",
            help="Authentication and ACLs on in every process (one auth file in the data "
            "folder; 'admin' bootstrapped: ORBITMQ_AUTH_ADMIN_SECRET, else a generated secret "
            "printed once).",
        ),
    ] = False,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="TABLE.FIELD=VALUE (repeatable): a setting of every NameServer (namesrv, "
            "controller tables) or broker (broker, store), e.g. controller.master_lease_ms=800.",
        ),
    ] = None,
) -> None:
    """Start a local replicated cluster: N NameServers with controllers and one broker group
    of N in controller mode, as separate processes on 127.0.0.1..N. Ctrl-C stops them all.

    Example: orbitmq cluster up --replicas 3
    """
    host_list = [h.strip() for h in hosts.split(",") if h.strip()] if hosts else [
        f"127.0.0.{i}" for i in range(1, replicas + 1)
    ]  # fmt: skip
    if len(host_list) != replicas:
        fail(f"--hosts names {len(host_list)} hosts for {replicas} replicas")
    ns_list = [n.strip() for n in netns.split(",") if n.strip()] if netns else None
    if ns_list is not None and (len(ns_list) != replicas or not hosts):
        fail("--netns names one namespace per replica, with --hosts their addresses")
    if replication_mode not in ("sync", "async"):
        fail("--replication-mode is sync or async")
    min_isr = min_in_sync_replicas or (2 if replicas >= 3 else 1)
    try:
        sets = parse_sets(set_ or [])
    except ValueError as exc:
        fail(str(exc))
    stopping = threading.Event()

    def on_signal(_sig: int, _frame: Any) -> None:
        stopping.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    cluster_auth = prepare_auth(data_dir, broker_name) if auth else None
    p = plan(
        host_list, data_dir, broker_name, replication_mode, min_isr, flush, ns_list, sets,
        cluster_auth,
    )  # fmt: skip
    try:
        try:
            start(p.namesrvs)
            start(p.brokers)
        except (RuntimeError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            raise typer.Exit(1) from exc
        info = state(p)
        write_state(p, data_dir / "cluster.json")
        for child in p.children:
            print(f"{child.name:<14} pid {child.pid:<8} {child.role} {child.address}  "
                  f"log {child.log_path}")  # fmt: skip
        print(f"export ORBITMQ_NAMESRV='{info['namesrv']}'")
        print(f"export ORBITMQ_CONTROLLER='{info['controller']}'")
        if cluster_auth is not None:
            print(f"authentication is on (users and ACLs: {cluster_auth.auth_file}); sign as "
                  f"{ADMIN_USER}: export ORBITMQ_ACCESS_KEY={ADMIN_USER} ORBITMQ_SECRET_KEY=<its "
                  "secret>")  # fmt: skip
        print("Ctrl-C stops every process.", flush=True)
        brokers = ";".join(c.address for c in p.brokers)
        endpoints = {"namesrv": info["namesrv"], "controller": info["controller"],
                     "brokers": brokers, "state": str(data_dir / "cluster.json"),
                     "auth": "on" if cluster_auth else "off"}  # fmt: skip
        print(ready_line("cluster", endpoints), flush=True)
        supervise(p, restart_after, stopping, data_dir / "cluster.json")
    finally:
        stop(p.children)
        for sig, handler in previous.items():
            signal.signal(sig, handler)

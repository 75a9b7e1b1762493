"""ControllerConfig: one controller node's settings, and the peer list format.

A controller node listens on two ports: the Remoting port brokers and admins use (``port``,
RocketMQ's sample 9878) and the Raft port its peers replicate on (``raft_port``, 9880). Every
node is given the same ``peers``: each node's ``host:port/raft_port``, itself included; a node
finds itself in the list by its own ``host:port``. An empty list is a one-node controller (no
fault tolerance: if it dies, failover stops, traffic does not).

Timing defaults follow the brief (docs/ha.md, "Leases and election delays"): brokers heartbeat
every 500 ms, a master stops acknowledging ``master_lease_ms`` after the last heartbeat the Raft
leader answered, and an election waits ``master_lease_ms + election_margin_ms`` after the
master's last heartbeat and ``master_lease_ms + leader_fallback_ms + election_margin_ms`` after
this node became leader.
"""

from __future__ import annotations

from dataclasses import dataclass

from orbitmq.common.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Peer:
    address: str
    """The node's Remoting "host:port"."""
    raft_address: str
    """The node's Raft "host:raft_port"."""


def parse_peer(text: str) -> Peer:
    """``host:port/raft_port`` -> Peer (the Raft port is on the same host)."""
    addr, sep, raft_port = text.strip().partition("/")
    host, colon, port = addr.rpartition(":")
    if not sep or not colon or not host or not port.isdigit() or not raft_port.isdigit():
        raise ConfigError(f"controller peer {text!r} is not host:port/raft_port")
    if not (0 < int(port) < 65536 and 0 < int(raft_port) < 65536):
        raise ConfigError(f"controller peer {text!r}: ports must be in [1, 65535]")
    return Peer(addr, f"{host}:{raft_port}")


def parse_peers(text: str) -> tuple[str, ...]:
    """A comma-separated peer list (as the CLI takes it), checked."""
    peers = tuple(p.strip() for p in text.split(",") if p.strip())
    for p in peers:
        parse_peer(p)
    return peers


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    host: str = "127.0.0.1"
    """Address to listen on, for Remoting and Raft."""
    port: int = 9878
    """Remoting port brokers and admins dial (RocketMQ's sample controller port)."""
    raft_port: int = 9880
    """Port the Raft peers replicate on."""
    peers: tuple[str, ...] = ()
    """Every controller node as ``host:port/raft_port``, this one included; the same list on
    every node. Empty: a single node. Membership is static (pysyncobj's dynamic membership
    races; add a node by restarting all of them with the new list)."""
    data_dir: str = "orbitmq-data/controller"
    """Raft journal and dump (``raft.journal``, ``raft.dump``); one directory per node."""
    raft_secret: str | None = None
    """Shared secret that encrypts and authenticates Raft traffic (pysyncobj ``password``).
    Raft messages are pickled: set it whenever the Raft port is reachable from other hosts."""
    master_lease_ms: int = 2000
    """How long a master keeps acknowledging after the last heartbeat the Raft leader answered."""
    leader_fallback_ms: int = 1500
    """A Raft leader that has not heard from a majority for this long steps down (pysyncobj's
    leaderFallbackTimeout; its default, 30 s, would let a deposed leader renew leases that long)."""
    election_margin_ms: int = 500
    """Added to every election delay for clock-rate drift and scheduling."""
    broker_heartbeat_timeout_ms: int = 2500
    """A broker silent for this long is not alive (not a candidate, not counted in a
    SyncStateSet change)."""
    scan_interval_ms: int = 500
    """How often the leader looks for groups whose master died."""
    enable_unclean_election: bool = False
    """Elect a replica outside the SyncStateSet when no member is alive: availability over
    acknowledged messages. Off, as Kafka's unclean.leader.election.enable."""
    metrics_port: int | None = None
    """Prometheus endpoint port (None: off; 0: a free one)."""
    commit_timeout_ms: int = 3000
    """How long a request waits for its command to commit before answering SYSTEM_BUSY (the
    outcome is then unknown: read the replica info)."""

    def peer_list(self) -> list[Peer]:
        return [parse_peer(p) for p in self.peers]

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def raft_address(self) -> str:
        return f"{self.host}:{self.raft_port}"

    def check(self) -> None:
        """ConfigError on a value out of range or a peer list that does not name this node."""
        for name in ("port", "raft_port"):
            value = getattr(self, name)
            if not 0 < value < 65536:
                raise ConfigError(f"controller {name} {value} is outside [1, 65535]")
        for name in (
            "master_lease_ms",
            "leader_fallback_ms",
            "broker_heartbeat_timeout_ms",
            "scan_interval_ms",
            "commit_timeout_ms",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"controller {name} must be positive")
        if self.election_margin_ms < 0:
            raise ConfigError("controller election_margin_ms must not be negative")
        if self.leader_fallback_ms <= 100:
            raise ConfigError("controller leader_fallback_ms must be above 100 (the Raft ping)")
        peers = self.peer_list()
        if peers:
            me = [p for p in peers if p.address == self.address]
            if len(me) != 1:
                raise ConfigError(f"controller peers must name this node ({self.address}) once")
            if me[0].raft_address != self.raft_address:
                raise ConfigError(
                    f"controller peers give this node Raft address {me[0].raft_address},"
                    f" its raft_port says {self.raft_address}"
                )
            if len({p.raft_address for p in peers}) != len(peers):
                raise ConfigError("controller peers repeat a Raft address")

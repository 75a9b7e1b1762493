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

Every field is declared with :func:`orbitmq.common.config.setting` (the ``[controller]`` table
of docs/configuration.md); :meth:`ControllerConfig.check` adds the checks across fields.
"""

from __future__ import annotations

from dataclasses import dataclass

from orbitmq.common.config import (
    PORT,
    Check,
    above,
    at_least,
    between,
    check_settings,
    non_empty,
    optional,
    setting,
)
from orbitmq.common.errors import ConfigError
from orbitmq.net.settings import ListenerSettings


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


def _peers_parse(value: object) -> bool:
    if isinstance(value, str) or not isinstance(value, tuple | list):
        return False
    try:
        for p in value:
            parse_peer(p)
    except (ConfigError, AttributeError):
        return False
    return True


PEERS = Check(_peers_parse, "a list of host:port/raft_port (ports 1..65535)")
LISTEN_PORT = between(1, 65535)
"""Controller ports are fixed: the peers name each other's, so 0 (a free one) cannot work."""


@dataclass(frozen=True, slots=True)
class ControllerConfig(ListenerSettings):
    host: str = setting("127.0.0.1", "Address to listen on, for Remoting and Raft.", non_empty())
    port: int = setting(
        9878,
        "Remoting port brokers and admins dial (RocketMQ's sample controller port).",
        LISTEN_PORT,
    )
    raft_port: int = setting(9880, "Port the Raft peers replicate on.", LISTEN_PORT)
    peers: tuple[str, ...] = setting(
        (),
        """Every controller node as `host:port/raft_port`, this one included; the same list on
        every node. Empty: a single node. Membership is static (add a node by restarting all of
        them with the new list).""",
        PEERS,
    )
    data_dir: str = setting(
        "orbitmq-data/controller",
        "Raft journal and dump (`raft.journal`, `raft.dump`); one directory per node.",
        non_empty(),
    )
    raft_secret: str | None = setting(
        None,
        """Shared secret that encrypts and authenticates Raft traffic. Raft messages are
        pickled: set it whenever the Raft port is reachable from other hosts.""",
        optional(non_empty()),
    )
    master_lease_ms: int = setting(
        2000,
        "How long a master keeps acknowledging after the last heartbeat the Raft leader answered.",
        above(0),
    )
    leader_fallback_ms: int = setting(
        1500,
        """A Raft leader that has not heard from a majority for this long steps down (above the
        100 ms Raft ping; pysyncobj's 30 s default would let a deposed leader renew leases that
        long).""",
        above(100),
    )
    election_margin_ms: int = setting(
        500, "Added to every election delay for clock-rate drift and scheduling.", at_least(0)
    )
    broker_heartbeat_timeout_ms: int = setting(
        2500,
        """A broker silent for this long is not alive (not a candidate, not counted in a
        SyncStateSet change).""",
        above(0),
    )
    scan_interval_ms: int = setting(
        500, "How often the leader looks for groups whose master died.", above(0)
    )
    enable_unclean_election: bool = setting(
        False,
        """Elect a replica outside the SyncStateSet when no member is alive: availability over
        acknowledged messages (as Kafka's unclean.leader.election.enable).""",
    )
    metrics_port: int | None = setting(
        None, "Prometheus endpoint port (None: off; 0: a free one).", optional(PORT)
    )
    commit_timeout_ms: int = setting(
        3000,
        """How long a request waits for its command to commit before answering SYSTEM_BUSY (the
        outcome is then unknown: read the replica info).""",
        above(0),
    )
    # Authentication and authorization (docs/security.md, "Controller").
    auth_enabled: bool = setting(
        False,
        """Every request (broker heartbeats and registrations, elections, `cluster describe`)
        must be signed by a user (AK/SK) or come with a client certificate, and is authorized
        by that user's ACL: Cluster Update for changes, Cluster Get for reads.""",
    )
    auth_store: str = setting(
        "file",
        """Where users and ACLs live: `file` (`auth_file`, as a broker or NameServer) or
        `raft` (in this controller group's replicated state, versioned; brokers and
        NameServers follow it with `auth_controller_addrs`).""",
        Check(lambda v: v in ("file", "raft"), "file or raft"),
    )
    auth_file: str | None = setting(
        None,
        """The users-and-ACLs file (auth_store `file`; required then when auth_enabled). With
        `raft`, only `<auth_file>.key` is used: the key sealing secrets, the same on every
        server (or ORBITMQ_AUTH_KEY).""",
    )
    audit_file: str | None = setting(
        None, "The hash-chained audit log of admin changes and refusals (None: the log only)."
    )
    cluster: str = setting(
        "DefaultCluster",
        "The cluster name the Cluster resource of every controller request is checked on.",
        non_empty(),
    )

    def __post_init__(self) -> None:
        peers: object = self.peers
        if isinstance(peers, list):  # from JSON; the field is a tuple
            object.__setattr__(self, "peers", tuple(peers))
        if isinstance(self.peers, tuple):
            for p in self.peers:  # the error names the bad peer and why
                parse_peer(p)
        check_settings(self, "controller")
        self.check_listener("controller")
        if self.auth_enabled and self.auth_store == "file" and not self.auth_file:
            raise ConfigError("controller.auth_enabled with auth_store file needs auth_file")

    def peer_list(self) -> list[Peer]:
        return [parse_peer(p) for p in self.peers]

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def raft_address(self) -> str:
        return f"{self.host}:{self.raft_port}"

    def check(self) -> None:
        """ConfigError on a value out of range (also checked on construction) or a peer list that
        does not name this node (checked here only: settings are merged one layer at a time)."""
        check_settings(self, "controller")
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

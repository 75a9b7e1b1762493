"""The controller: a Raft-replicated registry of broker groups that elects masters (docs/ha.md).

Three (or five) nodes, standalone (``orbitmq controller``) or embedded beside NameServers, keep
per broker group its replicas, master, master epoch and SyncStateSet in a pysyncobj state
machine (`state`); brokers heartbeat every node (`heartbeats`); the Raft leader answers the
Remoting API (`processor`, `server`) and elects a new master from the SyncStateSet when the
master's heartbeats stop (`election`). It imports no broker, NameServer or store code.
"""

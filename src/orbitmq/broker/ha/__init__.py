"""Replication of a broker group, static mode (docs/ha.md): a fixed master streams its CommitLog
to its slaves over the HA link (:mod:`orbitmq.protocol.ha`).

:mod:`.master` serves the link and keeps the in-sync set, the confirm offset and the sync-mode
send waiters; :mod:`.slave` copies the master's log; :mod:`.link` is the framed connection both
use. The broker's send and pull paths see only a
:class:`~orbitmq.broker.context.ReplicationGate`; the controller builds the side its
``broker_id`` says.
"""

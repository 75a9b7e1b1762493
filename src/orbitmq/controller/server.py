"""ControllerNode: one controller node's parts (Raft, liveness, Remoting server, scans), started
and stopped together; `run_controller` runs one inside an event loop (standalone or beside a
NameServer), `run_standalone` as a whole process.

Threads: pysyncobj ticks on its own thread (`raft`); everything else runs on the event loop.
Command results cross over through ``call_soon_threadsafe`` only.

Background work, on a `TaskSet`:

- the scan, every ``scan_interval_ms``: marks silent brokers dead (logged) and, on the Raft
  leader (once it has committed a barrier in its term, so its state holds every earlier
  commit), elects a new master for every group whose master is dead, once `election_wait` allows
  it (the old master's lease has run out, and so has any lease a deposed leader renewed). A
  group whose master is unset but has an alive SyncStateSet member (a member came back after an
  election found nobody) is elected too. One election per group at a time;
- notifications: after a command changed a group, its brokers get a one-way
  NOTIFY_BROKER_ROLE_CHANGED with the new ReplicaInfo on the connection they heartbeat on
  (they also see the epochs in every heartbeat answer, so a lost notification costs at most one
  heartbeat interval).

A closed broker connection marks the broker dead at once, but the election still waits for its
lease (brief 5.7(d)): the process may be alive behind a broken connection.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import threading
from collections.abc import Callable
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server

from orbitmq.auth.audit import AuditLog
from orbitmq.auth.guard import Guard
from orbitmq.auth.server import ServerAuth
from orbitmq.common.clock import SYSTEM_CLOCK, Clock
from orbitmq.common.codes import ResponseCode
from orbitmq.common.tasks import TaskSet
from orbitmq.controller.auth_data import bootstrap, raft_auth_store
from orbitmq.controller.config import ControllerConfig
from orbitmq.controller.heartbeats import Heartbeats
from orbitmq.controller.metrics import ControllerMetrics
from orbitmq.controller.processor import (
    CommitTimeout,
    ControllerProcessor,
    NotLeader,
    replica_info,
)
from orbitmq.controller.raft import CommandFailed, RaftNode
from orbitmq.controller.state import GroupView, Outcome
from orbitmq.net.connection import Connection, ConnectionClosedError, Reply
from orbitmq.net.loop import run
from orbitmq.net.server import RemotingServer
from orbitmq.protocol.bodies import encode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.controller_requests import NotifyBrokerRoleChangedRequest
from orbitmq.protocol.frame import Frame

log = logging.getLogger(__name__)


_FENCED = frozenset(
    {
        ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH,
        ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH,
    }
)


def _code_name(enum: type[RequestCode] | type[ResponseCode], code: int) -> str:
    try:
        return enum(code).name
    except ValueError:
        return str(code)


def open_auth(config: ControllerConfig) -> ServerAuth:
    """The node's ServerAuth: off, or the Guard on the configured store (with auth_store
    "raft", nothing but the audit log until the Raft node exists)."""
    if config.auth_store == "raft":
        return ServerAuth(None, AuditLog(config.audit_file, "controller"), None)
    return ServerAuth.open(
        enabled=config.auth_enabled,
        auth_file=config.auth_file,
        audit_file=config.audit_file,
        cluster=config.cluster,
        node="controller",
    )


class ControllerNode:
    def __init__(self, config: ControllerConfig, *, clock: Clock = SYSTEM_CLOCK) -> None:
        config.check()
        self.config = config
        self.clock = clock
        peers = config.peer_list()
        self._remoting_by_raft = {p.raft_address: p.address for p in peers} or {
            config.raft_address: config.address
        }
        self.peers = [p.address for p in peers] or [config.address]
        self.heartbeats = Heartbeats(config.broker_heartbeat_timeout_ms / 1000, clock=clock)
        self.raft: RaftNode | None = None
        self.processor: ControllerProcessor | None = None
        self.server = RemotingServer(
            self._handle,
            host=config.host,
            port=config.port,
            name="controller",
            on_disconnect=self._on_disconnect,
            tls=config.tls_source(),
            tls_mode=config.tls_mode,
            limits=config.limits(),
        )
        self.auth = open_auth(config)
        """Authentication, authorization and the user/ACL admin codes (docs/security.md); with
        auth_store "raft" replaced at start, once the Raft state exists."""
        self._auth_in_thread = False
        self.tasks = TaskSet("controller", logger=log)
        self._electing: set[str] = set()
        self._fresh_term = -1
        """The Raft term in which this node, as leader, committed a barrier: its state holds
        everything committed before that term. The scan elects only then."""
        self._catching_up = False
        self.elections = 0
        """Elections this node committed that changed a master (for tests and metrics)."""
        self.metrics = ControllerMetrics()
        self.metrics_port: int | None = None
        """The Prometheus endpoint's port once started (None: no endpoint)."""
        self._metrics_server: WSGIServer | None = None
        self._metrics_thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        return self.config.address

    def leader_address(self) -> str | None:
        """The Remoting address of the Raft leader as this node knows it."""
        if self.raft is None:
            return None
        leader = self.raft.leader()
        return None if leader is None else self._remoting_by_raft.get(leader)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        config = self.config
        others = [r for r in self._remoting_by_raft if r != config.raft_address]
        if config.raft_secret is None and config.host not in ("127.0.0.1", "localhost", "::1"):
            log.warning(
                "controller: Raft traffic on %s is not authenticated (pickled): set raft_secret",
                config.raft_address,
            )
        # SyncObj's constructor binds and starts its tick thread: keep it off the loop.
        self.raft = await asyncio.to_thread(
            RaftNode,
            config.raft_address,
            others,
            config.data_dir,
            leader_fallback_s=config.leader_fallback_ms / 1000,
            secret=config.raft_secret,
            clock=self.clock,
        )
        if config.auth_store == "raft":
            self._open_raft_auth(self.raft)
        self.processor = ControllerProcessor(
            config,
            self.raft,
            self.heartbeats,
            leader_address=self.leader_address,
            peers=self.peers,
            on_outcome=self._on_outcome,
            clock=self.clock,
        )
        try:
            await self.server.start()
            if config.metrics_port is not None:
                self._start_metrics(config.metrics_port)
        except BaseException:
            await self.server.stop()
            await asyncio.to_thread(self.raft.destroy)
            raise
        self.tasks.spawn(self._scan_loop(), name="controller-scan")
        log.info(
            "controller listening on %s (Raft %s, peers %s)",
            self.address,
            config.raft_address,
            ",".join(self.peers),
        )

    def _open_raft_auth(self, raft: RaftNode) -> None:
        """Users and ACLs in the Raft state: the Guard reads them there, the admin codes change
        them through Raft (auth_data.py); with auth on, the first Super user is made."""
        config, audit = self.config, self.auth.audit
        store = raft_auth_store(config, raft)
        guard = Guard(store, audit, cluster=config.cluster) if config.auth_enabled else None
        self.auth = ServerAuth(store, audit, guard)
        self._auth_in_thread = True
        if guard is not None:
            self.tasks.spawn(bootstrap(store, raft), name="controller-auth-bootstrap")

    async def stop(self) -> None:
        await self.tasks.close(timeout=5.0)
        await self.server.stop()
        server, self._metrics_server = self._metrics_server, None
        thread, self._metrics_thread = self._metrics_thread, None
        if server is not None:
            await asyncio.to_thread(server.shutdown)
            server.server_close()
        if thread is not None:
            await asyncio.to_thread(thread.join, 5.0)
        raft, self.raft = self.raft, None
        if raft is not None:
            await asyncio.to_thread(raft.destroy)

    def _start_metrics(self, port: int) -> None:
        server, thread = start_http_server(
            port,
            addr=self.config.host,
            registry=self.metrics.registry,
            **self.config.metrics_tls_options(),
        )
        self._metrics_server, self._metrics_thread = server, thread
        self.metrics_port = server.server_port
        log.info("controller metrics on %s:%d", self.config.host, self.metrics_port)

    # ------------------------------------------------------------------ events

    async def _handle(self, request: Frame, conn: Connection) -> Reply:
        if self.processor is None:
            return request.reply(ResponseCode.SYSTEM_BUSY, "controller starting")
        # Every request passes the same Guard as on a NameServer before any handler; an
        # unmapped code is refused there (auth/actions.py maps every controller code).
        if self._auth_in_thread and request.code in self.auth.codes:
            # a change commits through Raft and waits for it: not on the event loop
            answer = await asyncio.to_thread(self.auth.before, request, conn)
        else:
            answer = self.auth.before(request, conn)
        reply = await self.processor.process(request, conn) if answer is None else answer
        await self.auth.penalize(reply, conn)  # a failed authentication waits (auth/server.py)
        name = _code_name(RequestCode, request.code)
        self.metrics.requests.labels(name, _code_name(ResponseCode, reply.code)).inc()
        return reply

    def _on_outcome(self, command: str, outcome: Outcome) -> None:
        m = self.metrics
        m.commands.labels(command, _code_name(ResponseCode, outcome.code)).inc()
        if outcome.code in _FENCED:
            m.fenced.labels(command).inc()
        if command == "elect_master" and outcome.changed:
            m.elections.labels("elected" if outcome.ok else "no_master").inc()
        if outcome.changed and outcome.group is not None:
            self._notify(outcome.group)

    def _on_disconnect(self, conn: Connection) -> None:
        for name, bid in self.heartbeats.channel_closed(conn):
            log.info("broker %s/%d: connection closed (%s)", name, bid, conn.close_reason)

    def _notify(self, view: GroupView) -> None:
        frame_body = encode_body(replica_info(view, self.heartbeats))
        for channel in self.heartbeats.channels(view.broker_name):
            if not isinstance(channel, Connection) or not channel.is_open:
                continue
            try:
                channel.send_oneway(NotifyBrokerRoleChangedRequest().frame(frame_body))
            except ConnectionClosedError:
                continue

    # ------------------------------------------------------------------ scan

    async def _scan_loop(self) -> None:
        interval = self.config.scan_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            self.scan()

    def scan(self) -> None:
        """One step of the scan (see the module docstring)."""
        for name, bid in self.heartbeats.expire():
            log.warning("broker %s/%d: no heartbeat, not alive", name, bid)
        raft, processor = self.raft, self.processor
        if raft is None or processor is None:
            return
        self._update_gauges(raft)
        if not raft.is_leader():
            return
        if self._fresh_term != raft.term:
            # A new leader applies the entries of earlier terms only once an entry of its own
            # term commits: elect from its views only after that.
            if not self._catching_up:
                self._catching_up = True
                self.tasks.spawn(self._catch_up(raft.term), name="controller-catch-up")
            return
        for name in raft.state.group_names():
            view = raft.state.view(name)
            if view is None or name in self._electing or not self._needs_election(view):
                continue
            if processor.election_wait(view) > 0:
                continue
            self._electing.add(name)
            self.tasks.spawn(self._elect(view), name=f"controller-elect-{name}")

    def _update_gauges(self, raft: RaftNode) -> None:
        m = self.metrics
        m.leader.set(1 if raft.is_leader() else 0)
        m.raft_term.set(raft.term)
        names = raft.state.group_names()
        m.groups.set(len(names))
        alive = 0
        for name in names:
            view = raft.state.view(name)
            if view is None:
                continue
            alive += len(self.heartbeats.alive_ids(name))
            m.master_epoch.labels(name).set(view.master_epoch)
            m.sync_state_set_size.labels(name).set(len(view.sync_state_set))
            m.has_master.labels(name).set(0 if view.master is None else 1)
        m.alive_brokers.set(alive)

    async def _catch_up(self, term: int) -> None:
        assert self.processor is not None
        try:
            await self.processor.fresh()
            self._fresh_term = term
        except (NotLeader, CommitTimeout) as exc:
            log.info("controller: catching up in term %d failed: %r", term, exc)
        finally:
            self._catching_up = False

    def _needs_election(self, view: GroupView) -> bool:
        name = view.broker_name
        if view.master is not None:
            return not self.heartbeats.alive(name, view.master)
        if view.master_epoch == 0:
            return False  # never elected: the first broker to ask becomes master
        alive = set(self.heartbeats.alive_ids(name))
        return bool(alive & view.sync_state_set) or (
            self.config.enable_unclean_election and bool(alive & set(view.replicas))
        )

    async def _elect(self, view: GroupView) -> None:
        name = view.broker_name
        assert self.processor is not None
        try:
            outcome = await self.processor.run(
                "elect_master", *self.processor.elect_args(view, None, None)
            )
        except (CommandFailed, TimeoutError) as exc:
            log.warning("controller: election of %s did not commit: %s", name, exc)
            return
        finally:
            self._electing.discard(name)
        group = outcome.group
        if outcome.ok and group is not None:
            self.elections += 1
            log.warning(
                "controller: %s elected broker %s master at epoch %d (old master %s)",
                name,
                group.master,
                group.master_epoch,
                view.master,
            )
        elif outcome.changed:
            log.error("controller: %s has no master: %s", name, outcome.remark)


async def run_controller(
    config: ControllerConfig,
    ready: Callable[[ControllerNode], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Run one controller node until ``stop`` is set (or the task is cancelled). ``ready`` is
    called with the started node. Embeds beside a NameServer on the same loop."""
    node = ControllerNode(config)
    await node.start()
    try:
        if ready is not None:
            ready(node)
        await (stop if stop is not None else asyncio.Event()).wait()
    finally:
        await node.stop()


def run_standalone(config: ControllerConfig) -> int:
    """A controller process: runs until SIGINT or SIGTERM; prints ``orbitmq controller ready
    controller=<host:port> raft=<host:port>`` once listening. Returns the exit status."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)

        def ready(node: ControllerNode) -> None:
            ready_line = f"controller={node.address} raft={node.config.raft_address}"
            if node.metrics_port is not None:
                ready_line += f" metrics=http://{node.config.host}:{node.metrics_port}/metrics"
            print(f"orbitmq controller ready {ready_line}", flush=True)

        await run_controller(config, ready, stop)

    try:
        run(main())
    except OSError as exc:  # a port is taken, the host is not ours, the data dir unwritable
        print(f"orbitmq controller: {exc}", file=sys.stderr)
        return 1
    return 0

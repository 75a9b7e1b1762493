"""BrokerController: wires one broker process together and owns its lifecycle.

start: open the store (recovery runs off the loop), load topics and consumer offsets, listen,
register with every NameServer and keep re-registering every ``register_interval_s`` (the
heartbeat); expire silent consumers and lapsed queue locks, write changed offsets periodically.
stop: stop listening, unregister, wake held pulls, write the offsets, flush and close the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from orbitmq.auth.server import ServerAuth
from orbitmq.broker import heap
from orbitmq.broker.config import BrokerConfig
from orbitmq.broker.consumer_lag import ConsumerLagCollector
from orbitmq.broker.consumer_manager import ConsumerManager
from orbitmq.broker.consumer_processor import ConsumerProcessor
from orbitmq.broker.context import (
    BrokerContext,
    NoReplication,
    ReplicationGate,
    StoreSystemLog,
    SystemLog,
)
from orbitmq.broker.group_config_manager import SubscriptionGroupManager
from orbitmq.broker.group_config_processor import GroupConfigProcessor
from orbitmq.broker.ha.master import HaMaster
from orbitmq.broker.ha.metrics import HaCollector
from orbitmq.broker.ha.replicas import ReplicasManager
from orbitmq.broker.ha.roles import RoleSwitch
from orbitmq.broker.ha.slave import HaSlave
from orbitmq.broker.lock_manager import LockManager
from orbitmq.broker.long_polling import LongPolling
from orbitmq.broker.metadata.journal import MetadataJournal
from orbitmq.broker.metadata.service import MetadataService
from orbitmq.broker.metrics import BrokerMetrics, HealthCollector, TierCollector
from orbitmq.broker.offset_manager import ConsumerOffsetManager
from orbitmq.broker.pop.processor import PopProcessor
from orbitmq.broker.pop.service import PopService
from orbitmq.broker.processor import BrokerProcessor
from orbitmq.broker.routes import EAGER_CODES, Dispatcher, build_routes
from orbitmq.broker.runtime_config import RuntimeConfigProcessor
from orbitmq.broker.service_metrics import ServiceGaugeCollector, store_backlogs
from orbitmq.broker.store_bridge import StoreBridge
from orbitmq.broker.timer_delivery import DelayedDelivery
from orbitmq.broker.timer_processor import TimerProcessor
from orbitmq.broker.timer_service import TimerService
from orbitmq.broker.topic_manager import TopicConfigManager
from orbitmq.broker.trace import TraceService
from orbitmq.broker.transaction.half import HalfMessages
from orbitmq.broker.transaction.processor import TransactionProcessor
from orbitmq.broker.transaction.service import TransactionService
from orbitmq.common.clock import SYSTEM_CLOCK, Clock
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MQError
from orbitmq.common.tasks import TaskSet
from orbitmq.net.client import RemotingClient
from orbitmq.net.connection import Connection
from orbitmq.net.metrics import RefusalCollector
from orbitmq.net.quota import ByteQuotas
from orbitmq.net.server import RemotingServer
from orbitmq.protocol.bodies import RegisterBrokerBody, TopicConfig, encode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.requests import RegisterBrokerRequest, UnregisterBrokerRequest
from orbitmq.protocol.signature import Signer
from orbitmq.store.message_store import MessageStore
from orbitmq.store.recovery import RecoveryReport
from orbitmq.store.retention import TopicRetention
from orbitmq.store.supervise import ServiceHealth
from orbitmq.store.tier.factory import with_broker_prefix
from orbitmq.store.timer_index import TimerIndex

log = logging.getLogger(__name__)


class RegistrationError(Exception):
    """Registration with one or more NameServers failed (the causes, one per NameServer)."""


class BrokerController:
    """Builds the broker: the managers and the `BrokerContext`, then the services (each given
    the context and the one or two services it calls), the processors, the route table
    (:func:`~orbitmq.broker.routes.build_routes`) and the server; starts and stops them in
    order."""

    def __init__(
        self,
        config: BrokerConfig,
        *,
        clock: Clock = SYSTEM_CLOCK,
        system_log: SystemLog | None = None,
    ) -> None:
        """``system_log``: where the Pop and transaction system topics live (default: this
        broker's store; tests pass an in-memory one)."""
        self.config = config
        self.store = MessageStore(
            with_broker_prefix(config.store, config.cluster, config.broker_name, config.broker_id)
        )
        self.topics = TopicConfigManager(
            config.store.store_path / "config" / "topics.json", config.default_queue_nums
        )
        self.metrics = BrokerMetrics(config.cluster, config.broker_name)
        self.bridge = StoreBridge(
            self.store,
            config.send_queue_capacity,
            config.send_wait_timeout_ms,
            on_append=self.metrics.append_latency.observe,
            inline_max_bytes=config.send_inline_max_bytes,
        )
        self.groups = SubscriptionGroupManager(
            config.store.store_path / "config" / "subscriptionGroup.json"
        )
        """Consumer-group configs (retry policy, DLQ limit): ``groups.get(g)``."""
        self.offsets = ConsumerOffsetManager(
            config.store.store_path / "config" / "consumerOffset.json", fsync=True
        )
        self.consumers = ConsumerManager(config.consumer_expiry_s)
        self.consumers.on_event = lambda e: self.metrics.membership_changes.labels(e).inc()
        self.locks = LockManager(config.rebalance_lock_ttl_s)
        self.consumers.on_leave(self.locks.release_client)
        self.writable = True
        self.ha: HaMaster | HaSlave | RoleSwitch | None = None
        """Replication (docs/ha.md), when ``ha_enable``: the master's or the slave's side; in
        controller mode (``controller_addrs``) the switch between them."""
        self.replicas: ReplicasManager | None = None
        """Controller mode: id, heartbeats, lease and the role from the controller."""
        self._master_services = False
        self._promotions = 0
        if config.controller_addrs:
            self.ha = RoleSwitch(config, self.store, self.bridge, clock, self)
            self.replicas = ReplicasManager(config, self.store, self.ha, clock)
        elif config.ha_enable:
            if config.broker_id == 0:
                self.ha = HaMaster(config, self.store, self.bridge, clock)
            else:
                self.ha = HaSlave(config, self.store)
        replication: ReplicationGate = self.ha if self.ha is not None else NoReplication()
        journal = MetadataJournal.for_broker(config, self.bridge.put, replication)
        self.ctx = BrokerContext(
            config=config,
            store=self.store,
            bridge=self.bridge,
            log=system_log or StoreSystemLog(self.store, self.bridge),
            topics=self.topics,
            offsets=self.offsets,
            groups=self.groups,
            consumers=self.consumers,
            locks=self.locks,
            metrics=self.metrics,
            clock=clock,
            topics_changed=self.topics_changed,
            apply_retention=self.apply_retention,
            # Controller mode: only the master writes (a slave's log holds its master's bytes).
            writable=lambda: self.writable and not (self.replicas is not None and self.is_slave),
            replication=replication,
            journal=journal,
        )
        ctx = self.ctx
        self.metadata = MetadataService(ctx, journal) if journal is not None else None
        """The metadata log (docs/ha.md, "Metadata replication"): ha_enable or controller mode."""
        if self.metadata is not None and isinstance(self.ha, HaSlave | RoleSwitch):
            self.ha.truncation_guard = self.metadata.paused  # no apply pass during a cut
        # Services: state and background work (each takes only what it uses).
        self.timer = TimerService(ctx)
        """Delayed and timer messages: loads and fires them (docs/timers.md)."""
        self.delayed = DelayedDelivery(ctx, self.timer.levels, self.timer.roll_window_ms)
        """Stores delayed messages: ``await delayed.put_delayed(batch, deliver_at_ms)``."""
        self.pop = PopService(ctx, self.delayed)
        self.transactions = TransactionService(ctx)
        self.halves = HalfMessages(ctx, self.transactions.state)
        self.long_polling = LongPolling()
        self.metrics.registry.register(
            ConsumerLagCollector(
                self.metrics.rmq,
                self.store,
                self.topics,
                self.offsets,
                lambda: len(set(self.offsets.groups()) | set(self.consumers.groups)),
                clock,
                self.pop.inflight,
                self.consumers,
            )
        )
        self.metrics.registry.register(ServiceGaugeCollector(
            self.metrics.rmq.base, half_messages=self.transactions.state.pending_by_topic,
            timer=self.timer.gauges, pop=lambda: self.pop.state.revive_gauges(clock.now_ms()),
            store=lambda: store_backlogs(self.store, clock.now_ms())))  # fmt: skip
        # Processors: one per area, each answering the codes routes.py gives it.
        self.trace = TraceService(ctx, lambda: self.address)
        """Message trace records (RMQ_SYS_TRACE_TOPIC), when ``trace_enable``."""
        trace = self.trace
        self.pop.trace = trace
        self.processor = BrokerProcessor(
            ctx, self.delayed, self.halves, self.long_polling, self.timer.stats, trace
        )
        self.auth = ServerAuth.open(  # authn, authz, user/ACL admin codes (docs/security.md)
            enabled=config.auth_enabled,
            auth_file=config.auth_path if config.auth_enabled else config.auth_file,
            audit_file=config.audit_file or config.store.store_path / "audit.jsonl",
            cluster=config.cluster,
            node=f"broker {config.broker_name}/{config.broker_id}",
            controllers=config.auth_controller_addrs,
            admin_transport=config.admin_transport_needed(),
        )
        self.pop_processor = PopProcessor(ctx, self.pop, trace)
        routes = build_routes(
            messages=self.processor,
            consumers=ConsumerProcessor(ctx, self.delayed, inflight=self.pop.inflight, trace=trace),
            group_configs=GroupConfigProcessor(ctx),
            pop=self.pop_processor,
            timers=TimerProcessor(self.timer, trace),
            transactions=TransactionProcessor(ctx, self.transactions, trace),
            runtime_config=RuntimeConfigProcessor(
                lambda: self.config, self.apply_config, self.auth.audit
            ),
        )
        self.dispatcher = Dispatcher(routes, self.metrics, self.auth)
        self.server = RemotingServer(
            self.dispatcher.handle,
            host=config.host,
            port=config.port,
            name="broker",
            on_disconnect=self._on_disconnect,
            eager_codes=EAGER_CODES,
            tls=config.tls_source(),
            tls_mode=config.tls_mode,
            limits=config.limits(),
            quotas=ByteQuotas.of(
                (RequestCode.SEND_MESSAGE, RequestCode.SEND_BATCH_MESSAGE),
                (RequestCode.PULL_MESSAGE, RequestCode.POP_MESSAGE),
                config.produce_quota_bytes_per_s,
                config.fetch_quota_bytes_per_s,
            ),
        )
        self.metrics.registry.register(RefusalCollector("broker", self.server.refusals))
        self.namesrv_client = RemotingClient(
            name="broker-to-namesrv",
            ssl_context=config.outbound_ssl(),
            signer=None
            if config.access_key is None
            else Signer(config.access_key, config.secret_key or ""),
        )
        self.recovery: RecoveryReport | None = None
        self._tasks = TaskSet("broker", logger=log)
        self.register_health = ServiceHealth("namesrv-register")
        self.housekeeping_health = ServiceHealth("housekeeping")
        self.bridge.watch(
            self.pop.reviver.health,
            self.pop.fifo_health,
            self.timer.health,
            self.transactions.health,
            self.offsets.health,
            self.register_health,
            self.housekeeping_health,
        )
        # Scrape-time collectors, registered here so the registry names every family even
        # without the HTTP endpoint (tests read it directly; deploy/ rules are checked on it).
        self.metrics.registry.register(
            HealthCollector(lambda: (self.bridge.failure_counts(), self.bridge.degraded()))
        )
        self._register_task: asyncio.Task[None] | None = None
        self._housekeeping_task: asyncio.Task[None] | None = None
        self._register_now = asyncio.Event()
        self._metrics_server: object | None = None
        self.metrics_port: int | None = None
        self._registered = 0
        self.started = False

    def apply_config(self, new: BrokerConfig) -> None:
        """A runtime change (UPDATE_BROKER_CONFIG, runtime_config.py's allowlist): the new
        config goes to every object that reads those settings at request time."""
        self.config = new
        object.__setattr__(self.ctx, "config", new)  # frozen for services; replaced whole here
        self.processor.config = new
        self.pop_processor.config = new
        self.halves.config = new

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        self.long_polling.bind(asyncio.get_running_loop())
        heap.PAUSES.install()
        heap.tune(self.config.gc_thresholds)
        self.topics.load()
        self.offsets.load()
        self.groups.load()
        self.recovery = await self.bridge.call(self.store.open)
        if self.ha is None:  # a confirm offset kept from a replicated past holds nothing back
            self.store.set_confirm_offset(None)
        for topic in self.topics.topics.values():
            self.apply_retention(topic)
        self.store.add_arrival_listener(self.long_polling.on_arrival)
        self.store.add_flush_listener(self._observe_flush)
        if isinstance(self.ha, HaMaster | HaSlave):
            await self.ha.start()
        if self.metadata is not None:  # replay and tail; the master's part comes with its services
            await self.metadata.start(None)
        if not self.is_slave:  # they append; a slave's log holds only its master's bytes
            await self.start_master_services()
        await self.auth.start(self.namesrv_client)  # users from the controllers, if so configured
        await self.server.start()
        self._start_metrics()
        self.started = True
        host = self.config.advertised_host or self.config.host
        self.store.set_store_host((host, self.server.port))
        # Register once before saying "ready", so routes exist by the time callers look.
        self._registered = await self.register_all()
        self._register_task = self._tasks.spawn(
            self._register_loop(first_wait=True), name="broker-register"
        )
        self._housekeeping_task = self._tasks.spawn(
            self._housekeeping_loop(), name="broker-housekeeping"
        )
        if self.replicas is not None and isinstance(self.ha, RoleSwitch):
            # Controller mode: the HA port is always the broker port + 1 (slaves derive it).
            await self.ha.listen(self.config.host, self.server.port + 1)
            await self.replicas.start(self.address)  # the role follows, asynchronously
        log.info(
            "broker %s/%s ready on %s (store %s, %s)",
            self.config.cluster, self.config.broker_name, self.address,
            self.config.store.store_path, self.config.store.flush_disk_type.value,
        )  # fmt: skip

    async def stop(self) -> None:
        if not self.started:
            return
        self.started = False
        self.consumers.notify_enabled = False  # our own closing connections are no news
        await self.server.stop()
        for task in (self._register_task, self._housekeeping_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._unregister_all()
        await self.auth.stop()
        await self.namesrv_client.close()
        self.long_polling.wake_all()
        if self.replicas is not None:
            await self.replicas.stop()
        await self.stop_master_services()
        if self.metadata is not None:
            await self.metadata.stop()  # logs what is pending, before replication stops
        if self.ha is not None:
            await self.ha.stop()
        try:
            await self.offsets.close()
        except OSError:
            log.exception("cannot write consumer offsets at stop")
        self.bridge.shutdown()
        await asyncio.get_running_loop().run_in_executor(None, self.store.close)
        if self._metrics_server is not None:
            shutdown = getattr(self._metrics_server, "shutdown", None)
            if shutdown is not None:
                await asyncio.get_running_loop().run_in_executor(None, shutdown)
            close = getattr(self._metrics_server, "server_close", None)
            if close is not None:
                close()  # shutdown() stops serving; this closes the listening socket
        log.info("broker %s stopped", self.config.broker_name)

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def is_slave(self) -> bool:
        """A replicating slave (in controller mode: not master now): it runs no service that
        appends (Pop, transactions, timers)."""
        if isinstance(self.ha, RoleSwitch):
            return not self.ha.is_master
        return isinstance(self.ha, HaSlave)

    @property
    def route_broker_id(self) -> int | None:
        """The broker id registered with the NameServers: 0 for the master. In controller mode
        0 only while master with a live lease, else the controller's id (None: not known
        yet, so not registered)."""
        if isinstance(self.ha, RoleSwitch) and self.replicas is not None:
            if self.ha.broker_id < 0:
                return None
            return 0 if self.ha.is_master and self.replicas.lease_ok() else self.ha.broker_id
        return self.config.broker_id

    async def start_master_services(self) -> None:
        """Start the services that append (on start, or when made master)."""
        if self._master_services:
            return
        if self._promotions:
            # Promoted again in this process: the timer index still holds what it loaded
            # before the demotion (some of it maybe cut since by the slave's truncation), and
            # reloading on top of it would fire those timers twice.
            self.timer.index = TimerIndex()
        self._promotions += 1
        if self.metadata is not None:
            # First: apply every replicated record (the services below read the replicated
            # pop.secret, pop_revive.json, ...), log a snapshot at this epoch, then write.
            await self.metadata.become_master(self._master_epoch())
        try:
            await self.pop.start()  # restores the Pop state before anyone can pop
            await self.transactions.start()  # replays half messages before anyone can decide
            await self.timer.start()  # rebuilds pending timers; due-while-down ones fire at once
            await self.trace.start()  # only a master records traces
        except BaseException:
            if self.metadata is not None:
                await self.metadata.become_slave()  # not master after all: stop writing
            raise
        self._master_services = True

    async def stop_master_services(self) -> None:
        if not self._master_services:
            return
        self._master_services = False
        await self.trace.stop()  # writes the records still buffered
        await self.pop.stop()  # writes the revive checkpoint after persisting offsets
        await self.transactions.stop()
        await self.timer.stop()  # after the services that may schedule timers
        if self.metadata is not None and self.started:
            # Last (the services' final checkpoints are logged first); a demotion only: at
            # shutdown stop() has cleared `started` and metadata.stop() logs what is pending.
            await self.metadata.become_slave()

    def _master_epoch(self) -> int:
        """The epoch this broker is master in (a RoleSwitch's is valid while its services start)."""
        if isinstance(self.ha, HaMaster):
            return self.ha.epoch
        if isinstance(self.ha, RoleSwitch):
            return self.ha.master_epoch
        raise RuntimeError("metadata log without replication")

    def role_changed(self) -> None:
        """Controller mode: the role changed; register with the NameServers now."""
        self._register_now.set()

    @property
    def address(self) -> str:
        host = self.config.advertised_host or self.config.host
        return f"{host}:{self.server.port}"

    def _start_metrics(self) -> None:
        if self.config.metrics_port is None:
            return
        from prometheus_client import start_http_server

        m = self.metrics
        m.dispatch_lag.set_function(lambda: self.store.stats()["dispatch_lag_bytes"])
        m.disk_ratio.set_function(lambda: self.store.retention.disk_ratio)
        m.disk_bytes.set_function(lambda: self.store.retention.disk_used_bytes)
        m.topics.set_function(lambda: len(self.topics.topics))
        m.queues.set_function(lambda: len(self.store.queues.queues))
        m.connections.set_function(lambda: len(self.server.connections))
        m.fsyncs.set_function(lambda: self.store.flusher.fsync_count)
        m.held_pulls.set_function(lambda: self.long_polling.held)
        m.consumer_groups.set_function(lambda: len(self.consumers.groups))
        m.consumers.set_function(self.consumers.member_count)
        m.queue_locks.set_function(lambda: len(self.locks))
        if self.ha is not None:
            m.registry.register(HaCollector(lambda: self.ha, self.replicas))
        if self.store.tier is not None:
            m.registry.register(TierCollector(self.store.tier.stats))
        server, _thread = start_http_server(
            self.config.metrics_port,
            addr=self.config.host,
            registry=m.registry,
            **self.config.metrics_tls_options(),
        )
        self._metrics_server = server
        self.metrics_port = server.server_port

    # ---------------------------------------------------------------- topics

    def apply_retention(self, config: TopicConfig) -> None:
        if self.store.tier is not None:
            self.store.tier.set_topic_ttl(config.topic_name, config.tier_retention_ms)
        if config.retention_ms is None and config.retention_bytes is None:
            self.store.set_topic_retention(config.topic_name, None)
        else:
            self.store.set_topic_retention(
                config.topic_name, TopicRetention(config.retention_ms, config.retention_bytes)
            )

    def _observe_flush(self, _flushed: int, error: BaseException | None) -> None:
        """On the flush thread, after each fsync: feed the flush-latency histogram."""
        if error is None:
            self.metrics.flush_latency.observe(self.store.flusher.last_fsync_s)

    # ---------------------------------------------------------------- consumers

    def _on_disconnect(self, conn: Connection) -> None:
        """A connection closed: its consumers leave their groups (and free their locks)."""
        self.consumers.connection_closed(conn)

    async def _housekeeping_loop(self) -> None:
        """Expire silent consumers and lapsed locks every few seconds (a quarter of the expiry,
        at most 5 s); write offsets changed only in memory every ``offset_persist_interval_s``."""
        scan_s = max(0.05, min(5.0, self.config.consumer_expiry_s / 4))
        persist_s = max(0.05, self.config.offset_persist_interval_s)
        next_persist = time.monotonic() + persist_s
        pause = 0.0
        while self.started:
            await asyncio.sleep(max(pause, min(scan_s, next_persist - time.monotonic())))
            pause = 0.0
            try:
                self.consumers.scan_expired()
                self.locks.purge_expired()
                heap.settle_if_loaded()
                if time.monotonic() >= next_persist:
                    next_persist = time.monotonic() + persist_s
                    await self.offsets.persist_if_changed()
            except Exception as exc:  # noqa: BLE001 - supervised, retried
                pause = self.housekeeping_health.failed(exc)
            else:
                self.housekeeping_health.ok()

    def topics_changed(self) -> None:
        """Register again soon so NameServers learn the change without waiting 30 s."""
        self._register_now.set()
        heap.note_bulk_load()

    # ---------------------------------------------------------------- NameServers

    def _identity(
        self, cls: type[RegisterBrokerRequest] = RegisterBrokerRequest
    ) -> RegisterBrokerRequest:
        """This broker's REGISTER_BROKER header, or ``cls``'s (UNREGISTER_BROKER: the same fields)."""
        return cls(
            cluster=self.config.cluster,
            broker_name=self.config.broker_name,
            broker_id=self.route_broker_id or 0,
            broker_addr=self.address,
        )

    async def register_all(self) -> int:
        """Register with every NameServer at once; returns how many accepted."""
        if self.route_broker_id is None:
            return 0  # controller mode, id not known yet
        body = encode_body(
            RegisterBrokerBody(
                topic_configs=dict(self.topics.topics), data_version=self.topics.data_version
            )
        )

        async def one(addr: str) -> str | None:
            frame = self._identity().frame(body)
            try:
                resp = await self.namesrv_client.invoke(addr, frame, timeout=3.0)
            except MQError as exc:
                return f"{addr}: {exc}"
            if resp.code != ResponseCode.SUCCESS:
                return f"{addr} refused: {resp.remark}"
            return None

        errors = [
            e for e in await asyncio.gather(*(one(a) for a in self.config.namesrv_addrs)) if e
        ]
        # Logged once per outage (the heartbeat retries every second while one is missing).
        if errors:
            self.register_health.failed(RegistrationError("; ".join(errors)))
        else:
            self.register_health.ok()
        return len(self.config.namesrv_addrs) - len(errors)

    async def _register_loop(self, first_wait: bool = False) -> None:
        # asyncio.timeout rather than wait_for: on 3.11 wait_for can swallow a cancellation
        # that races with the event being set, and stop() would then wait forever.
        while self.started:
            started = time.monotonic()
            interval = self.config.register_interval_s
            if first_wait:
                first_wait = False
            else:
                try:
                    self._registered = await self.register_all()
                except Exception as exc:  # noqa: BLE001 - supervised, retried
                    self._registered = 0
                    interval = self.register_health.failed(exc)
                self._register_now.clear()
            if self._registered < len(self.config.namesrv_addrs):
                interval = min(interval, 1.0)  # a NameServer is missing: try again soon
            remaining = interval - (time.monotonic() - started)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.05, remaining)):
                    await self._register_now.wait()

    async def _unregister_all(self) -> None:
        if self.route_broker_id is None:
            return

        async def one(addr: str) -> None:
            frame = self._identity(UnregisterBrokerRequest).frame()
            try:
                await self.namesrv_client.invoke(addr, frame, timeout=2.0)
            except MQError as exc:
                log.info("unregister from %s failed: %s", addr, exc)

        await asyncio.gather(*(one(a) for a in self.config.namesrv_addrs))

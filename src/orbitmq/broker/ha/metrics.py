"""The broker's replication metrics, read at scrape time (docs/ha.md, "Metrics"): a collector
over whatever side runs now (static master or slave, or a controller-mode RoleSwitch), since
the side is rebuilt on every role switch and counters kept on it would restart at 0.

    orbitmq_ha_role                      1 master, 0 slave, -1 no role (controller mode)
    orbitmq_ha_master_epoch              the epoch of the master this broker is or follows
    orbitmq_ha_sync_state_set_size       master: in-sync replicas, the master counted
    orbitmq_ha_replica_lag_bytes{replica}  master: bytes each connected slave is behind
    orbitmq_ha_replica_lag_seconds{replica} master: how long it has not been caught up
    orbitmq_ha_role_switches_total       controller mode: role changes of this process
    orbitmq_ha_fenced_total              sends refused or not acknowledged because this broker
                                         was not (or no more) master, plus HA links dropped for
                                         a stale epoch
    orbitmq_ha_lease_remaining_seconds   controller mode: master lease left (0: lapsed)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from orbitmq.broker.ha.master import HaMaster
from orbitmq.broker.ha.replicas import ReplicasManager
from orbitmq.broker.ha.roles import RoleSwitch
from orbitmq.broker.ha.slave import HaSlave


class HaCollector(Collector):
    def __init__(
        self,
        side: Callable[[], HaMaster | HaSlave | RoleSwitch | None],
        replicas: ReplicasManager | None = None,
    ) -> None:
        self.side = side
        self.replicas = replicas
        self._fenced_before = 0
        """Fencings counted on sides already replaced (a switch drops their counters)."""
        self._last: HaMaster | HaSlave | None = None

    def _role(self) -> tuple[HaMaster | HaSlave | None, RoleSwitch | None]:
        side = self.side()
        if isinstance(side, RoleSwitch):
            return side.role, side
        return side, None

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        role, switch = self._role()
        if role is not self._last:
            if self._last is not None:
                self._fenced_before += self._last.fenced_count
            self._last = role
        value = 1 if isinstance(role, HaMaster) else 0 if isinstance(role, HaSlave) else -1
        yield GaugeMetricFamily("orbitmq_ha_role", "1 master, 0 slave, -1 no role", value=value)
        epoch = role.epoch if isinstance(role, HaMaster) else 0
        if isinstance(role, HaSlave):
            epoch = max(role.expected_epoch, role.master_epoch)
        yield GaugeMetricFamily(
            "orbitmq_ha_master_epoch", "Epoch of the master this broker is or follows", value=epoch
        )
        lag_b = GaugeMetricFamily(
            "orbitmq_ha_replica_lag_bytes", "Master: bytes a slave is behind", labels=["replica"]
        )
        lag_s = GaugeMetricFamily(
            "orbitmq_ha_replica_lag_seconds",
            "Master: how long a slave has not been caught up",
            labels=["replica"],
        )
        if isinstance(role, HaMaster):
            yield GaugeMetricFamily(
                "orbitmq_ha_sync_state_set_size",
                "Master: replicas in sync, the master counted",
                value=role.in_sync_replicas,
            )
            for bid, _acked, lag_bytes, lag_ms in role.replica_lag():
                lag_b.add_metric([str(bid)], lag_bytes)
                lag_s.add_metric([str(bid)], lag_ms / 1000)
        yield lag_b
        yield lag_s
        fenced = self._fenced_before + (role.fenced_count if role is not None else 0)
        if switch is not None:
            fenced += switch.fenced
            yield CounterMetricFamily(
                "orbitmq_ha_role_switches", "Role changes of this broker", value=switch.switches
            )
        yield CounterMetricFamily(
            "orbitmq_ha_fenced", "Sends or links refused for a stale role or epoch", value=fenced
        )
        if self.replicas is not None:
            left = max(0.0, self.replicas.lease_until - self.replicas.clock.monotonic())
            yield GaugeMetricFamily(
                "orbitmq_ha_lease_remaining_seconds", "Master lease left", value=left
            )

"""NamesrvConfig: the NameServer's settings."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class NamesrvConfig:
    host: str = "127.0.0.1"
    """Address to listen on (tests and `make up` use loopback)."""
    port: int = 9876
    """RocketMQ's NameServer port; 0 picks a free one."""
    broker_channel_expired_s: float = 120.0
    """A broker that has not registered for this long is removed from the routes."""
    scan_not_active_broker_interval_s: float = 5.0
    """How often expired brokers are looked for."""
    metrics_port: int | None = None
    """Prometheus endpoint port (None: off; 0: a free port)."""

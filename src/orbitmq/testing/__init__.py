"""Test support shipped with OrbitMQ (as nats.py ships its server runner): what a test of an
application, or of OrbitMQ itself, needs to run real servers cheaply.

- :func:`small_store_config` / :func:`small_broker_config`: a store with small files. Store
  files are preallocated: at RocketMQ's sizes one broker takes 1 GiB for its first CommitLog
  segment, 400 MiB for its first IndexFile and 6 MiB per queue. Same code paths, small numbers.
- :func:`run_namesrv` / :func:`run_broker`: in-process servers on free ports (temporary folders
  unless given one) for the body of an ``async with``.
- :func:`settings_toml`: the TOML a server process started as
  ``python -m orbitmq broker --config FILE`` reads (how the process tests start theirs).

An edge of the layering: it imports the services, no service imports it.
"""

from orbitmq.testing.config import (
    SMALL_STORE,
    settings_toml,
    small_broker_config,
    small_store_config,
)
from orbitmq.testing.servers import run_broker, run_namesrv

__all__ = [
    "SMALL_STORE",
    "run_broker",
    "run_namesrv",
    "settings_toml",
    "small_broker_config",
    "small_store_config",
]

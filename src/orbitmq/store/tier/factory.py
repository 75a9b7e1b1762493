"""The tier a StoreConfig asks for: None (off), a directory or an S3 backend under a service."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orbitmq.common.errors import ConfigError
from orbitmq.store.commit_log import CommitLog
from orbitmq.store.config import StoreConfig
from orbitmq.store.consume_queue import ConsumeQueueTable
from orbitmq.store.dispatch import Dispatcher
from orbitmq.store.tier.backend import DirectoryBackend, PrefixedBackend, TierBackend
from orbitmq.store.tier.service import TierService


def make_backend(config: StoreConfig) -> TierBackend | None:
    backend = _backend(config)
    if backend is None or not config.tier_prefix:
        return backend
    return PrefixedBackend(backend, config.tier_prefix)


def with_broker_prefix(
    config: StoreConfig, cluster: str, broker: str, broker_id: int
) -> StoreConfig:
    """The store config a broker opens: an unset ``tier_prefix`` becomes ``<cluster>/<broker>``
    (``-<id>`` for a slave, whose copy must not collide with its master's)."""
    if config.tier_backend == "off" or config.tier_prefix:
        return config
    prefix = f"{cluster}/{broker}" + (f"-{broker_id}" if broker_id else "")
    return dataclasses.replace(config, tier_prefix=prefix)


def _backend(config: StoreConfig) -> TierBackend | None:
    kind = config.tier_backend
    if kind == "off":
        return None
    if kind == "directory":
        if not config.tier_path:
            raise ConfigError("store.tier_path must name a folder when tier_backend = directory")
        path = Path(config.tier_path)
        if path.resolve() == config.store_path.resolve():
            raise ConfigError("store.tier_path must not be the store's own folder")
        return DirectoryBackend(path)
    from orbitmq.store.tier.s3 import S3Backend  # optional extra: orbitmq[tier-s3]

    return S3Backend.from_config(config)


def build_tier(
    config: StoreConfig,
    commit_log: CommitLog,
    queues: ConsumeQueueTable,
    dispatcher: Dispatcher,
    clock: Callable[[], int],
) -> TierService | None:
    """The store's tier (docs/tiered-storage.md), or None when ``tier_backend`` is off."""
    backend = make_backend(config)
    if backend is None:
        return None
    tier = TierService(config, backend, commit_log, queues, clock)
    tier.dispatcher = dispatcher
    return tier


def attach_tier(store: Any) -> TierService | None:
    """The tier of a MessageStore (``store``; typed loosely, as the store imports this module),
    wired to the parts it reads and gates: retention asks it before deleting a segment, and a
    store that encrypts at rest hands it the sealer's ``plain`` (a sealed record needs its
    segment's key, which goes with the segment)."""
    tier = build_tier(store.config, store.commit_log, store.queues, store.dispatcher, store.clock)
    store.retention.tier = tier
    sealer = getattr(store, "sealer", None)
    if tier is not None and sealer is not None:
        tier.plain = sealer.plain
    return tier

"""SubscriptionGroupManager: the broker's consumer-group configs, persisted in
``<store>/config/subscriptionGroup.json``.

A group nobody configured gets the defaults (:meth:`SubscriptionGroupManager.get`), so send-back
and revive never fail for want of a config and the file only holds groups someone changed.
Every change is validated, then written atomically (temp file, fsync, rename) before it is
answered, like the topic table; a damaged file stops the broker at start rather than silently
falling back to defaults (a retry policy quietly lost would send messages to the DLQ early).
Every change is also handed to ``journal`` (the metadata log, after the save);
:meth:`SubscriptionGroupManager.replicate` applies a master's changes without it.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import msgspec

from orbitmq.broker.metadata.records import GroupDel, GroupPut, Journal
from orbitmq.common.errors import ConfigError, MessageIllegalError
from orbitmq.common.files import write_atomically
from orbitmq.protocol.group_config import SubscriptionGroupConfig, validate_group_config

log = logging.getLogger(__name__)

MAX_GROUP_CONFIGS = 100_000
"""Configured groups a broker keeps at most (a client looping over fresh names must not grow
the file without bound)."""


class _GroupsFile(msgspec.Struct):
    data_version: int
    groups: list[SubscriptionGroupConfig]


class SubscriptionGroupManager:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.groups: dict[str, SubscriptionGroupConfig] = {}
        self.data_version = 0
        self._lock = threading.Lock()
        self.journal: Journal | None = None

    def load(self) -> None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        try:
            table = msgspec.json.decode(raw, type=_GroupsFile)
            for config in table.groups:
                validate_group_config(config)
        except (msgspec.DecodeError, msgspec.ValidationError, MessageIllegalError) as exc:
            raise ConfigError(f"{self.path} is damaged: {exc}") from exc
        self.data_version = table.data_version
        self.groups = {g.group_name: g for g in table.groups}
        log.info("%d consumer group configs loaded", len(self.groups))

    def _save_locked(self) -> None:
        self.data_version += 1
        table = _GroupsFile(
            self.data_version, sorted(self.groups.values(), key=lambda g: g.group_name)
        )
        write_atomically(self.path, msgspec.json.format(msgspec.json.encode(table)))

    def get(self, group: str) -> SubscriptionGroupConfig:
        """The group's config, or the defaults when it was never configured."""
        config = self.groups.get(group)
        return config if config is not None else SubscriptionGroupConfig.default(group)

    def find(self, group: str) -> SubscriptionGroupConfig | None:
        return self.groups.get(group)

    def all(self) -> list[SubscriptionGroupConfig]:
        return sorted(self.groups.values(), key=lambda g: g.group_name)

    def upsert(self, config: SubscriptionGroupConfig) -> SubscriptionGroupConfig:
        """Validate and store (blocking: the file is fsynced; call it off the event loop)."""
        validate_group_config(config)
        with self._lock:
            if config.group_name not in self.groups and len(self.groups) >= MAX_GROUP_CONFIGS:
                raise MessageIllegalError(
                    f"{len(self.groups)} groups are configured, the limit is {MAX_GROUP_CONFIGS}"
                )
            previous = self.groups.get(config.group_name)
            self.groups[config.group_name] = config
            try:
                self._save_locked()
            except BaseException:
                if previous is None:
                    del self.groups[config.group_name]
                else:
                    self.groups[config.group_name] = previous
                raise
        log.info("consumer group config %s: %s", config.group_name, config)
        if self.journal is not None:
            self.journal.record(GroupPut(config=config))
        return config

    def delete(self, group: str) -> bool:
        """Forget the group's config (it is back to the defaults); False if it had none."""
        with self._lock:
            previous = self.groups.pop(group, None)
            if previous is None:
                return False
            try:
                self._save_locked()
            except BaseException:
                self.groups[group] = previous
                raise
        log.info("consumer group config %s deleted", group)
        if self.journal is not None:
            self.journal.record(GroupDel(group=group))
        return True

    def replicate(self, ops: list[tuple[str, SubscriptionGroupConfig | None]]) -> None:
        """Apply a master's changes in order (None: deleted) and save once; not journaled and
        not limited by MAX_GROUP_CONFIGS (the master enforced it). Configs were validated."""
        if not ops:
            return
        with self._lock:
            for name, config in ops:
                if config is None:
                    self.groups.pop(name, None)
                else:
                    self.groups[name] = config
            self._save_locked()

"""TopicConfigManager: the broker's table of topics, persisted in ``<store>/config/topics.json``.

Every change is written atomically (temp file, fsync, rename, fsync the folder) before it is
acknowledged, so a crash never leaves a half-written table. ``data_version`` increases on every
change; the broker sends it with its registration so NameServers can tell tables apart.

Every change made here is also handed to ``journal`` (a master logs it in the metadata log,
``orbitmq.broker.metadata``, after the file is saved); :meth:`TopicConfigManager.replicate`
is how a replica applies its master's changes, without the journal.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import msgspec

from orbitmq.broker.metadata.records import Journal, TopicDel, TopicPut
from orbitmq.common.errors import ConfigError, MessageIllegalError
from orbitmq.common.files import write_atomically
from orbitmq.common.validation import validate_topic
from orbitmq.protocol.bodies import MESSAGE_TYPES, PERM_READ, PERM_WRITE, TopicConfig

log = logging.getLogger(__name__)
MAX_QUEUE_NUMS = 1024


class _TopicsFile(msgspec.Struct):
    data_version: int
    topics: list[TopicConfig]


def validate_topic_config(config: TopicConfig) -> None:
    validate_topic(config.topic_name)
    for name in ("read_queue_nums", "write_queue_nums"):
        value = getattr(config, name)
        if not 1 <= value <= MAX_QUEUE_NUMS:
            raise MessageIllegalError(f"{name} must be 1..{MAX_QUEUE_NUMS}, not {value}")
    if config.perm & ~(PERM_READ | PERM_WRITE | 1) or config.perm < 0:
        raise MessageIllegalError(f"perm {config.perm} has unknown bits")
    if config.message_type not in MESSAGE_TYPES:
        raise MessageIllegalError(f"message_type must be one of {', '.join(MESSAGE_TYPES)}")
    for name in ("retention_ms", "retention_bytes"):
        value = getattr(config, name)
        if value is not None and value <= 0:
            raise MessageIllegalError(f"{name} must be positive")


class TopicConfigManager:
    def __init__(self, path: Path, default_queue_nums: int = 8) -> None:
        self.path = path
        self.default_queue_nums = default_queue_nums
        self.topics: dict[str, TopicConfig] = {}
        self.data_version = 0
        self._lock = threading.Lock()
        self.journal: Journal | None = None

    def load(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        try:
            table = msgspec.json.decode(raw, type=_TopicsFile)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ConfigError(f"{self.path} is damaged: {exc}") from exc
        self.data_version = table.data_version
        self.topics = {t.topic_name: t for t in table.topics}

    def _save_locked(self) -> None:
        self.data_version += 1
        table = _TopicsFile(
            self.data_version, sorted(self.topics.values(), key=lambda t: t.topic_name)
        )
        write_atomically(self.path, msgspec.json.format(msgspec.json.encode(table)))

    def get(self, topic: str) -> TopicConfig | None:
        return self.topics.get(topic)

    def upsert(self, config: TopicConfig) -> TopicConfig:
        validate_topic_config(config)
        with self._lock:
            self.topics[config.topic_name] = config
            self._save_locked()
        log.info("topic %s: %s", config.topic_name, config)
        if self.journal is not None:
            self.journal.record(TopicPut(config=config))
        return config

    def auto_create(self, topic: str) -> TopicConfig:
        with self._lock:
            existing = self.topics.get(topic)
            if existing is not None:
                return existing
        return self.upsert(
            TopicConfig(
                topic_name=topic,
                read_queue_nums=self.default_queue_nums,
                write_queue_nums=self.default_queue_nums,
            )
        )

    def delete(self, topic: str) -> bool:
        with self._lock:
            if self.topics.pop(topic, None) is None:
                return False
            self._save_locked()
        if self.journal is not None:
            self.journal.record(TopicDel(topic=topic))
        return True

    def replicate(self, ops: list[tuple[str, TopicConfig | None]]) -> None:
        """Apply a master's changes in order (a config, or None: deleted) and save once; not
        journaled. Configs were validated by the caller."""
        if not ops:
            return
        with self._lock:
            for name, config in ops:
                if config is None:
                    self.topics.pop(name, None)
                else:
                    self.topics[name] = config
            self._save_locked()

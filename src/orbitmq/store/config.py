"""StoreConfig: every knob of the message store, typed, with its default and why.

Names follow RocketMQ's MessageStoreConfig in snake_case where RocketMQ has the setting;
OrbitMQ's own settings say so in their doc. Each is declared with
:func:`orbitmq.common.config.setting` (doc and range check on the field); the checks across
fields are in ``__post_init__``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from orbitmq.common.config import at_least, between, check_settings, one_of, setting
from orbitmq.common.errors import ConfigError

GiB = 1024**3
MiB = 1024**2
KiB = 1024


class FlushDiskType(enum.Enum):
    ASYNC_FLUSH = "ASYNC_FLUSH"
    """Acknowledge once the data is in the page cache; a background thread fsyncs."""
    SYNC_FLUSH = "SYNC_FLUSH"
    """Acknowledge only after fsync. Concurrent appenders share one fsync (group commit)."""


@dataclass(frozen=True, slots=True)
class StoreConfig:
    store_path: Path = setting(Path("orbitmq-data/store"), "Root folder of the store.")
    mapped_file_size_commit_log: int = setting(
        1 * GiB, "Size of one CommitLog segment file (RocketMQ: 1 GiB).", at_least(64 * KiB)
    )
    consume_queue_entries_per_file: int = setting(
        300_000, "ConsumeQueue entries per file; 20 bytes each (RocketMQ: 300,000).", at_least(1)
    )
    max_open_consume_queue_files: int = setting(
        4096,
        "OrbitMQ: ConsumeQueue files kept open (an fd and a mapping each); the least recently "
        "used are closed beyond this and reopen on use. Keeps 10,000 topics x 8 queues within "
        "ulimit -n and vm.max_map_count.",
        at_least(16),
    )
    max_hash_slot_num: int = setting(
        5_000_000, "Hash slots per IndexFile (RocketMQ: 5,000,000).", at_least(1)
    )
    max_index_num: int = setting(
        20_000_000, "Entries per IndexFile (RocketMQ: 20,000,000).", at_least(1)
    )
    message_index_enable: bool = setting(True, "Index KEYS and the unique message id.")
    flush_disk_type: FlushDiskType = setting(
        FlushDiskType.ASYNC_FLUSH, "ASYNC_FLUSH or SYNC_FLUSH."
    )
    flush_interval_commit_log_ms: int = setting(
        500, "ASYNC_FLUSH: how often the flusher looks.", at_least(1)
    )
    flush_commit_log_least_pages: int = setting(
        4, "ASYNC_FLUSH: fsync only once this many 4 KiB pages are dirty...", at_least(0)
    )
    flush_commit_log_thorough_interval_ms: int = setting(
        10_000, "...or once this long has passed since the last fsync.", at_least(0)
    )
    sync_flush_timeout_ms: int = setting(
        5_000, "SYNC_FLUSH: FLUSH_DISK_TIMEOUT after this long.", at_least(1)
    )
    flush_interval_consume_queue_ms: int = setting(
        1_000,
        "How often ConsumeQueues and IndexFiles are fsynced and the checkpoint written. "
        "It bounds the tail that recovery after a crash re-scans.",
        at_least(1),
    )
    max_message_size: int = setting(
        4 * MiB, "Largest body accepted (RocketMQ: 4 MiB).", at_least(1)
    )
    max_properties_size: int = setting(
        32 * KiB, "Largest encoded properties accepted (OrbitMQ).", at_least(1)
    )
    file_reserved_time_hours: float = setting(
        72.0, "Delete CommitLog segments older than this.", at_least(0)
    )
    delete_when: str = setting("04", "Hours of the day (';'-separated) when expired segments go.")
    disk_max_used_space_ratio: int = setting(
        75,
        "Above this disk use (%), expired segments are deleted at once, any hour.",
        between(1, 100),
    )
    disk_space_clean_forcibly_ratio: int = setting(
        85, "Above this disk use (%), the oldest segments go even if not expired.", between(1, 100)
    )
    disk_space_warning_level_ratio: int = setting(
        90,
        "Above this disk use (%), appends fail with DiskFullError until space is freed.",
        between(1, 100),
    )
    clean_resource_interval_ms: int = setting(10_000, "How often retention runs.", at_least(1))
    delete_commit_log_files_max_per_run: int = setting(
        10, "Segments deleted at most per run.", at_least(1)
    )
    # Tiered storage (docs/tiered-storage.md); orbitmq.store.tier.settings checks them together.
    tier_backend: str = setting(
        "off", "OrbitMQ: where old data also goes: off, directory or s3.",
        one_of("off", "directory", "s3"),
    )  # fmt: skip
    tier_path: str = setting("", "Directory backend: the tier's root folder (another disk).")
    tier_prefix: str = setting(
        "",
        "Folder of this store's objects in the tier; empty: a broker uses <cluster>/<broker "
        "name> (a slave adds -<broker id>), so brokers can share one bucket or directory.",
    )
    tier_upload_interval_ms: int = setting(
        1_000, "How often the tier thread uploads flushed data.", at_least(10)
    )
    tier_chunk_max_messages: int = setting(
        10_000, "Records per uploaded chunk at most.", at_least(1)
    )
    tier_chunk_max_bytes: int = setting(8 * MiB, "Bytes per uploaded chunk (about).", at_least(1))
    tier_local_retention_ms: int = setting(
        -1,
        "With a tier: a CommitLog segment the tier covers is deleted once older than this, at "
        "any hour (-1: file_reserved_time_hours, as without a tier).",
        at_least(-1),
    )
    tier_retention_ms: int = setting(
        0, "Total retention: tier chunks older than this are deleted (0: kept).", at_least(0)
    )
    tier_allow_unuploaded_delete: bool = setting(
        False,
        "Let retention delete a segment the tier does not cover yet; the lost offsets are "
        "counted (tier gaps), never silent. Off: the segment waits for its upload.",
    )
    tier_restore: bool = setting(
        False,
        "At start, continue every queue the tier's manifests know at its watermark (a lost or "
        "wiped store rebuilt from the bucket; waits for the tier). orbitmq broker --tier-restore.",
    )
    tier_cache_bytes: int = setting(64 * MiB, "Cold reads: fetched chunks kept.", at_least(0))
    tier_s3_endpoint: str = setting(
        "",
        "S3 backend: endpoint URL, https://host[:port] (TLS, the certificate verified) or "
        "http://host[:port] (plain, needs tier_s3_allow_http). Empty: AWS over https.",
    )
    tier_s3_bucket: str = setting("", "S3 backend: bucket.")
    tier_s3_prefix: str = setting("", "S3 backend: key prefix inside the bucket.")
    tier_s3_region: str = setting("us-east-1", "S3 backend: region.")
    tier_s3_access_key: str = setting("", "S3 backend: access key id (empty: environment).")
    tier_s3_secret_key: str = setting("", "S3 backend: secret access key.", secret=True)
    tier_s3_allow_http: bool = setting(
        False,
        "S3 backend: accept an http:// endpoint (no TLS: keys and data in clear). An https:// "
        "endpoint never falls back to plain HTTP, whatever this says.",
    )
    tier_s3_ca_file: str = setting(
        "",
        "S3 backend: PEM file of CA certificates trusted for the https endpoint in addition to "
        "the system's roots (a private CA); read at start. Empty: the system's roots only.",
    )
    tier_s3_allow_invalid_certificates: bool = setting(
        False,
        "S3 backend: do NOT verify the https endpoint's certificate (any certificate for any "
        "name is accepted, so anyone on the path can read and change the tier). Tests only; "
        "use tier_s3_ca_file for a private CA.",
    )
    tier_s3_max_retries: int = setting(
        10,
        "S3 backend: retries of one failed request (connection errors, 5xx) before the call "
        "fails, with obstore's backoff (0.1 s doubling to 15 s, 3 min at most); the tier "
        "thread then backs off and retries on its own.",
        at_least(0),
    )
    check_crc_on_read: bool = setting(
        True,
        "OrbitMQ: verify the CRC of records written before this start when reading them, so a "
        "record damaged at rest is never served. Records this process wrote are trusted.",
    )
    store_host: tuple[str, int] = setting(("127.0.0.1", 10911), "Written into each record.")
    encrypt_at_rest: bool = setting(
        False,
        "OrbitMQ: encrypt message bodies and properties in the CommitLog with AES-256-GCM "
        "(per-segment keys wrapped by the master key; docs/security.md). Records written "
        "before stay readable.",
    )
    encryption_key_file: str | None = setting(
        None,
        "File holding the 32-byte master key (raw, hex or base64; mode 0600). None: the "
        "ORBITMQ_MASTER_KEY environment variable.",
    )
    encryption_retired_key_files: tuple[str, ...] = setting(
        (),
        "Earlier master keys, to read segments whose keys they wrapped (master key rotation).",
    )
    encryption_cache_bytes: int = setting(
        32 * MiB,
        "Encryption at rest: opened (decrypted) append groups kept for hot reads and the "
        "dispatcher. 0: every read decrypts.",
        at_least(0),
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "store_path", Path(self.store_path))
        if isinstance(self.flush_disk_type, str):
            object.__setattr__(self, "flush_disk_type", FlushDiskType(self.flush_disk_type))
        check_settings(self, "store")
        if self.mapped_file_size_commit_log < self.max_message_size + 64 * KiB:
            raise ConfigError("mapped_file_size_commit_log must exceed max_message_size + 64 KiB")
        if not (
            0
            < self.disk_max_used_space_ratio
            <= self.disk_space_clean_forcibly_ratio
            <= self.disk_space_warning_level_ratio
            <= 100
        ):
            raise ConfigError("disk ratios must satisfy 0 < max_used <= forcibly <= warning <= 100")
        self.delete_hours()  # validates

    def delete_hours(self) -> frozenset[int]:
        try:
            hours = frozenset(int(h) for h in self.delete_when.split(";") if h.strip())
        except ValueError as exc:
            raise ConfigError(f"delete_when {self.delete_when!r}: {exc}") from exc
        if any(not 0 <= h <= 23 for h in hours):
            raise ConfigError("delete_when hours must be 0..23")
        return hours

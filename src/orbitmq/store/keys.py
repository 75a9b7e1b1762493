"""Keys for encryption at rest: the master key, per-segment data keys and the writer epoch.

Files, under ``<store_path>/crypto/`` (all integers big-endian)::

    <segment name>.dek   one per CommitLog segment, 84 bytes, written once and fsynced (with
                         its directory) before the segment's first record:
        0  4  magic "ODEK"           4  2  version (1)       6  2  algorithm (1: AES-256-GCM)
        8  8  KEK id                16 12  wrap nonce       28 48  wrapped DEK (32 + 16 tag)
       76  4  CRC32C of [0, 76)     80  4  reserved (0)
    epoch                16 bytes: "OWEP", u32 epoch, u32 reserved, CRC32C of [0, 12);
                         replaced atomically (tmp, fsync, rename, fsync dir)

Contract:

- The master key (KEK) is 32 bytes from a file (raw, 64 hex digits or base64; the file must not
  be readable by group or others) or from the environment variable ``ORBITMQ_MASTER_KEY``. It
  is never stored, logged or accepted remotely; its id is the first 8 bytes of
  SHA-256("orbitmq-kek" || KEK), which names the key without revealing it.
- Each segment gets a random 32-byte DEK, wrapped with AES-256-GCM under the KEK with the
  segment's name and the KEK id as associated data, so a DEK file cannot be moved to another
  segment. Deleting a segment deletes its DEK (crypto-shredding).
- KEK rotation: ``retired`` master keys still unwrap the DEKs they wrapped; new segments use
  the current one, and :meth:`DekStore.rewrap_all` rewraps old DEKs under it.
- The writer epoch is bumped and fsynced every time the store opens for writing, so a record
  rewritten at an offset after a crash truncation gets a nonce (epoch || offset) never used
  before under that segment's DEK.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import logging
import os
import stat
import struct
from pathlib import Path

import crc32c
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from orbitmq.common.errors import ConfigError, StoreError
from orbitmq.store.layout import fsync_dir

log = logging.getLogger(__name__)

MASTER_KEY_ENV = "ORBITMQ_MASTER_KEY"
CRYPTO_DIR = "crypto"
ALG_AES_256_GCM = 1
_DEK = struct.Struct(">4sHH8s12s48sI4x")
_DEK_MAGIC = b"ODEK"
_EPOCH = struct.Struct(">4sII")
_EPOCH_MAGIC = b"OWEP"


def parse_master_key(raw: bytes, where: str) -> bytes:
    text = raw.strip()
    if len(raw) == 32:
        return raw
    for decode in (binascii.unhexlify, base64.b64decode):
        try:
            key = decode(text)
        except (binascii.Error, ValueError):
            continue
        if len(key) == 32:
            return key
    raise ConfigError(f"{where}: a master key is 32 bytes (raw, 64 hex digits or base64)")


def load_master_key(path: str | None) -> bytes:
    """The KEK from ``path``, else from ``ORBITMQ_MASTER_KEY`` (ConfigError if neither)."""
    if path:
        p = Path(path)
        try:
            mode = p.stat().st_mode
            raw = p.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read the master key file {path}: {exc}") from exc
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(f"master key file {path} is readable by others: chmod 600 it")
        return parse_master_key(raw, path)
    env = os.environ.get(MASTER_KEY_ENV)
    if env:
        return parse_master_key(env.encode(), MASTER_KEY_ENV)
    raise ConfigError(f"encryption at rest needs a master key file or ${MASTER_KEY_ENV}")


def kek_id(kek: bytes) -> bytes:
    return hashlib.sha256(b"orbitmq-kek" + kek).digest()[:8]


class Keyring:
    """The current KEK and the retired ones, by id."""

    def __init__(self, current: bytes, retired: list[bytes] | None = None) -> None:
        self.current_id = kek_id(current)
        self.keys = {kek_id(k): k for k in [*(retired or []), current]}

    def get(self, key_id: bytes) -> bytes:
        try:
            return self.keys[key_id]
        except KeyError:
            raise StoreError(
                f"no master key with id {key_id.hex()}: add it to encryption_retired_key_files"
            ) from None


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


class DekStore:
    """The DEK files of one store's CommitLog segments."""

    def __init__(self, root: Path, keyring: Keyring) -> None:
        self.dir = root / CRYPTO_DIR
        self.keyring = keyring

    @staticmethod
    def name(seg_start: int) -> str:
        return f"{seg_start:020d}"

    def path(self, seg_start: int) -> Path:
        return self.dir / f"{self.name(seg_start)}.dek"

    def _aad(self, seg_start: int, key_id: bytes) -> bytes:
        return b"orbitmq-dek|" + self.name(seg_start).encode() + b"|" + key_id

    def create(self, seg_start: int) -> bytes:
        """A new DEK for a segment, durable before it is returned."""
        self.dir.mkdir(parents=True, exist_ok=True)
        dek = AESGCM.generate_key(bit_length=256)
        self._store(seg_start, dek)
        return dek

    def _store(self, seg_start: int, dek: bytes) -> None:
        key_id = self.keyring.current_id
        nonce = os.urandom(12)
        wrapped = AESGCM(self.keyring.get(key_id)).encrypt(nonce, dek, self._aad(seg_start, key_id))
        head = _DEK.pack(_DEK_MAGIC, 1, ALG_AES_256_GCM, key_id, nonce, wrapped, 0)
        data = head[:76] + struct.pack(">I", crc32c.crc32c(head[:76])) + bytes(4)
        _write_atomic(self.path(seg_start), data)

    def load(self, seg_start: int) -> bytes | None:
        """The segment's DEK; None if it has none (a segment written before encryption);
        StoreError if the file is damaged or its KEK is unknown."""
        try:
            data = self.path(seg_start).read_bytes()
        except FileNotFoundError:
            return None
        return self._unwrap(seg_start, data)

    def _unwrap(self, seg_start: int, data: bytes) -> bytes:
        if (
            len(data) != _DEK.size
            or crc32c.crc32c(data[:76]) != struct.unpack(">I", data[76:80])[0]
        ):
            raise StoreError(f"DEK file of segment {self.name(seg_start)} is damaged")
        magic, version, alg, key_id, nonce, wrapped, _crc = _DEK.unpack(data)
        if magic != _DEK_MAGIC or version != 1 or alg != ALG_AES_256_GCM:
            raise StoreError(f"DEK file of segment {self.name(seg_start)}: unknown format")
        try:
            return AESGCM(self.keyring.get(key_id)).decrypt(
                nonce, wrapped, self._aad(seg_start, key_id)
            )
        except InvalidTag:
            raise StoreError(
                f"DEK of segment {self.name(seg_start)} does not unwrap (wrong master key?)"
            ) from None

    def raw(self, seg_start: int) -> bytes | None:
        """The segment's DEK file as stored (wrapped: safe to send to a replica)."""
        try:
            return self.path(seg_start).read_bytes()
        except FileNotFoundError:
            return None

    def install(self, seg_start: int, data: bytes) -> bool:
        """A replica's copy of its master's DEK file for a segment: it must unwrap here (the
        same master key on every replica; StoreError if not), then it is written durably.
        One that holds another DEK is replaced (what this broker wrote in that segment as a
        master was cut when it rejoined: a divergent tail never shares its segment's start
        with the group's log). True when the file changed."""
        dek = self._unwrap(seg_start, data)
        with contextlib.suppress(StoreError):
            if self.load(seg_start) == dek:
                return False
        self.dir.mkdir(parents=True, exist_ok=True)
        _write_atomic(self.path(seg_start), data)
        return True

    def segments(self) -> list[int]:
        if not self.dir.is_dir():
            return []
        return sorted(int(p.stem) for p in self.dir.glob("*.dek") if p.stem.isdigit())

    def prune(self, keep: set[int]) -> int:
        """Delete the DEKs of segments that no longer exist (crypto-shredding)."""
        gone = [s for s in self.segments() if s not in keep]
        for seg_start in gone:
            self.path(seg_start).unlink(missing_ok=True)
        if gone:
            fsync_dir(self.dir)
        return len(gone)

    def rewrap_all(self) -> int:
        """Rewrap every DEK wrapped by a retired KEK under the current one."""
        count = 0
        for seg_start in self.segments():
            data = self.path(seg_start).read_bytes()
            if data[8:16] != self.keyring.current_id:
                dek = self.load(seg_start)
                assert dek is not None
                self._store(seg_start, dek)
                count += 1
        return count


class WriterEpoch:
    """A counter bumped (and fsynced) at every open for writing."""

    def __init__(self, root: Path) -> None:
        self.path = root / CRYPTO_DIR / "epoch"
        self.value = 0

    def read(self) -> int:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return 0
        if len(data) != 16 or crc32c.crc32c(data[:12]) != struct.unpack(">I", data[12:])[0]:
            raise StoreError(f"{self.path} is damaged: cannot pick a fresh writer epoch")
        magic, value, _ = _EPOCH.unpack(data[:12])
        if magic != _EPOCH_MAGIC:
            raise StoreError(f"{self.path} is not a writer epoch file")
        return int(value)

    def bump(self, floor: int = 0) -> int:
        """A new epoch, above every earlier one of this store and at least ``floor`` (a master
        takes ``master epoch << 16`` when it takes office: replicas share the segment keys,
        so two writers of one group must never use the same epoch; docs/security.md)."""
        value = max(self.read() + 1, floor)
        if value >= 1 << 32:
            raise StoreError("writer epoch exhausted")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        head = _EPOCH.pack(_EPOCH_MAGIC, value, 0)
        _write_atomic(self.path, head + struct.pack(">I", crc32c.crc32c(head)))
        self.value = value
        return value

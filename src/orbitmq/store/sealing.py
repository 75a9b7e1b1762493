"""Encryption at rest of CommitLog records (opt-in): seal on append, open on every read.

A sealed record keeps the record layout of docs/storage-format.md, so recovery, retention and
the ConsumeQueue need no key: the 88-byte header, the topic and the CRC stay where they are.
What changes::

    SYS_FLAG        |= 0x10000 (SEALED)
    BODY_LENGTH     = 24 + body + properties
    BODY            = u32 writer epoch || AES-256-GCM(DEK of the segment,
                          nonce = u32 epoch || u64 physical offset,
                          plaintext = u32 body length || body || properties,
                          associated data = header bytes [0, 8) and [12, 88) || u16 topic
                          length || topic || u64 segment start) || 16-byte tag
    PROPERTIES_LENGTH = 0 (the properties are inside the ciphertext)
    CRC             = CRC32C over the stored (encrypted) bytes, as for any record

Why this way: the header stays readable for recovery and dispatch framing; binding the header
(queue, offsets, timestamps, flags) and the topic as associated data means none of them can be
changed or the record moved without failing the tag; the CRC over ciphertext needs no key and
reveals nothing of the body. Nonces never repeat under one DEK: within one run of the store an
offset is written once, and every run writes with a new epoch (bumped and fsynced at open),
so a tail that a crash truncated and the next run rewrites gets fresh nonces.

Reads give back the **plaintext record** (the header with SEALED cleared, the plaintext
lengths and a fresh CRC), so everything above the store (pull, pop, filters, clients) sees the
format it always saw. A record whose tag does not verify is an integrity error: it is skipped
and reported like a record failing its CRC, never served. Records without the SEALED bit (a
store that ran without encryption before) are served as they are.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Sequence
from pathlib import Path

import crc32c
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from orbitmq.common.errors import StoreError
from orbitmq.common.record import (
    CRC_START,
    HEADER,
    HEADER_SIZE,
    U16,
    U32,
    BatchHeader,
    RecordError,
    properties_slice,
)
from orbitmq.store.commit_log import SEAL_OVERHEAD, SYSFLAG_SEALED
from orbitmq.store.keys import DekStore, Keyring, WriterEpoch, load_master_key
from orbitmq.store.reader import GetResult, GetStatus

log = logging.getLogger(__name__)

assert SEAL_OVERHEAD == 4 + 4 + 16  # epoch, body length, tag
_U64 = struct.Struct(">Q")
_NONCE = struct.Struct(">IQ")
_MAX_CIPHERS = 256


class IntegrityError(RecordError):
    """A sealed record failed authentication: damaged or tampered with, never served."""


class RecordSealer:
    """Seals and opens records with per-segment DEKs; see the module docstring."""

    def __init__(self, root: Path, keyring: Keyring, segment_size: int) -> None:
        self.deks = DekStore(root, keyring)
        self.epoch = WriterEpoch(root)
        self.segment_size = segment_size
        self.integrity_errors = 0
        self._ciphers: dict[int, AESGCM] = {}

    def start(self, commit_log_dir: Path) -> None:
        """At open, before recovery and any append: DEKs of vanished segments go, every other
        one must unwrap (StoreError naming the missing master key), then a fresh epoch."""
        names = commit_log_dir.glob("*") if commit_log_dir.is_dir() else ()
        self.deks.prune({int(p.name) for p in names if p.name.isdigit()})
        for seg_start in self.deks.segments():
            self.deks.load(seg_start)
        self.epoch.bump()

    # ------------------------------------------------------------------ keys

    def install_key(self, seg_start: int, wrapped: bytes) -> bool:
        """A replica's copy of its master's DEK file for a segment (``DekStore.install``); a
        cached cipher of the segment's previous DEK is dropped. True when the DEK changed."""
        changed = self.deks.install(seg_start, wrapped)
        if changed:
            self._ciphers.pop(seg_start, None)
        return changed

    def _cipher(self, seg_start: int, create: bool) -> AESGCM | None:
        aead = self._ciphers.get(seg_start)
        if aead is None:
            dek = self.deks.load(seg_start)
            if dek is None:
                if not create:
                    return None
                dek = self.deks.create(seg_start)
            if len(self._ciphers) >= _MAX_CIPHERS:
                self._ciphers.clear()
            aead = self._ciphers[seg_start] = AESGCM(dek)
        return aead

    # ------------------------------------------------------------------ seal

    def seal(
        self, head: BatchHeader, seg_start: int, bodies: Sequence[bytes], props: Sequence[bytes]
    ) -> tuple[list[bytes], list[bytes]]:
        """The sealed bodies (and empty properties) of records laid out from ``head``'s first
        offsets; sets SEALED in ``head.sys_flag``. Called under the CommitLog's append lock."""
        aead = self._cipher(seg_start, create=True)
        assert aead is not None
        epoch = self.epoch.value
        head.sys_flag |= SYSFLAG_SEALED
        topic_part = U16.pack(len(head.topic)) + head.topic
        tail = topic_part + _U64.pack(seg_start)
        fixed = HEADER_SIZE + len(topic_part) + 2
        phy, qoff = head.first_physical_offset, head.first_queue_offset
        epoch_bytes = U32.pack(epoch)
        out: list[bytes] = []
        for body, prop in zip(bodies, props, strict=True):
            body_len = SEAL_OVERHEAD + len(body) + len(prop)
            total = fixed + body_len
            header = HEADER.pack(
                total, 0x4F524231, 0, head.queue_id, head.flag, qoff, phy, head.sys_flag,
                head.born_timestamp_ms, head.born_host, head.store_timestamp_ms,
                head.store_host, head.reconsume_times, head.prepared_transaction_offset,
                body_len,
            )  # fmt: skip
            aad = header[:8] + header[CRC_START:] + tail
            plain = b"".join((U32.pack(len(body)), body, prop))
            out.append(epoch_bytes + aead.encrypt(_NONCE.pack(epoch, phy), plain, aad))
            phy += total
            qoff += 1
        return out, [b""] * len(out)

    # ------------------------------------------------------------------ open

    def open_record(self, view: memoryview | bytes, at: int = 0) -> bytes:
        """The plaintext record of the sealed record at ``at`` (IntegrityError if it does not
        authenticate)."""
        fields = HEADER.unpack_from(view, at)
        total, magic, _crc, qid, flag, qoff, phy, sys_flag = fields[:8]
        body_len = fields[14]
        t_at = at + HEADER_SIZE + body_len
        try:
            tlen = U16.unpack_from(view, t_at)[0]
        except struct.error:
            raise IntegrityError(f"sealed record at {phy}: bad lengths") from None
        topic_part = bytes(view[t_at : t_at + 2 + tlen])
        seg_start = phy - phy % self.segment_size
        mv = view if isinstance(view, memoryview) else memoryview(view)
        aad = b"".join(
            (mv[at : at + 8], mv[at + CRC_START : at + HEADER_SIZE], topic_part,
             _U64.pack(seg_start))
        )  # fmt: skip
        try:
            aead = self._cipher(seg_start, create=False)
            if aead is None or body_len < SEAL_OVERHEAD:
                raise InvalidTag
            epoch = U32.unpack_from(mv, at + HEADER_SIZE)[0]
            plain = aead.decrypt(_NONCE.pack(epoch, phy), mv[at + HEADER_SIZE + 4 : t_at], aad)
        except (InvalidTag, StoreError) as exc:
            self.integrity_errors += 1
            raise IntegrityError(f"sealed record at {phy} does not authenticate") from exc
        blen = U32.unpack_from(plain, 0)[0]
        body, props = plain[4 : 4 + blen], plain[4 + blen :]
        header = HEADER.pack(
            total - SEAL_OVERHEAD, magic, 0, qid, flag, qoff, phy, sys_flag & ~SYSFLAG_SEALED,
            *fields[8:14], blen,
        )  # fmt: skip
        record = bytearray().join((header, body, topic_part, U16.pack(len(props)), props))
        U32.pack_into(record, 8, crc32c.crc32c(memoryview(record)[CRC_START:]))
        return bytes(record)

    def plain(self, record: memoryview) -> memoryview | None:
        """A record as served: opened if sealed (None if it does not authenticate)."""
        if not U32.unpack_from(record, 36)[0] & SYSFLAG_SEALED:
            return record
        try:
            return memoryview(self.open_record(record))
        except IntegrityError as exc:
            log.warning("%s: not served", exc)
            return None

    def props_of(self, view: memoryview, at: int) -> bytes | memoryview:
        """The plaintext properties of the record at ``at`` (b"" if it does not
        authenticate: a filter then matches nothing, and the read skips the record)."""
        if not U32.unpack_from(view, at + 36)[0] & SYSFLAG_SEALED:
            return properties_slice(view, at)[1]
        try:
            return properties_slice(memoryview(self.open_record(view, at)), 0)[1]
        except IntegrityError:
            return b""

    def open_result(self, res: GetResult) -> GetResult:
        """``res`` with every sealed record replaced by its plaintext; records that do not
        authenticate move to ``skipped``."""
        if not res.sizes:
            return res
        views: list[memoryview] = []
        sizes: list[int] = []
        offsets: list[int] = []
        for view, offset in zip(res.messages, res.queue_offsets, strict=True):
            opened = self.plain(view)
            if opened is None:
                res.skipped.append(offset)
                continue
            views.append(opened)
            sizes.append(len(opened))
            offsets.append(offset)
        res.body_parts, res.sizes, res.queue_offsets = views, sizes, offsets
        res._messages = list(views)
        if not sizes and res.status == GetStatus.FOUND:
            res.status = GetStatus.NO_MATCHED_MESSAGE
        return res


def make_sealer(
    root: Path,
    segment_size: int,
    key_file: str | None,
    retired_key_files: Sequence[str],
    enabled: bool,
) -> RecordSealer | None:
    """The store's sealer (None when encryption is off). A store holding DEKs refuses to open
    without its master key rather than serve ciphertext."""
    if not enabled:
        if DekStore(root, Keyring(bytes(32))).segments():
            raise StoreError(
                f"{root} holds encrypted segments: set store.encrypt_at_rest and a master key"
            )
        return None
    keyring = Keyring(load_master_key(key_file), [load_master_key(f) for f in retired_key_files])
    return RecordSealer(root, keyring, segment_size)

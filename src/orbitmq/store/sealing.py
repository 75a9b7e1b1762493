"""Encryption at rest of CommitLog records (opt-in): seal on append, open on every read.

Two formats, both keeping the record layout of docs/storage-format.md, so recovery, retention
and the ConsumeQueue need no key (the 88-byte header, the topic and the CRC stay in clear):

- **Format 2** (written now, :mod:`orbitmq.store.seal_group`): the records one append writes
  into one segment are sealed together with one AES-256-GCM call, and opened together; each
  record is then a zero-copy slice of the plaintext, and opened groups are cached.
- **Format 1** (written before; still read): each record sealed on its own::

    SYS_FLAG        |= 0x10000 (SEALED)
    BODY_LENGTH     = 24 + body + properties
    BODY            = u32 writer epoch || AES-256-GCM(DEK of the segment,
                          nonce = u32 epoch || u64 physical offset,
                          plaintext = u32 body length || body || properties,
                          associated data = header bytes [0, 8) and [12, 88) || u16 topic
                          length || topic || u64 segment start) || 16-byte tag
    PROPERTIES_LENGTH = 0 (the properties are inside the ciphertext)
    CRC             = CRC32C over the stored (encrypted) bytes, as for any record

Why this way: the header stays readable for recovery and dispatch framing; the header and the
topic are bound to the ciphertext (associated data in format 1, compared with the
authenticated copy in format 2), so none of them can be changed or the record moved without
failing; the CRC over ciphertext needs no key and reveals nothing of the body. Nonces never
repeat under one DEK: within one run of the store an offset is written once, and every run
writes with a new epoch (bumped and fsynced at open), so a tail that a crash truncated and the
next run rewrites gets fresh nonces.

Reads give back the **plaintext record** (the header with the seal bits cleared, the plaintext
lengths and CRC), so everything above the store (pull, pop, filters, clients) sees the format
it always saw. A record that does not authenticate is an integrity error: it is skipped and
reported like a record failing its CRC, never served. Records without the SEALED bit (a store
that ran without encryption before) are served as they are.
"""

from __future__ import annotations

import logging
import struct
from bisect import bisect_left
from collections.abc import Callable, Sequence
from itertools import accumulate
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
    encode_batch,
    properties_slice,
)
from orbitmq.store import seal_group
from orbitmq.store.commit_log import SEAL_OVERHEAD, SYSFLAG_SEALED
from orbitmq.store.keys import DekStore, Keyring, WriterEpoch, load_master_key
from orbitmq.store.reader import GetResult, GetStatus

log = logging.getLogger(__name__)

assert SEAL_OVERHEAD == 4 + 4 + 16  # epoch, body length, tag
_U64 = struct.Struct(">Q")
_NONCE = struct.Struct(">IQ")
_MAX_CIPHERS = 256
_GROUP = seal_group.SEAL_BITS
_TAG_AT = HEADER_SIZE + 16
_BACK_AT = HEADER_SIZE + 4
_BACK_SPAN = struct.Struct(">II")
_FLAGS_PHY = struct.Struct(">QI")  # physical offset (28), SYS_FLAG (36)
ViewAt = Callable[[int], "tuple[memoryview, int, int] | None"]


class IntegrityError(RecordError):
    """A sealed record failed authentication: damaged or tampered with, never served."""


class RecordSealer:
    """Seals and opens records with per-segment DEKs; see the module docstring."""

    def __init__(
        self, root: Path, keyring: Keyring, segment_size: int, cache_bytes: int = 32 << 20
    ) -> None:
        self.deks = DekStore(root, keyring)
        self.epoch = WriterEpoch(root)
        self.segment_size = segment_size
        self.integrity_errors = 0
        self._ciphers: dict[int, AESGCM] = {}
        self.cache = seal_group.GroupCache(cache_bytes)
        """Opened format-2 groups (hot reads and the dispatcher open each group once)."""
        self._last: tuple[tuple[int, bytes], seal_group.Opened] | None = None
        self.view_at: ViewAt | None = None
        """The CommitLog's ``view_at`` (set by the store): a group read from a single record
        needs the segment around it."""

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

    def overhead(self, topic_len: int) -> int:
        return seal_group.extra_bytes(topic_len)

    def seal(
        self, head: BatchHeader, seg_start: int, bodies: Sequence[bytes], props: Sequence[bytes]
    ) -> bytearray:
        """The sealed records laid out from ``head``'s first offsets, as one format-2 group;
        sets the seal bits in ``head.sys_flag``. Called under the CommitLog's append lock."""
        aead = self._cipher(seg_start, create=True)
        assert aead is not None
        out, key, opened = seal_group.seal_records(
            aead, self.epoch.value, head, seg_start, bodies, props
        )
        self.cache.put(key, opened)  # hot reads serve it without a decrypt
        return out

    def seal_v1(
        self, head: BatchHeader, seg_start: int, bodies: Sequence[bytes], props: Sequence[bytes]
    ) -> bytearray:
        """Format 1 (one AEAD per record), no longer written by the store; kept so tests can
        make the segments older stores wrote and check they still read."""
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
        return encode_batch(head, out, [b""] * len(out), None, None)

    # ------------------------------------------------------------------ open

    def _group(self, view: memoryview, at: int, seg_start: int) -> seal_group.Opened:
        """The opened group of the format-2 record at ``at`` of a segment's ``view``."""
        g_at = seal_group.group_start(view, at)
        tag = bytes(view[at + _TAG_AT : at + _TAG_AT + 16])
        key = (seg_start + g_at, tag)
        last = self._last  # the dispatcher asks for each record of a group in turn
        if last is not None and last[0] == key:
            return last[1]
        entry = self.cache.get(key)
        if entry is not None:
            self._last = (key, entry)
            return entry
        try:
            aead = self._cipher(seg_start, create=False)
            if aead is None or g_at < 0:
                raise seal_group.GroupError("no key or no group")
            entry = seal_group.open_group(aead, view, g_at, seg_start)
        except (seal_group.GroupError, StoreError, struct.error) as exc:
            self.integrity_errors += 1
            raise IntegrityError(
                f"sealed group at {seg_start + g_at} does not authenticate ({exc})"
            ) from exc
        self.cache.put(key, entry)
        self._last = (key, entry)
        return entry

    def _open_grouped(self, view: memoryview, at: int) -> memoryview:
        """The plaintext of the format-2 record at ``at`` of a segment's ``view``."""
        seg_start = _U64.unpack_from(view, at + 28)[0] - at
        plain, where, _sizes = self._group(view, at, seg_start)
        place = where.get(seg_start + at)
        if place is None:
            raise IntegrityError(f"no record at {seg_start + at} in its sealed group")
        return memoryview(plain)[place[0] : place[0] + place[1]]

    def _entry_of(self, rec: memoryview) -> tuple[int, seal_group.Opened]:
        """The physical offset of a format-2 record (a slice holding just it) and its opened
        group: from the cache, else opened around it through ``view_at``."""
        phy = _U64.unpack_from(rec, 28)[0]
        g_phy = phy - U32.unpack_from(rec, HEADER_SIZE + 4)[0]
        entry = self.cache.get((g_phy, bytes(rec[_TAG_AT : _TAG_AT + 16])))
        if entry is None:
            loc = self.view_at(phy) if self.view_at is not None else None
            if loc is None:
                self.integrity_errors += 1
                raise IntegrityError(f"sealed record at {phy}: its segment is not readable")
            view, at, _size = loc
            entry = self._group(view, at, phy - at)
        return phy, entry

    def group_of(
        self, view: memoryview, at: int
    ) -> tuple[memoryview, seal_group.Places, int, list[int]] | None:
        """The dispatcher's view of a format-2 record's group: its plaintext, where each
        record is in it, and how much larger sealed records are (None: not format 2, or it
        does not authenticate)."""
        if U32.unpack_from(view, at + 36)[0] & _GROUP != _GROUP:
            return None
        phy = _U64.unpack_from(view, at + 28)[0]
        try:
            plain, where, sizes = self._group(view, at, phy - at)
        except IntegrityError as exc:
            log.warning("%s: not dispatched from its plaintext", exc)
            return None
        place = where.get(phy)
        if place is None:
            return None
        return memoryview(plain), where, U32.unpack_from(view, at)[0] - place[1], sizes

    def open_record(self, view: memoryview | bytes, at: int = 0) -> bytes:
        """The plaintext record of the sealed record at ``at`` of a segment's ``view``
        (IntegrityError if it does not authenticate)."""
        mv = view if isinstance(view, memoryview) else memoryview(view)
        if U32.unpack_from(mv, at + 36)[0] & _GROUP == _GROUP:
            return bytes(self._open_grouped(mv, at))
        return self._open_v1(mv, at)

    def _open_v1(self, view: memoryview, at: int) -> bytes:
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
        """A record (a slice holding just it) as served: opened if sealed (None if it does
        not authenticate)."""
        flags = U32.unpack_from(record, 36)[0]
        if not flags & SYSFLAG_SEALED:
            return record
        try:
            if flags & _GROUP == _GROUP:
                phy, (plain, where, _sizes) = self._entry_of(record)
                place = where.get(phy)
                if place is None:
                    self.integrity_errors += 1
                    raise IntegrityError(f"no record at {phy} in its sealed group")
                return memoryview(plain)[place[0] : place[0] + place[1]]
            return memoryview(self._open_v1(record, 0))
        except IntegrityError as exc:
            log.warning("%s: not served", exc)
            return None

    def props_of(self, view: memoryview, at: int) -> bytes | memoryview:
        """The plaintext properties of the record at ``at`` of a segment's ``view`` (b"" if
        it does not authenticate: a filter then matches nothing, and the read skips it)."""
        flags = U32.unpack_from(view, at + 36)[0]
        if not flags & SYSFLAG_SEALED:
            return properties_slice(view, at)[1]
        try:
            if flags & _GROUP == _GROUP:
                return properties_slice(self._open_grouped(view, at), 0)[1]
            return properties_slice(memoryview(self._open_v1(view, at)), 0)[1]
        except IntegrityError:
            return b""

    def open_result(self, res: GetResult) -> GetResult:
        """``res`` with every sealed record replaced by its plaintext; records that do not
        authenticate move to ``skipped``.

        Work is per run of one group's records, not per record: a body part holds records
        back to back, so the records of one group in it are found from the group's span
        (one bisect over the sizes), and served as one slice of the opened plaintext with
        the group's authenticated sizes, once the run's first and last records are the
        group's records that far apart (two dict lookups). A run that fails that check is
        served record by record (each looked up), and a group that does not authenticate
        is skipped whole."""
        if not res.sizes:
            return res
        sizes_in, offsets, skipped = res.sizes, res.queue_offsets, res.skipped
        ends = list(accumulate(sizes_in))  # end of each record in the parts laid end to end
        out = _Served()
        base = k = 0
        n = len(sizes_in)
        cache_get = self.cache.get
        for part in res.body_parts:
            part_end = base + len(part)
            while k < n and ends[k] <= part_end:
                # The usual case inline (an opened group in the cache, its records in
                # order); anything else takes _serve_run, which also handles this case.
                size = sizes_in[k]
                start = ends[k] - size
                pos = start - base
                phy, flags = _FLAGS_PHY.unpack_from(part, pos + 28)
                back, span = _BACK_SPAN.unpack_from(part, pos + _BACK_AT)
                stop = start + span - back
                j = bisect_left(ends, stop, k) + 1
                entry = (
                    cache_get((phy - back, bytes(part[pos + _TAG_AT : pos + _TAG_AT + 16])))
                    if flags & _GROUP == _GROUP and stop <= part_end and j <= n
                    else None
                )
                if entry is not None and ends[j - 1] == stop:
                    where = entry.where
                    first = where.get(phy)
                    last_at = ends[j - 1] - sizes_in[j - 1]
                    last = where.get(phy + last_at - start)
                    if (
                        first is not None
                        and last is not None
                        and last[2] - first[2] == j - 1 - k
                        and last_at - start == last[0] - first[0] + (j - 1 - k) * (size - first[1])
                    ):
                        out.add_slice(entry.plain, first[0], last[0] + last[1])
                        out.sizes += entry.sizes[first[2] : last[2] + 1]
                        out.offsets += offsets[k:j]
                        k = j
                        continue
                k = self._serve_run(part, base, k, part_end, ends, res, out)
            base = part_end
        for r in range(k, n):  # sizes beyond the parts (never, unless res was inconsistent)
            skipped.append(offsets[r])
        res.body_parts, res.sizes, res.queue_offsets = out.parts, out.sizes, out.offsets
        res._messages = None
        if not out.sizes and res.status == GetStatus.FOUND:
            res.status = GetStatus.NO_MATCHED_MESSAGE
        return res

    def _serve_run(
        self,
        part: memoryview,
        base: int,
        k: int,
        part_end: int,
        ends: list[int],
        res: GetResult,
        out: _Served,
    ) -> int:
        """Serve the records of ``part`` from record ``k`` (``part`` starts at ``base`` of the
        parts laid end to end) that belong to the same group; returns the next record."""
        size = res.sizes[k]
        pos = ends[k] - size - base
        if U32.unpack_from(part, pos + 36)[0] & _GROUP != _GROUP:  # format 1 or plaintext
            out.add_one(self.plain(part[pos : pos + size]), res.queue_offsets[k], res.skipped)
            return k + 1
        back, span = _BACK_SPAN.unpack_from(part, pos + _BACK_AT)
        stop = min(part_end, ends[k] - size + span - back)  # where the group's records end
        j = bisect_left(ends, stop, k) + 1
        if j > len(ends) or ends[j - 1] != stop:  # the span cuts a record: one by one
            j = k + 1
        try:
            phy, (plain, where, sizes) = self._entry_of(part[pos : pos + size])
        except IntegrityError as exc:
            log.warning("%s: not served", exc)
            res.skipped.extend(res.queue_offsets[k:j])
            return j
        first = where.get(phy)
        last_at = ends[j - 1] - res.sizes[j - 1]  # the run's last record, in the parts
        last = where.get(phy + last_at - ends[k] + size)
        extra = size - first[1] if first is not None else 0
        if (
            first is None
            or last is None
            or last[2] - first[2] != j - 1 - k
            or last_at - (ends[k] - size) != last[0] - first[0] + (j - 1 - k) * extra
        ):  # not the group's records in order: each one is looked up (or not served)
            for r in range(k, j):
                at = ends[r] - res.sizes[r] - base
                rec = self.plain(part[at : at + res.sizes[r]])
                out.add_one(rec, res.queue_offsets[r], res.skipped)
            return j
        out.add_slice(plain, first[0], last[0] + last[1])
        out.sizes += sizes[first[2] : last[2] + 1]
        out.offsets += res.queue_offsets[k:j]
        return j


class _Served:
    """What ``open_result`` serves: body parts, and each record's size and queue offset.
    Slices of one plaintext that meet become one part (a read of a few records gets one
    part per record from the reader, as a plaintext store's back-to-back records would be
    one)."""

    __slots__ = ("_hi", "_lo", "_plain", "offsets", "parts", "sizes")

    def __init__(self) -> None:
        self.parts: list[memoryview] = []
        self.sizes: list[int] = []
        self.offsets: list[int] = []
        self._plain: bytes | bytearray | None = None
        self._lo = self._hi = 0

    def add_one(self, view: memoryview | None, offset: int, skipped: list[int]) -> None:
        if view is None:
            skipped.append(offset)
            return
        self.parts.append(view)
        self._plain = None
        self.sizes.append(len(view))
        self.offsets.append(offset)

    def add_slice(self, plain: bytes | bytearray, lo: int, hi: int) -> None:
        if plain is self._plain and lo == self._hi:
            self.parts[-1] = memoryview(plain)[self._lo : hi]
        else:
            self.parts.append(memoryview(plain)[lo:hi])
            self._plain, self._lo = plain, lo
        self._hi = hi


def make_sealer(
    root: Path,
    segment_size: int,
    key_file: str | None,
    retired_key_files: Sequence[str],
    enabled: bool,
    cache_bytes: int = 32 << 20,
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
    return RecordSealer(root, keyring, segment_size, cache_bytes)

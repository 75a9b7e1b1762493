"""Pull bodies (stored records back to back) to a pyarrow RecordBatch of the source schema,
with no Python work per record on the usual path.

Why this shape: Spark's Arrow path moves ~1M rows/s when ``read()`` yields RecordBatches, but a
Python loop over records costs more than that alone. So:

- record boundaries: a record's size is its first field, so boundaries are found by walking; when
  every record of a chunk has the same size (the usual case for a producer's batch) one numpy
  check proves the guess ``starts = arange(0, len, size)`` and the walk is skipped;
- fixed header fields (queue offset, timestamps, flags...) are gathered from those starts with
  numpy and byte-swapped once;
- bodies and properties are variable-length slices between headers: they become one
  ``binary_view`` array each (16-byte views pointing into the pulled bytes, built with numpy),
  which Arrow compacts into a plain ``binary`` / ``string`` array in C++;
- properties (``k\\x01v\\x02...``) are split with pyarrow.compute into the map column, and TAGS,
  KEYS and the message id are picked out of it by key, again in C++.

Compressed bodies (rare: a producer compresses bodies over 4 KiB) are the one per-record path:
only the flagged rows are inflated in Python.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from orbitmq.common.errors import ProtocolError
from orbitmq.common.message import (
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    SYSFLAG_COMPRESSED,
)
from orbitmq.common.record import BLANK_MAGIC, HEADER_SIZE, MAGIC, RecordError
from orbitmq.spark.arrow_native import available, has_compressed, native_batch
from orbitmq.spark.schema import arrow_schema

__all__ = ["RecordColumns", "records_to_batch", "split_records"]

_I32 = struct.Struct(">i")
Buffer = bytes | bytearray | memoryview
_MIN_RECORD = HEADER_SIZE + 4
_HEADER_DTYPE = np.dtype(
    [
        ("total", ">i4"), ("magic", ">u4"), ("crc", ">u4"), ("queue_id", ">i4"), ("flag", ">i4"),
        ("queue_offset", ">i8"), ("physical_offset", ">i8"), ("sys_flag", ">i4"),
        ("born_timestamp", ">i8"), ("born_host", "S8"), ("store_timestamp", ">i8"),
        ("store_host", "S8"), ("reconsume_times", ">i4"), ("prepared_tx_offset", ">i8"),
        ("body_length", ">i4"),
    ]
)  # fmt: skip
_SCHEMA: pa.Schema | None = None


def _schema() -> pa.Schema:
    global _SCHEMA
    if _SCHEMA is None:
        _SCHEMA = arrow_schema()
    return _SCHEMA


def _at_every_byte(raw: np.ndarray, dtype: np.dtype | str) -> np.ndarray:
    """``raw`` seen as one ``dtype`` item starting at every byte (zero-copy): item ``i`` is
    the field at byte ``i``. Indexing it with record positions gathers a field in one step,
    much cheaper than indexing a 2-D ``sliding_window_view``."""
    dt = np.dtype(dtype)
    count = max(0, len(raw) - dt.itemsize + 1)
    if count == 0:
        return np.zeros(0, dtype=dt)
    return np.ndarray((count,), dtype=dt, buffer=raw, strides=(1,))


def _gather(raw: np.ndarray, starts: np.ndarray, at: int, dtype: str) -> np.ndarray:
    """The big-endian field ``dtype`` at ``starts + at`` of every record, native-endian."""
    dt = np.dtype(dtype)
    out: np.ndarray = _at_every_byte(raw, dt)[starts + at].astype(dt.newbyteorder("="))
    return out


_MAGIC_LE = int.from_bytes(MAGIC.to_bytes(4, "big"), "little")


def _magic_candidates(data: Buffer) -> np.ndarray:
    """Positions where a record could start: 4 bytes before each occurrence of the magic."""
    found = []
    size = len(data)
    for align in range(4):
        count = (size - align) // 4
        if count <= 0:
            continue
        words = np.frombuffer(data, dtype="<u4", count=count, offset=align)
        found.append(np.flatnonzero(words == _MAGIC_LE) * 4 + align)
    pos = np.sort(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)
    return pos[pos >= 4] - 4


def split_records(data: Buffer) -> np.ndarray:
    """Start positions of the records in ``data``; RecordError when they do not tile it.

    Checks what boundaries need (magic, a plausible size, sizes adding up to the length); field
    lengths inside each record are checked by :class:`RecordColumns`. Fast path: every place the
    magic occurs is taken for a record start, and one vectorized check proves that each record
    ends where the next begins; only when a body happens to contain the magic (or the data is
    bad) are the sizes walked one by one.
    """
    size = len(data)
    if size == 0:
        return np.zeros(0, dtype=np.int64)
    if size < _MIN_RECORD:
        raise RecordError(f"record at 0: {size} bytes is shorter than a record header")
    raw = np.frombuffer(data, dtype=np.uint8)
    same = _same_size_starts(data, raw)
    if same is not None:
        return same
    starts = _magic_candidates(data).astype(np.int64)
    if len(starts) and starts[0] == 0 and int(starts[-1]) + _MIN_RECORD <= size:
        totals = _gather(raw, starts, 0, ">i4").astype(np.int64)
        ends = starts + totals
        if (
            bool(np.all(totals >= _MIN_RECORD))
            and bool(np.array_equal(ends[:-1], starts[1:]))
            and int(ends[-1]) == size
        ):
            return starts
    return _walk(data, raw)


_SIZE_MAGIC = np.dtype([("total", ">i4"), ("magic", ">u4")])


def _same_size_starts(data: Buffer, raw: np.ndarray) -> np.ndarray | None:
    """The starts when every record has the first record's size (a producer's batch of equal
    messages: the usual case), else None. One strided look at each guessed start proves it:
    if the record at every multiple of the size says it has that size and the magic, the walk
    would find exactly those starts. Costs per record, not per byte as the magic scan does."""
    size = len(data)
    first = _I32.unpack_from(data, 0)[0]
    if first < _MIN_RECORD or size % first:
        return None
    n = size // first
    heads = np.ndarray((n,), dtype=_SIZE_MAGIC, buffer=raw, strides=(first,))
    if bool(np.all(heads["total"] == first)) and bool(np.all(heads["magic"] == MAGIC)):
        return np.arange(0, size, first, dtype=np.int64)
    return None


def _walk(data: Buffer, raw: np.ndarray) -> np.ndarray:
    size = len(data)
    out: list[int] = []
    append = out.append
    unpack = _I32.unpack_from
    pos = 0
    while pos < size:
        if pos + _MIN_RECORD > size:
            raise RecordError(f"record at {pos}: {size - pos} bytes left, less than a header")
        total = unpack(data, pos)[0]
        if total < _MIN_RECORD or pos + total > size:
            raise RecordError(f"record at {pos}: bad total size {total}")
        append(pos)
        pos += total
    starts = np.array(out, dtype=np.int64)
    magics = _gather(raw, starts, 4, ">u4")
    bad = np.flatnonzero(magics != MAGIC)
    if bad.size:
        at = int(starts[bad[0]])
        what = "an end-of-segment filler" if magics[bad[0]] == BLANK_MAGIC else "bad magic"
        raise RecordError(f"record at {at}: {what}")
    return starts


_VIEW_DTYPE = np.dtype([("length", "<i4"), ("prefix", "V4"), ("buffer", "<i4"), ("offset", "<i4")])


def _views(
    raw: np.ndarray, data_buf: pa.Buffer, begins: np.ndarray, lengths: np.ndarray
) -> pa.Array:
    """A ``binary_view`` array of the slices ``data[begins[i] : begins[i] + lengths[i]]``.

    A view is 16 bytes: length (i32), then either the bytes inline (length <= 12) or a 4-byte
    prefix, buffer index 0 and the offset (i32). ``data`` must be under 2 GiB (a chunk is)."""
    n = len(begins)
    if n == 0:
        return pa.array([], pa.binary_view())
    views = np.zeros(n, dtype=_VIEW_DTYPE)
    views["length"] = lengths
    long_rows = lengths > 12
    if bool(long_rows.all()):  # the usual case for bodies: prefix, buffer 0, offset
        views["prefix"] = _at_every_byte(raw, "V4")[begins]
        views["offset"] = begins
    else:
        # Inline: up to 12 bytes, zero past the length. A window reaching past the end of
        # ``raw`` is read from a zero-padded copy of its last bytes.
        windows = _at_every_byte(raw, "V12")
        near_end = begins >= len(windows)
        if bool(near_end.any()):
            base = max(0, len(raw) - 12)
            tail = np.concatenate([raw[base:], np.zeros(12, dtype=np.uint8)])
            picked = np.empty(n, dtype="V12")
            picked[~near_end] = windows[begins[~near_end]]
            picked[near_end] = _at_every_byte(tail, "V12")[begins[near_end] - base]
        else:
            picked = windows[begins]
        inline = picked.view(np.uint8).reshape(n, 12)
        inline[np.arange(12)[None, :] >= lengths[:, None]] = 0
        flat = views.view(np.uint8).reshape(n, 16)
        flat[:, 4:16] = inline
        if long_rows.any():
            flat[long_rows, 8:12] = 0  # buffer index 0
            views["offset"][long_rows] = begins[long_rows]
    return pa.Array.from_buffers(pa.binary_view(), n, [None, pa.py_buffer(views), data_buf])


class RecordColumns:
    """The columns of a run of records from one queue, ready for :meth:`batch`."""

    def __init__(self, data: Buffer, topic: str, broker: str) -> None:
        """``data``: the records (used in place: the columns' buffers point into it)."""
        if len(data) >= 1 << 31:
            raise RecordError("a chunk of 2 GiB or more cannot be converted at once")
        self.data = data
        self.topic = topic
        self.broker = broker
        raw = np.frombuffer(data, dtype=np.uint8)
        self.raw = raw  # the buffer the columns point into
        starts = split_records(data)
        size = len(data)
        self.starts = starts
        n = len(starts)
        self.n = n
        step = size // n if n else 0
        if n and int(starts[-1]) == size - step and bool(np.all(np.diff(starts) == step)):
            # Records of one size (the usual case): the headers are a strided view, no gather.
            head = np.ndarray((n,), dtype=_HEADER_DTYPE, buffer=raw, strides=(step,))
        else:
            # Gathered as plain bytes, then seen as the header: cheaper than a structured gather.
            head = _at_every_byte(raw, f"V{HEADER_SIZE}")[starts].view(_HEADER_DTYPE)
        totals = head["total"].astype(np.int64)
        body_len = head["body_length"].astype(np.int64)
        ends = starts + totals
        t_at = starts + HEADER_SIZE + body_len
        if n and (bool(np.any(body_len < 0)) or bool(np.any(t_at + 2 > ends))):
            bad = int(np.flatnonzero((body_len < 0) | (t_at + 2 > ends))[0])
            raise RecordError(f"record at {int(starts[bad])}: bad body length {body_len[bad]}")
        topic_len = self._u16(t_at)
        p_at = t_at + 2 + topic_len
        if n and bool(np.any(p_at + 2 > ends)):
            bad = int(np.flatnonzero(p_at + 2 > ends)[0])
            raise RecordError(f"record at {int(starts[bad])}: bad topic length")
        props_len = self._u16(p_at)
        mismatch = p_at + 2 + props_len != ends
        if n and bool(np.any(mismatch)):
            bad = int(np.flatnonzero(mismatch)[0])
            raise RecordError(
                f"record at {int(starts[bad])}: field lengths do not add up to the total size"
            )
        self.body_at = starts + HEADER_SIZE
        self.body_len = body_len
        self.props_at = p_at + 2
        self.props_len = props_len
        self.queue_id = head["queue_id"].astype(np.int32)
        self.queue_offset = head["queue_offset"].astype(np.int64)
        self.sys_flag = head["sys_flag"].astype(np.int32)
        self.born_ms = head["born_timestamp"].astype(np.int64)
        self.store_ms = head["store_timestamp"].astype(np.int64)
        self.reconsume = head["reconsume_times"].astype(np.int32)

    def _u16(self, at: np.ndarray) -> np.ndarray:
        if not len(at):
            return np.zeros(0, dtype=np.int64)
        return _gather(self.raw, at, 0, ">u2").astype(np.int64)

    def batch(self, keep: np.ndarray | None = None) -> pa.RecordBatch:
        """The RecordBatch of the records (only those where ``keep`` is true, if given)."""
        sel = slice(None) if keep is None else keep
        n = self.n if keep is None else int(np.count_nonzero(keep))
        buf = pa.py_buffer(self.raw)
        values = _views(self.raw, buf, self.body_at[sel], self.body_len[sel])
        value = values.cast(pa.binary())
        flags = self.sys_flag[sel]
        if n and bool(np.any(flags & SYSFLAG_COMPRESSED)):
            value = _inflate(value, flags)
        props_raw = _views(self.raw, buf, self.props_at[sel], self.props_len[sel])
        props, tags, keys, msg_id = _properties(props_raw, n)
        us = np.int64(1000)
        ts_type = pa.timestamp("us", tz="UTC")
        columns = [
            keys.cast(pa.binary()),
            value,
            pa.repeat(pa.scalar(self.topic, pa.string()), n),
            pa.array(self.queue_id[sel].astype(np.int32), pa.int32()),
            pa.array(self.queue_offset[sel], pa.int64()),
            pa.repeat(pa.scalar(self.broker, pa.string()), n),
            msg_id,
            tags,
            props,
            pa.array(self.born_ms[sel] * us, pa.int64()).view(ts_type),
            pa.array(self.store_ms[sel] * us, pa.int64()).view(ts_type),
            pa.array(self.reconsume[sel].astype(np.int32), pa.int32()),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=_schema())


def _inflate(value: pa.Array, flags: np.ndarray) -> pa.Array:
    """Bodies with the compression flag, inflated (the only per-record Python path)."""
    from orbitmq.client._codec import decompress

    bodies: list[bytes | None] = value.to_pylist()
    for i in np.flatnonzero(flags & SYSFLAG_COMPRESSED).tolist():
        body = bodies[i]
        if body is not None:
            try:
                bodies[i] = decompress(body, int(flags[i]))
            except ProtocolError as exc:  # a damaged record: the caller's kind of error
                raise RecordError(f"record {i} of the batch: {exc}") from None
    return pa.array(bodies, pa.binary())


def _split_pairs(as_bin: pa.Array) -> tuple[pa.Array, pa.Array, np.ndarray] | None:
    """(names, values, row of each pair) found with numpy on the blocks' bytes, when every
    block is well formed (each pair ``name\x01value\x02``, as producers write them) and UTF-8;
    None otherwise (the general path then handles it)."""
    bufs = as_bin.buffers()
    n = len(as_bin)
    offsets = np.frombuffer(bufs[1], dtype=np.int32, count=n + 1, offset=4 * as_bin.offset)
    lo, hi = int(offsets[0]), int(offsets[-1])
    if bufs[2] is None or hi == lo:
        empty = pa.array([], pa.string())
        return (empty, empty, np.zeros(0, dtype=np.int64)) if hi == lo else None
    data = np.frombuffer(bufs[2], dtype=np.uint8)
    block = data[lo:hi]
    x1 = np.flatnonzero(block == 1)
    x2 = np.flatnonzero(block == 2)
    if len(x1) != len(x2):
        return None
    ends = offsets[1:][offsets[1:] > offsets[:-1]] - lo  # non-empty blocks end with \x02
    if len(ends) and not bool(np.all(block[ends - 1] == 2)):
        return None
    starts = np.empty_like(x2)
    starts[0] = 0
    starts[1:] = x2[:-1] + 1
    if not (bool(np.all(starts <= x1)) and bool(np.all(x1 < x2))):
        return None
    # \x01 and \x02 are ASCII, so when the whole block is UTF-8 every piece cut at them is.
    if int(block.max()) >= 0x80:
        try:
            block.tobytes().decode("utf-8")
        except UnicodeDecodeError:
            return None
    parent = np.searchsorted(offsets, x2 + lo, side="right") - 1
    buf = pa.py_buffer(block)
    # Binary, then seen as string with no second UTF-8 check (the block passed one above).
    names = _views(block, buf, starts, x1 - starts).cast(pa.binary()).view(pa.string())
    values = _views(block, buf, x1 + 1, x2 - x1 - 1).cast(pa.binary()).view(pa.string())
    return names, values, parent


def _split_pairs_general(as_bin: pa.Array) -> tuple[pa.Array, pa.Array, np.ndarray]:
    """Any blocks: pairs without ``\x01`` are skipped and invalid UTF-8 is replaced, as
    :func:`orbitmq.common.message.decode_properties` does."""
    try:
        text = as_bin.cast(pa.string())
    except pa.ArrowInvalid:
        text = pa.array(
            [None if b is None else b.decode("utf-8", "replace") for b in as_bin.to_pylist()],
            pa.string(),
        )
    pairs = pc.split_pattern(text, "\x02")
    parent = pc.list_parent_indices(pairs).to_numpy(zero_copy_only=False)
    flat = pc.list_flatten(pairs)
    kv = pc.split_pattern(flat, "\x01", max_splits=1)
    has_sep = pc.equal(pc.list_value_length(kv), 2).to_numpy(zero_copy_only=False)
    kv = kv.filter(pa.array(has_sep))
    return pc.list_element(kv, 0), pc.list_element(kv, 1), parent[has_sep]


_MAP = pa.map_(pa.field("key", pa.string(), nullable=False), pa.string())
_PICKED = pa.array([PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_UNIQ_KEY], pa.string())


def _properties(props_raw: pa.Array, n: int) -> tuple[pa.Array, pa.Array, pa.Array, pa.Array]:
    """(map column, TAGS, KEYS, message id) from the raw properties blocks."""
    as_bin = props_raw.cast(pa.binary())
    split = _split_pairs(as_bin)
    names, vals, parent = split if split is not None else _split_pairs_general(as_bin)
    counts = np.bincount(parent, minlength=n) if len(parent) else np.zeros(n, dtype=np.int64)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    # Built from its buffers: MapArray.from_arrays re-checks what is known here (no null
    # keys, offsets in range) and costs ~30x more.
    entries = pa.StructArray.from_arrays([names, vals], fields=[_MAP.key_field, _MAP.item_field])
    props = pa.Array.from_buffers(_MAP, n, [None, pa.py_buffer(offsets)], children=[entries])
    # One hash pass finds the three picked names (a string compare per name costs as much).
    which = pc.fill_null(pc.index_in(names, value_set=_PICKED), -1).to_numpy()

    def pick(k: int) -> pa.Array:
        hit = np.flatnonzero(which == k)
        if not len(hit):
            return pa.nulls(n, pa.string())
        rows = parent[hit]
        first = int(hit[0])
        if len(hit) == n and int(hit[-1]) - first == n - 1 and bool(np.all(rows == np.arange(n))):
            # Every row has the name once, in pairs next to each other: a slice, no take.
            return vals.slice(first, n)
        at = np.full(n, -1, dtype=np.int64)
        at[rows] = hit  # a repeated name: the last one wins
        idx = pa.array(at, mask=at < 0)
        return pc.take(vals, idx)

    return props, pick(0), pick(1), pick(2)


def records_to_batch(
    chunks: Sequence[bytes], topic: str, broker: str, end: int | None = None
) -> pa.RecordBatch:
    """One RecordBatch of the records in ``chunks`` (pull bodies), dropping any at or past the
    queue offset ``end``."""
    size = sum(len(c) for c in chunks)
    if not size:
        return empty_batch()
    parts = [c for c in chunks if len(c)]
    if len(parts) == 1:  # one pull's body (a large pull): used in place, no copy
        data: Buffer = parts[0]
    else:
        data = b"".join(parts)  # one copy, so the views have one buffer to point into
    if available():
        fast = native_batch(data, topic, broker, _schema())
        if fast is not None:
            return _finish_native(*fast, end)
    cols = RecordColumns(data, topic, broker)
    keep = None
    if end is not None and cols.n and int(cols.queue_offset[-1]) >= end:
        keep = cols.queue_offset < end
    return cols.batch(keep)


def _finish_native(
    batch: pa.RecordBatch, offsets: np.ndarray, flags: np.ndarray, end: int | None
) -> pa.RecordBatch:
    """The C conversion's batch cut at ``end`` and with compressed bodies inflated, in the
    order :meth:`RecordColumns.batch` does both (so errors name the same row)."""
    if end is not None and len(offsets) and int(offsets[-1]) >= end:
        keep = offsets < end
        batch = batch.filter(pa.array(keep))
        flags = flags[keep]
    if has_compressed(flags):
        value = _inflate(batch.column(1), flags)
        batch = batch.set_column(1, _schema().field("value"), value)
    return batch


def empty_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=_schema())

"""Pull bodies to a RecordBatch with the C extension: the fast path of :mod:`orbitmq.spark.arrow`.

``orbitmq._native.record_columns`` walks the records twice (sizing, then filling every column's
buffers, without the GIL on large bodies) and this module only wraps those buffers as Arrow
arrays, without copies. Why: the numpy/pyarrow conversion costs ~0.6 µs per row in a dozen
array passes and casts on the Spark worker's one Python thread, which also serves the pulls.

:func:`native_batch` returns None whenever the C code hands a body back (a damaged record,
properties that are not all ``name\\x01value\\x02`` pairs of UTF-8) or the extension is absent
or switched off (``ORBITMQ_NATIVE=0``): the Python conversion then does it, and stays the
reference (tests/spark/test_arrow_native.py proves the same batches).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from orbitmq.common.message import SYSFLAG_COMPRESSED
from orbitmq.common.native import NATIVE

__all__ = ["available", "native_batch"]

_MAP = pa.map_(pa.field("key", pa.string(), nullable=False), pa.string())
_TS = pa.timestamp("us", tz="UTC")


def available() -> bool:
    return NATIVE is not None and hasattr(NATIVE, "record_columns")


def native_batch(
    data: bytes | bytearray | memoryview, topic: str, broker: str, schema: pa.Schema
) -> tuple[pa.RecordBatch, np.ndarray, np.ndarray] | None:
    """(batch, queue offsets, sys flags) of the records in ``data``, or None (see above).
    Compressed bodies are left as stored: the caller inflates them."""
    if NATIVE is None:
        return None
    cols = NATIVE.record_columns(data)
    if cols is None:
        return None
    n: int = cols[0]
    buf = [pa.py_buffer(b) for b in cols[1:]]
    q_id, q_off, _, born, stored, reconsume = buf[0:6]
    value = pa.Array.from_buffers(pa.binary(), n, [None, buf[6], buf[7]])
    pairs = (len(cols[9]) // 4) - 1
    names = pa.Array.from_buffers(pa.string(), pairs, [None, buf[8], buf[9]])
    values = pa.Array.from_buffers(pa.string(), pairs, [None, buf[10], buf[11]])
    entries = pa.StructArray.from_arrays([names, values], fields=[_MAP.key_field, _MAP.item_field])
    props = pa.Array.from_buffers(_MAP, n, [None, buf[12]], children=[entries])
    picked = [pa.Array.from_buffers(pa.string(), n, buf[13 + 3 * k : 16 + 3 * k]) for k in range(3)]
    tags, keys, msg_id = picked
    columns = [
        keys.view(pa.binary()),
        value,
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.Array.from_buffers(pa.int32(), n, [None, q_id]),
        pa.Array.from_buffers(pa.int64(), n, [None, q_off]),
        pa.repeat(pa.scalar(broker, pa.string()), n),
        msg_id,
        tags,
        props,
        pa.Array.from_buffers(_TS, n, [None, born]),
        pa.Array.from_buffers(_TS, n, [None, stored]),
        pa.Array.from_buffers(pa.int32(), n, [None, reconsume]),
    ]
    batch = pa.RecordBatch.from_arrays(columns, schema=schema)
    offsets = np.frombuffer(cols[2], dtype=np.int64)
    sys_flags = np.frombuffer(cols[3], dtype=np.int32)
    return batch, offsets, sys_flags


def has_compressed(sys_flags: np.ndarray) -> bool:
    return bool(len(sys_flags)) and bool(np.any(sys_flags & SYSFLAG_COMPRESSED))

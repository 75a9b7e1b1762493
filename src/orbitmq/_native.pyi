# Type stub for the optional C extension built from _native.c (see setup.py).
HARDWARE_CRC: int
PHY_STRIDE: int
"""1 when encode_batch takes phy_stride (an extension built before it lacks the name)."""

def crc32c(data: bytes | bytearray | memoryview, value: int = 0, /) -> int: ...
def encode_batch(
    topic: bytes,
    queue_id: int,
    first_queue_offset: int,
    first_physical_offset: int,
    flag: int,
    sys_flag: int,
    born_timestamp_ms: int,
    born_host: bytes,
    store_timestamp_ms: int,
    store_host: bytes,
    reconsume_times: int,
    prepared_transaction_offset: int,
    bodies: list[bytes],
    properties: list[bytes],
    phy_stride: int = 0,
    /,
) -> bytearray: ...
def check_group(
    view: memoryview, g_at: int, plain: bytes, sizes: list[int], extra: int, topic_part: bytes, /
) -> bool: ...
def seal_bodies(
    sealed: bytes, sizes: list[int], epoch: int, extra: int, tail: bytes, /
) -> list[bytes]: ...
def gather_group(
    view: memoryview, g_at: int, count: int, span: int, extra: int, /
) -> tuple[bytes, list[int]] | None: ...
def seal_records(
    plain: bytes | bytearray, sealed: bytes, epoch: int, extra: int, /
) -> tuple[bytearray, list[int]]: ...
def split_records(data: bytes, verify_crc: bool, /) -> list[tuple[object, ...]] | int: ...
def has_each(properties: list[bytes], name: bytes, /) -> bool: ...
def told_small(
    properties: list[bytes],
    physical_offsets: list[int],
    store_ts: int,
    seed: int,
    indexing: bool,
    rows: list[tuple[int, int, int]],
    /,
) -> list[int] | None: ...
def record_columns(data: bytes | bytearray | memoryview, /) -> tuple[object, ...] | None: ...

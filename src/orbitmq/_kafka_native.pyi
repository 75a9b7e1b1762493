# Type stub for the optional C extension built from _kafka_native.c (see setup.py).
def send_body(
    records: bytes | bytearray | memoryview, count: int, base_timestamp: int, ids: list[str], /
) -> bytes | None: ...
def fetch_batches(
    pull_body: bytes | bytearray | memoryview, from_offset: int, /
) -> bytes | None: ...

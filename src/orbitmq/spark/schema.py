"""The source's row schema, as Spark DDL and as the exact Arrow schema ``read()`` yields.

Spark compares the first RecordBatch's schema with ``to_arrow_schema(schema, timezone="UTC")``
and refuses any difference (int32 vs int64, string vs large_string, a nullable map key), so the
Arrow schema is written out here once, field for field, and a test checks it against Spark's own
conversion.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["SOURCE_COLUMNS", "SOURCE_DDL", "arrow_schema"]

SOURCE_DDL = (
    "key binary, value binary, topic string, queue_id int, queue_offset bigint, broker string, "
    "msg_id string, tags string, properties map<string,string>, born_timestamp timestamp, "
    "store_timestamp timestamp, reconsume_times int"
)
SOURCE_COLUMNS = tuple(part.split()[0] for part in SOURCE_DDL.split(", "))


def arrow_schema() -> pa.Schema:
    """The Arrow twin of :data:`SOURCE_DDL` (timestamps in microseconds, UTC)."""
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    return pa.schema(
        [
            pa.field("key", pa.binary()),
            pa.field("value", pa.binary()),
            pa.field("topic", pa.string()),
            pa.field("queue_id", pa.int32()),
            pa.field("queue_offset", pa.int64()),
            pa.field("broker", pa.string()),
            pa.field("msg_id", pa.string()),
            pa.field("tags", pa.string()),
            pa.field(
                "properties",
                pa.map_(
                    pa.field("key", pa.string(), nullable=False), pa.field("value", pa.string())
                ),
            ),
            pa.field("born_timestamp", ts),
            pa.field("store_timestamp", ts),
            pa.field("reconsume_times", pa.int32()),
        ]
    )

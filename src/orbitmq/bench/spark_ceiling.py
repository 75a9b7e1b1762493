"""The ceiling over the Spark source: how fast Spark itself takes in the connector's rows.

A Python data source that does no work: each partition reads a sample of rows the real
connector produced (an Arrow IPC file, a few MiB) and yields slices of it until it has given its
share of ``rows``. Same schema, same values, same RecordBatch size as the connector; no broker,
no pull, no conversion. What Spark does with those rows (Arrow from the Python worker into the
JVM, rows for the ``noop`` sink, tasks and stages) is what it does with the real source's rows,
so the rate measured here bounds the connector's on the same master and machine: the source's
own cost comes on top, on the same cores.

The benchmark layer names the connector only by its format (it does not import it), so the
sample comes from a real read and the schema from the sample.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

__all__ = ["FORMAT", "CeilingSource", "write_sample"]

FORMAT = "orbitmq-bench-ceiling"
ROWS_PER_BATCH = 8192
"""As the connector's reader (orbitmq.spark.source.ROWS_PER_BATCH)."""


def write_sample(table: Any, path: Path) -> None:
    """Store a pyarrow Table (rows the connector produced) for :class:`CeilingSource`."""
    import pyarrow as pa

    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


def _read_sample(path: str) -> Any:
    import pyarrow as pa

    with pa.memory_map(path) as source:
        table = pa.ipc.open_file(source).read_all()
    return table.combine_chunks().to_batches()[0]


class _Share(InputPartition):
    def __init__(self, rows: int) -> None:
        self.rows = rows


class _Reader(DataSourceReader):
    def __init__(self, sample: str, rows: int, partitions: int) -> None:
        self.sample, self.rows, self.parts = sample, rows, partitions

    def partitions(self) -> list[InputPartition]:
        share, extra = divmod(self.rows, self.parts)
        return [_Share(share + (1 if i < extra else 0)) for i in range(self.parts)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, _Share)
        batch = _read_sample(self.sample)
        step = min(ROWS_PER_BATCH, batch.num_rows)
        left = partition.rows
        while left > 0:
            n = min(step, left)
            yield batch.slice(0, n)
            left -= n


class CeilingSource(DataSource):
    """Options: ``sample`` (Arrow IPC file from :func:`write_sample`), ``rows``, ``partitions``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> Any:
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(_read_sample(self.options["sample"]).schema)

    def reader(self, schema: Any) -> DataSourceReader:
        return _Reader(
            self.options["sample"], int(self.options["rows"]), int(self.options["partitions"])
        )

"""The ceiling over the Spark source: how fast Spark itself takes in the connector's rows.

A Python data source that does no work: each partition reads a sample of rows the real
connector produced (an Arrow IPC file, a few MiB) and yields slices of it until it has given its
share of ``rows``. Same schema, same values, same RecordBatch size as the connector; no broker,
no pull, no conversion. What Spark does with those rows (Arrow from the Python worker into the
JVM, rows for the ``noop`` sink, tasks and stages) is what it does with the real source's rows,
so the rate measured here bounds the connector's on the same master and machine: the source's
own cost comes on top, on the same cores.

It also reads as a stream (``readStream``): offsets are a row count, ``latestOffset`` says all
``rows`` are there, and an ``availableNow`` query reads them in one micro-batch. Its time is the
floor of a streaming read on that master: Spark's query start (the streaming runner process,
planning, the offset and commit logs) plus moving the rows, with no source work at all.

The benchmark layer names the connector only by its format (it does not import it), so the
sample comes from a real read and the schema from the sample.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow

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


def _shares(rows: int, parts: int) -> list[InputPartition]:
    share, extra = divmod(rows, parts)
    return [_Share(share + (1 if i < extra else 0)) for i in range(parts)]


def _slices(sample: str, partition: InputPartition) -> Iterator[Any]:
    assert isinstance(partition, _Share)
    batch = _read_sample(sample)
    step = min(ROWS_PER_BATCH, batch.num_rows)
    left = partition.rows
    while left > 0:
        n = min(step, left)
        yield batch.slice(0, n)
        left -= n


class _Reader(DataSourceReader):
    def __init__(self, sample: str, rows: int, partitions: int) -> None:
        self.sample, self.rows, self.parts = sample, rows, partitions

    def partitions(self) -> list[InputPartition]:
        return _shares(self.rows, self.parts)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _slices(self.sample, partition)


class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets ``{"rows": n}``: all ``rows`` are there from the start."""

    def __init__(self, sample: str, rows: int, partitions: int) -> None:
        self.sample, self.rows, self.parts = sample, rows, partitions

    def initialOffset(self) -> dict[str, int]:
        return {"rows": 0}

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        return {"rows": self.rows}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        return _shares(end["rows"] - start["rows"], self.parts)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _slices(self.sample, partition)

    def commit(self, end: dict[str, int]) -> None:
        pass


class CeilingSource(DataSource):
    """Options: ``sample`` (Arrow IPC file from :func:`write_sample`), ``rows``, ``partitions``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> Any:
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(_read_sample(self.options["sample"]).schema)

    def _args(self) -> tuple[str, int, int]:
        o = self.options
        return o["sample"], int(o["rows"]), int(o["partitions"])

    def reader(self, schema: Any) -> DataSourceReader:
        return _Reader(*self._args())

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _StreamReader(*self._args())

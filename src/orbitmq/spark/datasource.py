"""``OrbitMQDataSource``: the format ``orbitmq`` for ``spark.read`` / ``readStream`` /
``write`` / ``writeStream``.

The instance is pickled into Spark's Python workers, so it holds only the option strings: every
reader and writer it makes parses them again (cheaply) and opens broker connections lazily,
where it runs. Readers live in :mod:`orbitmq.spark.source`; writers in :mod:`orbitmq.spark.sink`,
imported only when a write is planned so a read never depends on the sink.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource

from orbitmq.spark.schema import SOURCE_DDL

if TYPE_CHECKING:
    from pyspark.sql.datasource import (
        DataSourceReader,
        DataSourceStreamReader,
        DataSourceStreamWriter,
        DataSourceWriter,
    )
    from pyspark.sql.types import StructType

__all__ = ["OrbitMQDataSource"]


class OrbitMQDataSource(DataSource):
    """Read and write OrbitMQ topics from Spark, with Kafka connector option names."""

    @classmethod
    def name(cls) -> str:
        return "orbitmq"

    def schema(self) -> str:
        return SOURCE_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        from orbitmq.spark.source import OrbitMQBatchReader

        return OrbitMQBatchReader(dict(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from orbitmq.spark.source import OrbitMQStreamReader

        return OrbitMQStreamReader(dict(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from orbitmq.spark.sink import batch_writer

        return batch_writer(dict(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from orbitmq.spark.sink import stream_writer

        return stream_writer(dict(self.options), schema, overwrite)

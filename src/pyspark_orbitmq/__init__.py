"""Automatic registration with Spark: PySpark imports every top-level ``pyspark_*`` module that
exposes ``DefaultSource`` and registers it under ``DefaultSource.name()``, so
``spark.read.format("orbitmq")`` works with no ``spark.dataSource.register`` call."""

from orbitmq.spark.datasource import OrbitMQDataSource

DefaultSource = OrbitMQDataSource

__all__ = ["DefaultSource"]

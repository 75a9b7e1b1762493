"""PySpark data source (extra: spark). Never imported by servers.

``spark.read.format("orbitmq")`` / ``readStream`` / ``write`` / ``writeStream``: see
:mod:`orbitmq.spark.datasource` (the format), :mod:`orbitmq.spark.source` (reads) and
:mod:`orbitmq.spark.sink` (writes). Importing this package imports no pyspark.
"""

"""PySpark data source (extra: spark). Never imported by servers."""

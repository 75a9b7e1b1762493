"""Building the SparkSession that ``orbitmq pipeline`` and the examples run on.

Spark's defaults trip up a first run of a Python pipeline in three ways, so this module fixes
them before the JVM starts (docs/spark.md, "Troubleshooting"):

- Python workers start from ``PYSPARK_PYTHON``, which defaults to whatever ``python3`` is on
  PATH, not the interpreter that has orbitmq and pyarrow installed. We default it to
  ``sys.executable`` (a value the user exported wins: on a cluster it names the executors'
  interpreter, e.g. a shipped virtualenv).
- Spark logs INFO/WARN lines by the hundred on stdout and stderr. We give log4j a config that
  keeps ERROR and above, on stderr, and turn the progress bar and UI off.
- In local mode a machine whose hostname resolves to a loopback address gets a warning printed
  before any config is read; ``SPARK_LOCAL_IP=127.0.0.1`` avoids it (local masters only: on a
  cluster the executors must reach the driver).

The session's time zone is UTC so that dates (Parquet ``date=`` partitions, windows) do not
depend on the machine that runs the driver.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["DEFAULT_MASTER", "SessionOptions", "build_session", "is_local_master"]

DEFAULT_MASTER = "local[*]"

_LOCAL = re.compile(r"^local(\[[^\]]*\])?$")

_LOG4J_TEMPLATE = """\
# Written by orbitmq: Spark keeps {level} and above, on stderr.
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{HH:mm:ss}} %p %c{{1}}: %m%n
"""

_LEVELS = ("ALL", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF")


@dataclass(frozen=True, slots=True)
class SessionOptions:
    """What the CLI lets a user choose; everything else is a ``conf`` entry."""

    master: str = DEFAULT_MASTER
    app_name: str = "orbitmq-pipeline"
    log_level: str = "ERROR"
    """log4j level for Spark's own logs (ERROR keeps a pipeline's terminal readable)."""
    conf: Mapping[str, str] = field(default_factory=dict)
    """Extra Spark settings (``spark.executor.memory``, ``spark.archives``, ...); they win over
    the defaults set here."""


def is_local_master(master: str) -> bool:
    """``local``, ``local[4]``, ``local[*]``, ``local[2,3]``: Spark in this process's JVM."""
    return bool(_LOCAL.match(master.strip()))


def _log4j_file(level: str) -> Path:
    """A log4j2 properties file for ``level``, in the temp folder (one per level and user:
    written once, then reused)."""
    user = getattr(os, "getuid", lambda: 0)()  # no getuid on Windows
    path = Path(tempfile.gettempdir()) / f"orbitmq-log4j2-{level.lower()}-{user}.properties"
    text = _LOG4J_TEMPLATE.format(level=level.lower())
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return path


def _prepare_environment(master: str) -> None:
    """Set the environment the JVM and the Python workers inherit. Only defaults: a value the
    user exported is kept."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if is_local_master(master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def session_conf(options: SessionOptions) -> dict[str, str]:
    """The Spark settings the session is built with (defaults, then ``options.conf``)."""
    level = options.log_level.upper()
    if level not in _LEVELS:
        raise ValueError(f"log level {options.log_level!r}: use one of {', '.join(_LEVELS)}")
    log4j = f"-Dlog4j2.configurationFile=file:{_log4j_file(level)}"
    conf = {
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": log4j,
        "spark.sql.streaming.stopTimeout": "30s",
    }
    if is_local_master(options.master):
        # One machine: a shuffle into 200 partitions costs more than it spreads.
        conf["spark.sql.shuffle.partitions"] = str(max(2, os.cpu_count() or 2))
    conf.update(options.conf)
    return conf


def build_session(options: SessionOptions | None = None) -> SparkSession:
    """The SparkSession for a pipeline: ``local[*]`` unless ``options.master`` says otherwise
    (``spark://host:7077``, ``yarn``, ``k8s://https://host:443``). If a session is already
    active in this process (a notebook, a test) it is returned as it is: Spark allows one per
    JVM, and most of these settings only take effect when the JVM starts."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    options = options or SessionOptions()
    _prepare_environment(options.master)
    builder = SparkSession.builder.master(options.master).appName(options.app_name)
    for key, value in session_conf(options).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(options.log_level.upper())
    return spark

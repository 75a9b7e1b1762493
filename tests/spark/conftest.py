"""One SparkSession for the whole run (starting one costs ~10 s and ~1 GB) and one real OrbitMQ
cluster (a NameServer and a Broker as processes) for the Spark tests.

Spark is kept quiet: SPARK_LOCAL_IP avoids the loopback warning log4j prints to stdout before it
is configured, a log4j2 file sends only errors to stderr, and the UI and progress bar are off.
The workers run this interpreter (PYSPARK_PYTHON), which has the package installed, so they can
unpickle the data source. Every test here is marked ``spark`` and skipped without pyspark/Java.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orbitmq.common.errors import MQError
from tests.harness import ProcessCluster

pyspark = pytest.importorskip("pyspark", reason="the spark extra is not installed")
pytest.importorskip("pyarrow", reason="the spark extra is not installed")

LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.spark)


def _java_ok() -> bool:
    return bool(os.environ.get("JAVA_HOME") or shutil.which("java"))


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The session-wide local[2] SparkSession."""
    if not _java_ok():
        pytest.skip("Java (17+) is not installed")
    from pyspark.sql import SparkSession

    conf_dir = tmp_path_factory.mktemp("spark-conf")
    log4j = conf_dir / "log4j2-quiet.properties"
    log4j.write_text(LOG4J)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    java_opts = f"-Dlog4j2.configurationFile=file:{log4j}"
    session = (
        SparkSession.builder.master("local[2]")
        .appName("orbitmq-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.stopTimeout", "10s")
        .config("spark.driver.extraJavaOptions", java_opts)
        .config("spark.local.dir", str(conf_dir))
        # Workers connect back within 15 s by default: too short on a loaded 2-core machine.
        .config("spark.python.authenticate.socketTimeout", "120s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@dataclass
class OrbitCluster:
    """A running NameServer + Broker (``broker-a``) for Spark tests."""

    namesrv: str
    broker_addr: str
    cluster: ProcessCluster

    def topic(self, prefix: str = "spark", queues: int = 2) -> str:
        """A fresh topic with ``queues`` queues."""
        return self.topic_named(f"{prefix}-{uuid.uuid4().hex[:8]}", queues)

    def topic_named(self, name: str, queues: int = 2) -> str:
        """Create (or update) topic ``name`` and wait until the NameServer routes it."""
        from orbitmq.client import BlockingAdminClient

        with BlockingAdminClient(self.namesrv) as admin:
            admin.create_topic(name, read_queue_nums=queues, write_queue_nums=queues)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:  # the NameServer learns it on the next register
                try:
                    if len(admin.queues(name)) == queues:
                        return name
                except MQError:
                    pass
                time.sleep(0.1)
        raise AssertionError(f"topic {name} never showed {queues} queues at the NameServer")


@pytest.fixture(scope="session")
def orbit_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OrbitCluster]:
    """One NameServer and one Broker as real processes, shared by the Spark tests (each test
    uses its own topics)."""
    c = ProcessCluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        ns = c.namesrv()
        broker = c.broker("broker-a", [ns.address])
        yield OrbitCluster(ns.address, broker.address, c)
    finally:
        c.stop_all()

"""Run librdkafka's own test programs against OrbitMQ's Kafka listener.

    python tests/compat/kafka/librdkafka_suite.py LIBRDKAFKA_DIR [TEST ...]
                                                     (``make test-kafka-suite``)

LIBRDKAFKA_DIR is a checkout of github.com/confluentinc/librdkafka (BSD-2; not vendored). Its
library and ``tests/test-runner`` are built first when missing (``./configure`` without SSL,
SASL and GSSAPI, ``make libs``, ``make -C tests build``: a C toolchain and zlib headers). Then
``python -m orbitmq up`` starts with its Kafka listener on a free port (NameServer and broker on
free ports, no proxy, MQTT or console), ``tests/test.conf`` points ``bootstrap.servers`` at it,
and each test runs alone as Redpanda runs the suite against itself
(``TEST_KAFKA_VERSION=3.0.0 TESTS=<n> ./test-runner``), each under a time limit. The default
list is the brief's K10 set. The server is stopped by its PID, even on failure. Exit status 0
when every test passed; the per-test results are printed either way (docs/kafka.md lists the
ones that pass).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

K10 = ["0001", "0002", "0004", "0005", "0012", "0013", "0015", "0017", "0020", "0021", "0026",
       "0028", "0029", "0030", "0031", "0034", "0040", "0042", "0048", "0073", "0085"]  # fmt: skip
TEST_TIMEOUT_S = 300
TEST_CONF = """\
bootstrap.servers={bootstrap}
test.timeout.multiplier=3
api.version.request=true
"""


def build(src: Path) -> Path:
    runner = src / "tests" / "test-runner"
    if runner.exists():
        return runner
    steps = [
        ["./configure", "--disable-ssl", "--disable-gssapi", "--disable-sasl"],
        ["make", "-j2", "libs"],
        ["make", "-C", "tests", "build"],
    ]
    for cmd in steps:
        print("build:", " ".join(cmd), flush=True)
        subprocess.run(cmd, cwd=src, check=True, stdout=subprocess.DEVNULL)
    return runner


def start_server(folder: Path) -> tuple[subprocess.Popen[str], str]:
    log = (folder / "server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "orbitmq", "up", "--data-dir", str(folder / "data"),
         "--host", "127.0.0.1", "--namesrv-port", "0", "--broker-port", "0", "--kafka-port", "0",
         "--proxy-port", "-1", "--console-port", "-1", "--log-level", "WARNING"],
        stdout=subprocess.PIPE, stderr=log, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    found = re.search(r"kafka=(\S+)", line)
    if "ready" not in line or found is None:
        proc.kill()
        raise SystemExit(f"OrbitMQ did not start a Kafka listener: {line!r} (see {log.name})")
    return proc, found.group(1)


def run_one(runner: Path, test: str) -> tuple[bool, str]:
    src = runner.parent.parent
    libs = f"{src / 'src'}:{src / 'src-cpp'}"  # the freshly built libraries, not installed
    env = {**os.environ, "TESTS": test, "TEST_KAFKA_VERSION": "3.0.0", "LD_LIBRARY_PATH": libs}
    try:
        done = subprocess.run(
            [str(runner)], cwd=runner.parent, env=env, capture_output=True, text=True,
            timeout=TEST_TIMEOUT_S, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return False, f"timed out after {TEST_TIMEOUT_S} s"
    tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
    return done.returncode == 0, " | ".join(tail)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path, help="librdkafka checkout")
    parser.add_argument("tests", nargs="*", default=K10, help="test numbers (default: K10)")
    args = parser.parse_args()
    runner = build(args.src.resolve())
    with tempfile.TemporaryDirectory(prefix="orbitmq-rdk-") as tmp:
        proc, bootstrap = start_server(Path(tmp))
        try:
            (runner.parent / "test.conf").write_text(TEST_CONF.format(bootstrap=bootstrap))
            results = {}
            for test in args.tests:
                began = time.monotonic()
                ok, detail = run_one(runner, test)
                results[test] = ok
                took = time.monotonic() - began
                print(f"{test}: {'PASS' if ok else 'FAIL'} ({took:.0f} s) {'' if ok else detail}",
                      flush=True)  # fmt: skip
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
    passed = [t for t, ok in results.items() if ok]
    print(f"passed {len(passed)}/{len(results)}: {' '.join(passed)}")
    return 0 if len(passed) == len(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())

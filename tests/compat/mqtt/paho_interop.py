"""Run the Eclipse Paho MQTT interoperability suites against a real OrbitMQ process.

    python tests/compat/mqtt/paho_interop.py SUITE_DIR     (``make test-mqtt-interop``)

SUITE_DIR is a checkout of github.com/eclipse/paho.mqtt.testing (pure Python, EPL/EDL; not
vendored). Both suites are hard-wired to localhost (the 3.1.1 one to port 1883 too), so this
starts ``python -m orbitmq up`` with its MQTT listener on 127.0.0.1:1883, the NameServer and
broker on free ports, ``test/nosubscribe`` denied (the 3.1.1 suite's subscribe-failure test)
and a 60 s keep-alive ceiling (the 5.0 suite's Server Keep Alive test). Then
``client_test.py`` runs whole (10 tests) and ``client_test5.py`` one test at a time, each
under a 90 s timeout. Exit status 0 when 3.1.1 passes 10/10 and 5.0 at least 26/27 (issue
#18's bar). The server is stopped by its PID, even on failure.
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

PORT = 1883
TEST_TIMEOUT_S = 90
CONFIG = """\
[namesrv]
port = 0
[broker]
port = 0
[mqtt]
port = {port}
deny_subscribe = ["test/nosubscribe"]
max_keep_alive_s = 60
"""


def start_server(folder: Path) -> subprocess.Popen[str]:
    cfg = folder / "orbitmq.toml"
    cfg.write_text(CONFIG.format(port=PORT))
    log = (folder / "server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "orbitmq", "up", "--data-dir", str(folder / "data"),
         "--config", str(cfg), "--proxy-port", "-1"],
        stdout=subprocess.PIPE, stderr=log, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "ready" not in line or f"mqtt=127.0.0.1:{PORT}" not in line:
        proc.kill()
        raise SystemExit(f"OrbitMQ did not start with MQTT on {PORT}: {line!r} (see {log.name})")
    return proc


def run(cmd: list[str], cwd: Path) -> tuple[bool, str]:
    try:
        done = subprocess.run(
            cmd, cwd=cwd, capture_output=True, text=True, timeout=TEST_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return False, "timeout"
    return done.returncode == 0, done.stderr[-2000:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("suite", type=Path, help="checkout of eclipse/paho.mqtt.testing")
    args = parser.parse_args()
    suite = args.suite / "interoperability"
    if not (suite / "client_test5.py").exists():
        raise SystemExit(f"{suite}/client_test5.py not found")
    with tempfile.TemporaryDirectory(prefix="orbitmq-paho-") as tmp:
        proc = start_server(Path(tmp))
        try:
            started = time.monotonic()
            ok311, out = run([sys.executable, "client_test.py"], suite)
            found = re.search(
                r"Ran (\d+) tests?.*?(OK|FAILED \((?:failures|errors)=(\d+)\))", out, re.S
            )
            ran = int(found.group(1)) if found else 10
            failed = int(found.group(3) or 0) if found and found.group(3) else (0 if ok311 else ran)
            print(f"MQTT 3.1.1 client_test.py: {ran - failed}/{ran} passed")
            names = re.findall(r"def (test_\w+)\(", (suite / "client_test5.py").read_text())
            passed5 = 0
            for name in names:
                ok, detail = run(
                    [sys.executable, "client_test5.py", "-p", str(PORT), f"Test.{name}"], suite
                )
                passed5 += ok
                print(
                    f"  5.0 {name}: {'ok' if ok else 'FAILED ' + detail.strip().splitlines()[-1:][0] if detail.strip() else 'FAILED'}"
                )
            print(f"MQTT 5.0 client_test5.py: {passed5}/{len(names)} passed")
            print(f"({time.monotonic() - started:.0f} s)")
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, 9)
    return 0 if ran - failed == ran == 10 and passed5 >= len(names) - 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())

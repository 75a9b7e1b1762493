"""A real S3-compatible server for the tier's S3 tests: OpenStack Swift with its ``s3api``
middleware, from Debian's packages (``make test-s3`` installs them), run from a temp folder.

Everything lives under the given folder: ``swift.conf`` (read through ``swift_dir``), rings
built for free loopback ports, one device folder, and a memcached for the proxy's tempauth
tokens. Five processes (memcached, account, container, object, proxy servers) run as the
current user with ``workers = 0``; they are stopped by PID (SIGTERM, then SIGKILL) when the
context ends, whether the test passed or not. Credentials are tempauth's ``test:tester`` /
``testing``; S3 requests are path-style to ``http://127.0.0.1:<port>``, region ``us-east-1``.
The bucket is created through Swift's own API (a container), as s3api maps buckets to them.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

BINARIES = ("swift-proxy-server", "swift-account-server", "swift-container-server",
            "swift-object-server", "swift-ring-builder", "memcached")  # fmt: skip
ACCESS_KEY, SECRET_KEY = "test:tester", "testing"


def missing() -> list[str]:
    """The programs Swift needs that are not installed (empty: it can run here)."""
    return [b for b in BINARIES if shutil.which(b) is None]


@dataclass(frozen=True)
class SwiftS3:
    endpoint: str
    bucket: str
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server_conf(base: Path, kind: str, port: int, user: str) -> str:
    return (
        f"[DEFAULT]\nbind_ip = 127.0.0.1\nbind_port = {port}\nworkers = 0\nuser = {user}\n"
        f"swift_dir = {base}\ndevices = {base / 'srv'}\nmount_check = false\n"
        f"log_address = /nonexistent\n[pipeline:main]\npipeline = {kind}-server\n"
        f"[app:{kind}-server]\nuse = egg:swift#{kind}\n"
    )


_FILTERS = ("catch_errors", "gatekeeper", "healthcheck", "proxy_logging", "listing_formats",
            "copy", "slo", "dlo")  # fmt: skip


def _proxy_conf(base: Path, port: int, cache_port: int, user: str) -> str:
    filters = "".join(f"[filter:{f.replace('_', '-')}]\nuse = egg:swift#{f}\n" for f in _FILTERS)
    return (
        f"[DEFAULT]\nbind_ip = 127.0.0.1\nbind_port = {port}\nworkers = 0\nuser = {user}\n"
        f"swift_dir = {base}\nlog_address = /nonexistent\n[pipeline:main]\npipeline = "
        "catch-errors gatekeeper healthcheck proxy-logging cache listing-formats s3api tempauth "
        "copy slo dlo proxy-logging proxy-server\n"
        "[app:proxy-server]\nuse = egg:swift#proxy\naccount_autocreate = true\n"
        f"[filter:tempauth]\nuse = egg:swift#tempauth\nuser_test_tester = {SECRET_KEY} .admin\n"
        "[filter:s3api]\nuse = egg:swift#s3api\nlocation = us-east-1\n"
        f"[filter:cache]\nuse = egg:swift#memcache\nmemcache_servers = 127.0.0.1:{cache_port}\n"
        + filters
    )


@contextlib.contextmanager
def swift_s3(base: Path, bucket: str = "orbitmq", timeout_s: float = 90.0) -> Iterator[SwiftS3]:
    """Run Swift + s3api under ``base`` until the context ends; yields where to reach it."""
    base.mkdir(parents=True, exist_ok=True)
    (base / "srv" / "d1").mkdir(parents=True, exist_ok=True)
    (base / "swift.conf").write_text(
        "[swift-hash]\nswift_hash_path_suffix = orbitmq\nswift_hash_path_prefix = orbitmq\n"
        "[storage-policy:0]\nname = Policy-0\ndefault = yes\n"
    )
    user = getpass.getuser()
    ports = {k: _free_port() for k in ("proxy", "account", "container", "object", "cache")}
    for kind in ("account", "container", "object"):
        builder = str(base / f"{kind}.builder")
        for args in (["create", "10", "1", "1"],
                     ["add", f"r1z1-127.0.0.1:{ports[kind]}/d1", "100"], ["rebalance"]):  # fmt: skip
            subprocess.run(["swift-ring-builder", builder, *args], capture_output=True, timeout=60)
        (base / f"{kind}-server.conf").write_text(_server_conf(base, kind, ports[kind], user))
    (base / "proxy-server.conf").write_text(_proxy_conf(base, ports["proxy"], ports["cache"], user))
    procs: list[subprocess.Popen[bytes]] = []
    with open(base / "swift.log", "ab") as log:
        try:
            procs.append(subprocess.Popen(
                ["memcached", "-l", "127.0.0.1", "-p", str(ports["cache"]), "-U", "0", "-m", "16",
                 *(["-u", user] if user == "root" else [])],
                stdout=log, stderr=log,
            ))  # fmt: skip
            for kind in ("account", "container", "object", "proxy"):
                procs.append(subprocess.Popen(
                    [f"swift-{kind}-server", str(base / f"{kind}-server.conf")],
                    stdout=log, stderr=log,
                ))  # fmt: skip
            endpoint = f"http://127.0.0.1:{ports['proxy']}"
            _create_bucket(endpoint, bucket, time.monotonic() + timeout_s, procs)
            yield SwiftS3(endpoint, bucket)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)


def _create_bucket(
    endpoint: str, bucket: str, deadline: float, procs: list[subprocess.Popen[bytes]]
) -> None:
    """Wait for the proxy, then create the bucket (a container) through tempauth."""
    while True:
        dead = [p.args for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"Swift servers exited: {dead} (see swift.log)")
        try:
            auth = urllib.request.Request(
                f"{endpoint}/auth/v1.0",
                headers={"X-Auth-User": ACCESS_KEY, "X-Auth-Key": SECRET_KEY},
            )
            with urllib.request.urlopen(auth, timeout=5) as r:
                token, url = r.headers["X-Auth-Token"], r.headers["X-Storage-Url"]
            put = urllib.request.Request(
                f"{url}/{bucket}", method="PUT", headers={"X-Auth-Token": token}
            )
            with urllib.request.urlopen(put, timeout=10) as r:
                if r.status in (201, 202):
                    return
        except (OSError, urllib.error.URLError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("Swift did not come up in time (see swift.log)")
        time.sleep(0.2)


@contextlib.contextmanager
def real_s3_or_skip(base: Path) -> Iterator[tuple[SwiftS3, bool]]:
    """A real S3 endpoint: ``ORBITMQ_TEST_S3_ENDPOINT`` (with _BUCKET, _ACCESS_KEY,
    _SECRET_KEY) when set, else Swift's s3api started under ``base`` when Debian's Swift
    packages are installed and ``ORBITMQ_TEST_SWIFT=1`` (``make test-s3``); otherwise the test
    is skipped, saying which. The bool: it is Swift (no conditional puts)."""
    env = os.environ
    if env.get("ORBITMQ_TEST_S3_ENDPOINT"):
        yield SwiftS3(
            env["ORBITMQ_TEST_S3_ENDPOINT"], env.get("ORBITMQ_TEST_S3_BUCKET", "orbitmq"),
            env.get("ORBITMQ_TEST_S3_ACCESS_KEY", ""), env.get("ORBITMQ_TEST_S3_SECRET_KEY", ""),
        ), False  # fmt: skip
        return
    lacking = missing()
    if lacking:
        pytest.skip(
            f"no S3-compatible server: Swift is not installed ({', '.join(lacking)} missing; "
            "`make test-s3` installs Debian's swift-* and memcached and runs these tests), and "
            "ORBITMQ_TEST_S3_ENDPOINT is not set"
        )
    if env.get("ORBITMQ_TEST_SWIFT") != "1":
        pytest.skip(
            "Swift is installed but starting it takes 15-50 s on a loaded 2-core machine: "
            "`make test-s3` (or ORBITMQ_TEST_SWIFT=1) runs these tests against it"
        )
    with swift_s3(base) as server:
        yield server, True


def s3_settings(s3: SwiftS3, prefix: str) -> dict[str, object]:
    """The ``[store]`` settings of a tier on ``s3``, its objects under ``prefix``."""
    return {
        "tier_backend": "s3",
        "tier_s3_endpoint": s3.endpoint,
        "tier_s3_bucket": s3.bucket,
        "tier_s3_access_key": s3.access_key,
        "tier_s3_secret_key": s3.secret_key,
        "tier_s3_prefix": prefix,
        "tier_s3_allow_http": s3.endpoint.startswith("http:"),
    }


TierSettings = Callable[[Path], dict[str, object]]
"""The ``[store]`` tier settings of one broker, given a folder of its own (for the directory
backend's root, or the S3 prefix's name)."""

BACKENDS = ("directory", "s3")


@contextlib.contextmanager
def tier_backend(kind: str, base: Path) -> Iterator[TierSettings]:
    """The tier settings for ``kind``: a directory always; S3 on a real endpoint
    (:func:`real_s3_or_skip`, so the test is skipped, saying why, where there is none)."""
    if kind == "directory":
        yield lambda folder: {"tier_backend": "directory", "tier_path": str(folder / "tier")}
        return
    pytest.importorskip("obstore", reason="the tier-s3 extra (obstore) is not installed")
    with real_s3_or_skip(base) as (s3, _is_swift):
        yield lambda folder: s3_settings(s3, f"t-{os.getpid()}-{folder.name}")

"""The S3 backend over TLS, against a real S3 endpoint: Swift's s3api (tests/store/tier/swift.py)
behind a TLS-terminating relay on 127.0.0.1 (tests/store/tier/tls_relay.py) whose certificate a
throwaway CA signs (tests/net/pki.py). With the CA in ``tier_s3_ca_file`` the backend stores and
reads chunks over https; an untrusted certificate (system roots only, another CA, expired, another
name) is refused, which the tier reports as unavailable (cold reads retryable, never an empty
tier). Skipped, saying why, where there is no Swift (``make test-s3`` runs it). The settings'
checks need no server and always run."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

pytest.importorskip("obstore", reason="the tier-s3 extra (obstore) is not installed")

from obstore.exceptions import GenericError

from orbitmq.common.errors import ConfigError, TierUnavailableError
from orbitmq.common.message import Message, MessageBatch
from orbitmq.store.config import StoreConfig
from orbitmq.store.message_store import MessageStore
from orbitmq.store.tier.s3 import S3Backend
from tests.net.pki import Ca
from tests.store.conftest import small_config
from tests.store.tier.swift import SwiftS3, real_s3_or_skip, s3_settings
from tests.store.tier.test_s3_backend import read_queue
from tests.store.tier.tls_relay import TlsRelay, tls_relay


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA the tests trust
    good: tuple[Path, Path]  # 127.0.0.1 / localhost, signed by it
    other_ca: tuple[Path, Path]  # the same names, signed by a CA nobody trusts
    expired: tuple[Path, Path]  # signed by the trusted CA, validity ended yesterday
    wrong_name: tuple[Path, Path]  # signed by the trusted CA, for another host


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca, other = Ca.make(folder, "tier-ca"), Ca.make(folder, "other-ca")
    (folder / "other").mkdir()
    (folder / "expired").mkdir()
    return Pki(
        ca.file,
        ca.issue(folder, "localhost", ip="127.0.0.1"),
        other.issue(folder / "other", "localhost", ip="127.0.0.1"),
        ca.issue(folder / "expired", "localhost", ip="127.0.0.1", expired=True),
        ca.issue(folder, "elsewhere.test"),
    )


def config(tmp_path: Path, **over: object) -> StoreConfig:
    options: dict[str, object] = {
        "tier_backend": "s3",
        "tier_s3_bucket": "b",
        "tier_s3_endpoint": "https://127.0.0.1:9",
        **over,
    }
    return small_config(tmp_path / "store", **options)


# ------------------------------------------------------------------ settings (no server)


def test_tls_settings_reach_obstore(tmp_path: Path, pki: Pki) -> None:
    def options(**over: object) -> dict[str, object]:
        got = S3Backend.from_config(config(tmp_path, **over)).store.client_options
        assert got is not None
        return dict(got)  # obstore hands its options back as strings

    aws = options(tier_s3_endpoint="")
    assert aws["allow_http"] == "false"
    assert "root_certificate" not in aws  # the system's roots
    assert "allow_invalid_certificates" not in aws
    # An https endpoint never gets plain HTTP, whatever tier_s3_allow_http says.
    assert options(tier_s3_allow_http=True)["allow_http"] == "false"
    assert options(tier_s3_ca_file=str(pki.ca))["root_certificate"] == pki.ca.read_bytes()
    assert options(tier_s3_allow_invalid_certificates=True)["allow_invalid_certificates"] == "true"
    plain = options(tier_s3_endpoint="http://127.0.0.1:9", tier_s3_allow_http=True)
    assert plain["allow_http"] == "true"
    b = S3Backend.from_config(config(tmp_path, tier_s3_max_retries=2))
    assert b.store.retry_config is not None and b.store.retry_config["max_retries"] == 2


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"tier_s3_endpoint": "http://127.0.0.1:9"}, "plain HTTP"),
        ({"tier_s3_endpoint": "ftp://127.0.0.1:9"}, "must be https:// or http://"),
        ({"tier_s3_ca_file": "{tmp}/absent.pem"}, "tier_s3_ca_file"),
        ({"tier_s3_ca_file": "{tmp}/not.pem"}, "no PEM certificate"),
        ({"tier_s3_ca_file": "{tmp}/broken.pem"}, "obstore refused"),
        ({"tier_s3_endpoint": "http://127.0.0.1:9", "tier_s3_allow_http": True,
          "tier_s3_ca_file": "{ca}"}, "need an https:// endpoint"),
        ({"tier_s3_endpoint": "http://127.0.0.1:9", "tier_s3_allow_http": True,
          "tier_s3_allow_invalid_certificates": True}, "need an https:// endpoint"),
        ({"tier_s3_ca_file": "{ca}", "tier_s3_allow_invalid_certificates": True}, "contradict"),
    ],
)  # fmt: skip
def test_contradictory_tls_settings_fail_the_start(
    tmp_path: Path, pki: Pki, over: dict[str, object], message: str
) -> None:
    (tmp_path / "not.pem").write_text("hello\n")
    (tmp_path / "broken.pem").write_text(
        "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n"
    )
    values = {
        k: v.format(tmp=tmp_path, ca=pki.ca) if isinstance(v, str) else v for k, v in over.items()
    }
    with pytest.raises(ConfigError, match=message):
        S3Backend.from_config(config(tmp_path, **values))


# ------------------------------------------------------------------ a real endpoint over TLS


@pytest.fixture(scope="module")
def swift(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SwiftS3]:
    with real_s3_or_skip(tmp_path_factory.mktemp("swift")) as (server, _is_swift):
        if urlsplit(server.endpoint).scheme != "http":
            pytest.skip("the TLS relay fronts a plain-HTTP S3 endpoint; this one is https")
        yield server


def upstream(s3: SwiftS3) -> tuple[str, int]:
    url = urlsplit(s3.endpoint)
    return url.hostname or "127.0.0.1", url.port or 80


def tls_config(tmp_path: Path, s3: SwiftS3, relay: TlsRelay, **over: object) -> StoreConfig:
    options: dict[str, object] = {
        "mapped_file_size_commit_log": 72 * 1024,
        "max_message_size": 4096,
        **s3_settings(s3, f"tls-{tmp_path.name}"),
        "tier_s3_endpoint": f"https://127.0.0.1:{relay.port}",
        "tier_s3_allow_http": False,
        "tier_s3_max_retries": 1,  # a refused certificate fails the call in well under 1 s
        "tier_upload_interval_ms": 3_600_000,
        "tier_local_retention_ms": 0,
        "delete_when": ";".join(str(h) for h in range(24)),
    }
    options.update(over)
    return small_config(tmp_path / "store", **options)


def test_the_backend_over_https_with_the_ca_configured(
    tmp_path: Path, pki: Pki, swift: SwiftS3
) -> None:
    with tls_relay(upstream(swift), *pki.good) as relay:
        b = S3Backend.from_config(tls_config(tmp_path, swift, relay, tier_s3_ca_file=str(pki.ca)))
        b.probe()
        assert b.conditional_puts is not None
        b.put("k/1", b"over tls")
        try:
            assert b.get("k/1") == b"over tls" and b.get_range("k/1", 5, 3) == b"tls"
            assert b.list("k/") == ["k/1"]
        finally:
            b.delete("k/1")
        assert b.list("k/") == []
        assert relay.stats.handshakes >= 1 and relay.stats.refused == 0, relay.stats


@pytest.mark.parametrize("case", ["system roots only", "another CA", "expired", "another name"])
def test_an_untrusted_certificate_is_refused(
    tmp_path: Path, pki: Pki, swift: SwiftS3, case: str
) -> None:
    cert = {"system roots only": pki.good, "another CA": pki.other_ca,
            "expired": pki.expired, "another name": pki.wrong_name}[case]  # fmt: skip
    ca = "" if case == "system roots only" else str(pki.ca)
    with tls_relay(upstream(swift), *cert) as relay:
        b = S3Backend.from_config(
            tls_config(tmp_path, swift, relay, tier_s3_ca_file=ca, tier_s3_max_retries=0)
        )
        with pytest.raises(GenericError, match="error sending request"):
            b.probe()
        assert b.conditional_puts is None  # a TLS failure is not "no conditional puts"
        with pytest.raises(GenericError, match="error sending request"):
            b.list("")
        assert relay.wait_refused(2) and relay.stats.handshakes == 0, relay.stats


def test_allow_invalid_certificates_accepts_any_certificate(
    tmp_path: Path, pki: Pki, swift: SwiftS3
) -> None:
    with tls_relay(upstream(swift), *pki.other_ca) as relay:
        b = S3Backend.from_config(
            tls_config(tmp_path, swift, relay, tier_s3_allow_invalid_certificates=True)
        )
        b.put("k/2", b"unverified")
        try:
            assert b.get("k/2") == b"unverified"
        finally:
            b.delete("k/2")
        assert relay.stats.handshakes >= 1 and relay.stats.refused == 0, relay.stats


_ENV_CHILD = """
import json, sys
from pathlib import Path
from orbitmq.store.config import StoreConfig
from orbitmq.store.tier.s3 import S3Backend
b = S3Backend.from_config(StoreConfig(store_path=Path(sys.argv[1]), **json.loads(sys.argv[2])))
b.put("env/1", b"roots from the environment")
print(b.get("env/1").decode())
b.delete("env/1")
"""


def test_ssl_cert_file_in_the_environment_sets_the_roots(
    tmp_path: Path, pki: Pki, swift: SwiftS3
) -> None:
    """What docs/tiered-storage.md says of the system's roots: obstore reads them where
    SSL_CERT_FILE points (a process of its own: obstore loads them once per process)."""
    with tls_relay(upstream(swift), *pki.good) as relay:
        names = ("tier_backend", "tier_s3_endpoint", "tier_s3_bucket", "tier_s3_access_key",
                 "tier_s3_secret_key", "tier_s3_prefix", "tier_s3_max_retries")  # fmt: skip
        cfg = tls_config(tmp_path, swift, relay)
        settings = json.dumps({n: getattr(cfg, n) for n in names})
        env = {**os.environ, "SSL_CERT_FILE": str(pki.ca)}
        run = subprocess.run(
            [sys.executable, "-c", _ENV_CHILD, str(tmp_path / "child"), settings],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.strip() == "roots from the environment"
        assert relay.stats.handshakes >= 1 and relay.stats.refused == 0, relay.stats


def test_a_store_tiers_over_https_and_an_untrusted_endpoint_is_an_outage(
    tmp_path: Path, pki: Pki, swift: SwiftS3
) -> None:
    """Chunks uploaded and read back over https; the same store reopened without the CA sees
    the tier as unavailable (cold reads retryable, nothing written, nothing taken for an empty
    tier); reopened with the CA again, everything reads back."""
    with tls_relay(upstream(swift), *pki.good) as relay:
        trusted = tls_config(tmp_path, swift, relay, tier_s3_ca_file=str(pki.ca))
        sent = _tier_a_queue(MessageStore(trusted))
        handshakes_before = relay.stats.handshakes

        store = MessageStore(tls_config(tmp_path, swift, relay))  # system roots: untrusted
        store.open()
        try:
            assert store.tier is not None
            with pytest.raises(GenericError, match="error sending request"):
                store.tier.run_once()
            assert not store.tier.loaded and store.tier.manifests == {}
            local_min = store.queues.get("T", 0).min_offset  # type: ignore[union-attr]
            assert local_min > 0
            with pytest.raises(TierUnavailableError):  # retryable: SERVICE_NOT_AVAILABLE
                store.get_messages("T", 0, 0, max_count=64)
            store.retention.run()
            assert store.queues.get("T", 0).min_offset == local_min  # type: ignore[union-attr]
        finally:
            store.close()
        assert relay.wait_refused(1) and relay.stats.handshakes == handshakes_before, relay.stats

        store = MessageStore(trusted)
        store.open()
        try:
            assert store.tier is not None
            store.tier.run_once()  # the catalog, loaded over https (the thread may be slower)
            assert store.tier.loaded
            assert read_queue(store) == sent
            assert store.tier.cache.gets > 0  # chunks fetched over https
        finally:
            store.close()
        assert relay.stats.handshakes > handshakes_before


def _tier_a_queue(store: MessageStore) -> list[bytes]:
    """Send, upload over https, delete the local segments, read back from the tier."""
    store.open()
    sent: list[bytes] = []
    try:
        assert store.tier is not None
        for r in range(40):
            msgs = [Message("T", f"tls-{r}-{j}-".encode() * 20) for j in range(8)]
            store.put(MessageBatch.of("T", 0, msgs))
            sent.extend(m.body for m in msgs)
        assert store.wait_for_dispatch()
        store.commit_log.flush()
        store.tier.run_once()
        assert store.tier.loaded
        store.retention.run()
        assert store.queues.get("T", 0).min_offset > 0  # type: ignore[union-attr]
        assert read_queue(store) == sent
    finally:
        store.close()
    return sent


def test_no_relay_left_behind(pki: Pki) -> None:
    """The relay stops its thread and closes its port when its context ends (no Swift)."""
    with tls_relay(("127.0.0.1", 9), *pki.good) as relay:
        port = relay.port
        assert relay._thread.is_alive()
    assert not relay._thread.is_alive()
    with socket.socket() as s, pytest.raises(OSError):
        s.settimeout(2)
        s.connect(("127.0.0.1", port))

"""The S3 backend, on obstore (optional extra ``orbitmq[tier-s3]``): any S3-compatible store.

obstore (Rust ``object_store``) was chosen in the research brief over boto3/aiobotocore: no
botocore, reads land in buffers without copies, multipart uploads are automatic, and its own
retries and timeouts are configurable. Calls are the blocking ones: they run on the tier thread
or a broker reader thread, never on an event loop.

**Conditional puts are probed at start** (:meth:`S3Backend.probe`): a ``put(mode="create")``
on a key that exists must fail with ``AlreadyExistsError``. OpenStack Swift's ``s3api`` answers
``NotImplemented`` (501) to every conditional PUT, even of a new key; ``conditional_puts``
records which it is. OrbitMQ's keys are already
immutable and only one broker writes its prefix, so nothing depends on it yet: it is reported
in ``orbitmq tier status`` for the day two writers may share a prefix.

**TLS** (:func:`client_options`): an ``https://`` endpoint (or AWS, the default) is verified
against the system's roots plus ``tier_s3_ca_file``; plain HTTP only for an ``http://``
endpoint with ``tier_s3_allow_http``. A certificate that fails verification is a connection
error like any other: the call fails after obstore's retries, the tier is unavailable (cold
reads retryable, nothing deleted) and the tier thread keeps retrying.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import obstore
from obstore.exceptions import AlreadyExistsError, NotFoundError
from obstore.store import S3Store

from orbitmq.common.errors import ConfigError
from orbitmq.store.config import StoreConfig
from orbitmq.store.tier.backend import TierBackend, check_key

if TYPE_CHECKING:
    from obstore.store import ClientConfig

log = logging.getLogger(__name__)


class S3Backend(TierBackend):
    name = "s3"

    def __init__(self, store: S3Store, description: str) -> None:
        self.store = store
        self.description = description
        self.conditional_puts: bool | None = None

    @classmethod
    def from_config(cls, config: StoreConfig) -> S3Backend:
        if not config.tier_s3_bucket:
            raise ConfigError("store.tier_s3_bucket must be set when tier_backend = s3")
        options: dict[str, str] = {"region": config.tier_s3_region}
        if config.tier_s3_endpoint:
            options["endpoint"] = config.tier_s3_endpoint
        if config.tier_s3_access_key:
            options["access_key_id"] = config.tier_s3_access_key
            options["secret_access_key"] = config.tier_s3_secret_key
        client = client_options(config)
        try:
            store = S3Store(
                config.tier_s3_bucket,
                prefix=config.tier_s3_prefix or None,
                client_options=client,
                retry_config={"max_retries": config.tier_s3_max_retries},
                **options,  # type: ignore[arg-type]  # keys are S3Config's, values all str
            )
        except Exception as exc:  # obstore's config errors have no common base worth naming
            raise ConfigError(f"store.tier_s3_*: obstore refused the settings: {exc}") from exc
        where = config.tier_s3_endpoint or "aws"
        return cls(store, f"s3 {where}/{config.tier_s3_bucket}/{config.tier_s3_prefix}")

    def describe(self) -> str:
        return self.description

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        obstore.put(self.store, check_key(key), bytes(data))

    def get(self, key: str) -> bytes:
        return obstore.get(self.store, check_key(key)).bytes().to_bytes()

    def get_range(self, key: str, start: int, length: int) -> bytes:
        return obstore.get_range(self.store, check_key(key), start=start, length=length).to_bytes()

    def list(self, prefix: str) -> list[str]:
        """Every key starting with ``prefix`` as a string. obstore lists by whole path
        segments (``a/b`` finds ``a/b/c``, never the key ``a/b`` itself nor ``a/bc``), so a
        prefix that ends inside a segment (the identity marker ``orbitmq-tier.json``) is
        listed one level up, without recursion, and only the matching folders are walked."""
        if not prefix or prefix.endswith("/"):
            return sorted(_walk(self.store, prefix))
        folder = prefix[: prefix.rfind("/") + 1]
        level = obstore.list_with_delimiter(self.store, folder or None)
        out = [meta["path"] for meta in level["objects"] if meta["path"].startswith(prefix)]
        for sub in level["common_prefixes"]:
            if sub.startswith(prefix):
                out.extend(_walk(self.store, sub.rstrip("/") + "/"))
        return sorted(out)

    def delete(self, key: str) -> None:
        with contextlib.suppress(NotFoundError):
            obstore.delete(self.store, check_key(key))

    def probe(self) -> None:
        """Find out whether the store honours ``If-None-Match: *`` (sets ``conditional_puts``)."""
        key = f"_probe/{secrets.token_hex(8)}"
        try:
            obstore.put(self.store, key, b"1", mode="create")
        except Exception as exc:
            if not _not_implemented(exc):
                raise  # unreachable or refusing: the tier thread retries the load
            # Swift's s3api refuses every conditional PUT with 501, even of a new key.
            self.conditional_puts = False
            return
        try:
            obstore.put(self.store, key, b"2", mode="create")
            self.conditional_puts = False
        except AlreadyExistsError:
            self.conditional_puts = True
        except Exception:  # noqa: BLE001 - NotImplemented and kin: conditional puts unsupported
            self.conditional_puts = False
        finally:
            self.delete(key)


def _walk(store: S3Store, folder: str) -> list[str]:
    """Every key under ``folder`` ("" or ending in "/"), recursively."""
    out: list[str] = []
    for batch in obstore.list(store, folder or None):
        out.extend(meta["path"] for meta in batch)
    return [k for k in out if k.startswith(folder)]


def client_options(config: StoreConfig) -> ClientConfig:
    """obstore's HTTP client options for ``config``: TLS unless the endpoint says ``http://``.

    obstore (reqwest on rustls) verifies an https endpoint's certificate chain against the
    system's roots (the OS trust store, which ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` in the
    environment replace), its validity dates and its name (DNS name or IP address of the URL).
    ``tier_s3_ca_file`` adds roots (``root_certificate``); ``allow_invalid_certificates`` turns
    verification off. Plain HTTP is allowed only for an ``http://`` endpoint with
    ``tier_s3_allow_http``: an https endpoint gets ``allow_http = False`` whatever the setting
    says, so its client refuses any plain-HTTP request. Contradictions are config errors
    at start, not a tier that fails every request forever.
    """
    endpoint = config.tier_s3_endpoint
    scheme = urlsplit(endpoint).scheme.lower() if endpoint else "https"
    if scheme not in ("http", "https"):
        raise ConfigError(f"store.tier_s3_endpoint = {endpoint!r}: must be https:// or http://")
    plain = scheme == "http"
    if plain and not config.tier_s3_allow_http:
        raise ConfigError(
            f"store.tier_s3_endpoint = {endpoint!r} is plain HTTP (no TLS): use https://, or "
            "set store.tier_s3_allow_http = true to accept it"
        )
    if plain and (config.tier_s3_ca_file or config.tier_s3_allow_invalid_certificates):
        raise ConfigError(
            f"store.tier_s3_ca_file / tier_s3_allow_invalid_certificates need an https:// "
            f"endpoint, not {endpoint!r}"
        )
    if config.tier_s3_ca_file and config.tier_s3_allow_invalid_certificates:
        raise ConfigError(
            "store.tier_s3_ca_file and tier_s3_allow_invalid_certificates contradict each "
            "other: with a CA file the certificate can be verified"
        )
    options: ClientConfig = {
        "allow_http": plain,
        "timeout": timedelta(seconds=30),
        "connect_timeout": timedelta(seconds=5),
    }
    if config.tier_s3_ca_file:
        options["root_certificate"] = read_ca_file(config.tier_s3_ca_file)
    if config.tier_s3_allow_invalid_certificates:
        log.warning(
            "tier %s: certificate verification is OFF (tier_s3_allow_invalid_certificates): "
            "anyone on the path can read and change the tier",
            endpoint or "aws",
        )
        options["allow_invalid_certificates"] = True
    return options


def read_ca_file(path: str) -> bytes:
    """The PEM certificates of ``tier_s3_ca_file`` (a ConfigError when there are none)."""
    try:
        pem = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"store.tier_s3_ca_file = {path!r}: {exc}") from exc
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        raise ConfigError(f"store.tier_s3_ca_file = {path!r}: no PEM certificate in it")
    return pem


def _not_implemented(exc: Exception) -> bool:
    """Whether a failed PUT was refused as not implemented (HTTP 501, S3's NotImplemented).
    The status line or the S3 error code, not a bare "501": the message also holds the URL,
    whose port may contain those digits (a TLS failure must stay a failure)."""
    text = str(exc)
    return "501 Not Implemented" in text or "<Code>NotImplemented</Code>" in text

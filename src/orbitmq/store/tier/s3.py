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
"""

from __future__ import annotations

import contextlib
import secrets
from datetime import timedelta

import obstore
from obstore.exceptions import AlreadyExistsError, NotFoundError
from obstore.store import S3Store

from orbitmq.common.errors import ConfigError
from orbitmq.store.config import StoreConfig
from orbitmq.store.tier.backend import TierBackend, check_key


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
        store = S3Store(
            config.tier_s3_bucket,
            prefix=config.tier_s3_prefix or None,
            client_options={
                "allow_http": config.tier_s3_allow_http,
                "timeout": timedelta(seconds=30),
                "connect_timeout": timedelta(seconds=5),
            },
            **options,  # type: ignore[arg-type]  # keys are S3Config's, values all str
        )
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


def _not_implemented(exc: Exception) -> bool:
    """Whether a failed PUT was refused as not implemented (HTTP 501, S3's NotImplemented)."""
    text = str(exc)
    return "501" in text or "NotImplemented" in text

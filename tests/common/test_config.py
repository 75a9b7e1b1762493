"""Config fields declared with `setting`: the check on the field refuses a bad value wherever
the config is built, and the docs come from the same declaration."""

from __future__ import annotations

import dataclasses

import pytest

from orbitmq.broker.config import BrokerConfig
from orbitmq.common.config import (
    PORT,
    at_least,
    between,
    check_settings,
    documented,
    one_of,
    optional,
    setting,
)
from orbitmq.common.errors import ConfigError
from orbitmq.namesrv.config import NamesrvConfig
from orbitmq.proxy.config import ProxyConfig
from orbitmq.store.config import StoreConfig


@dataclasses.dataclass(frozen=True)
class Sample:
    count: int = setting(8, "How many.", at_least(1))
    mode: str = setting("a", "Which.", one_of("a", "b"))
    port: int | None = setting(None, "Optional port.", optional(PORT))
    free: str = setting("x", "Anything goes.")

    def __post_init__(self) -> None:
        check_settings(self, "sample")


def test_checks_accept_valid_and_name_the_bad_setting() -> None:
    Sample(count=1, mode="b", port=0)
    with pytest.raises(ConfigError, match=r"sample\.count = 0: must be >= 1"):
        Sample(count=0)
    with pytest.raises(ConfigError, match=r"sample\.mode = 'c': must be one of a, b"):
        Sample(mode="c")
    with pytest.raises(ConfigError, match=r"sample\.port = 70000"):
        Sample(port=70000)
    with pytest.raises(ConfigError, match=r"sample\.count"):
        Sample(count="many")  # type: ignore[arg-type]  # a wrong type fails the check


def test_documented_lists_default_doc_and_valid_values() -> None:
    docs = {d.name: d for d in documented(Sample)}
    assert docs["count"].default == 8 and docs["count"].doc == "How many."
    assert docs["count"].valid == ">= 1"
    assert docs["port"].valid == "0..65535, or none"
    assert docs["free"].valid == ""
    assert between(0, 5).describe == "0..5"


@pytest.mark.parametrize(
    ("cls", "bad", "match"),
    [
        (BrokerConfig, {"port": 65536}, r"broker\.port"),
        (BrokerConfig, {"default_queue_nums": 0}, r"broker\.default_queue_nums"),
        (NamesrvConfig, {"port": -1}, r"namesrv\.port"),
        (StoreConfig, {"max_index_num": 0}, r"store\.max_index_num"),
        (ProxyConfig, {"tls_mode": "sometimes"}, r"proxy\.tls_mode"),
        (ProxyConfig, {"receive_batch_max": 0}, r"proxy\.receive_batch_max"),
    ],
)
def test_every_server_config_checks_its_fields(
    cls: type, bad: dict[str, object], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        cls(**bad)


@pytest.mark.parametrize("cls", [BrokerConfig, NamesrvConfig, StoreConfig, ProxyConfig])
def test_every_setting_is_documented(cls: type) -> None:
    docs = documented(cls)
    assert docs and all(d.doc for d in docs)
    nested = {f.name for f in dataclasses.fields(cls) if "doc" not in f.metadata}
    assert nested <= {"store"}

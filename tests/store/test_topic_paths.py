"""A topic or group name can never name a path outside its directory: a dotted Kafka name
(``orders.v1``) is an ordinary directory, ``.``/``..`` and separators never reach one (the
entry points refuse them, and the store refuses them again where a name becomes a path)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from orbitmq.client.offset_store import _safe_name
from orbitmq.common.errors import InvalidTopicError
from orbitmq.common.message import MessageBatch
from orbitmq.store.consume_queue import ConsumeQueue
from orbitmq.store.layout import CONSUMEQUEUE_DIR, topic_dir
from orbitmq.store.message_store import MessageStore
from orbitmq.store.segment import FileOps

_BAD = ["", ".", "..", "../x", "a/b", "/abs", "a\\b", "a\0b"]


@pytest.mark.parametrize("topic", _BAD)
def test_topic_dir_refuses_what_is_not_one_plain_component(tmp_path: Path, topic: str) -> None:
    with pytest.raises(ValueError):
        topic_dir(tmp_path, topic)


@pytest.mark.parametrize("topic", _BAD)
def test_consume_queue_never_opens_outside_its_root(tmp_path: Path, topic: str) -> None:
    with pytest.raises(ValueError):
        ConsumeQueue(tmp_path / "cq", topic, 0, 64, FileOps())
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_dotted_topic_is_a_directory_and_dot_names_are_refused(
    make_store: Callable[..., MessageStore],
) -> None:
    store = make_store()
    root = store.root / CONSUMEQUEUE_DIR
    before = store.commit_log.max_offset
    for bad in (".", "..", "../escape", "a/b"):
        with pytest.raises(InvalidTopicError):
            store.put(MessageBatch.of(bad, 0, [b"x"]))
    assert store.commit_log.max_offset == before  # nothing written
    store.put(MessageBatch.of("orders.v1", 0, [b"x"]))
    assert store.wait_for_dispatch()
    assert store.max_offset("orders.v1", 0) == 1
    assert (root / "orders.v1" / "0").is_dir()
    with pytest.raises(ValueError):
        store.delete_topic("..")  # would rmdir the store's own directory's parent entry
    assert root.is_dir() and store.root.is_dir()
    assert store.delete_topic("orders.v1") == 1
    assert not (root / "orders.v1").exists()


@pytest.mark.parametrize(
    ("group", "file_name"),
    [("my.app", "my.app"), (".", "_."), ("..", "_.."), ("a/../b", "a_.._b"), ("", "_")],
)
def test_client_offset_file_names_stay_in_their_directory(group: str, file_name: str) -> None:
    assert _safe_name(group) == file_name

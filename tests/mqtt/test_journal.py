"""The MQTT gateway's journal: replay, deletes, a torn tail, compaction; and session JSON."""

from __future__ import annotations

from pathlib import Path

from orbitmq.mqtt import journal as journal_mod
from orbitmq.mqtt.journal import Journal
from orbitmq.mqtt.session import Inflight, Session, SubOptions


def test_replay_and_delete(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.load()
    j.put("a", {"x": 1})
    j.put("b", [1, 2])
    j.put("a", {"x": 2})
    j.delete("b")
    j.close()
    again = Journal(tmp_path / "j")
    assert again.load() == {"a": {"x": 2}}
    again.close()


def test_torn_tail_is_dropped_and_the_file_repaired(tmp_path: Path) -> None:
    path = tmp_path / "j"
    j = Journal(path)
    j.load()
    j.put("kept", 1)
    j.close()
    with path.open("ab") as f:
        f.write(b'["lost", {"half":')  # a crash inside a write
    again = Journal(path)
    assert again.load() == {"kept": 1}
    again.put("next", 2)
    again.close()
    assert Journal(path).load() == {"kept": 1, "next": 2}


def test_compaction_keeps_live_keys(tmp_path: Path, monkeypatch: object) -> None:
    monkeypatch.setattr(journal_mod, "COMPACT_FLOOR", 10)  # type: ignore[attr-defined]
    path = tmp_path / "j"
    j = Journal(path)
    j.load()
    for i in range(100):
        j.put(f"k{i % 3}", i)
    j.close()
    assert len(path.read_bytes().splitlines()) < 30
    assert Journal(path).load() == {"k0": 99, "k1": 97, "k2": 98}


def test_session_json_round_trip() -> None:
    s = Session("dev", 3600)
    s.subs["a/#"] = SubOptions("a/#", 2, True, False, 5)
    s.cursors["a/0"] = 17
    s.inflight[3] = Inflight(2, "a", 0, 16, None, "$share/g/a/#", (5,), True, True)
    s.inbound_qos2 = {9}
    s.storing_qos2 = {4: ("a", 1, 20)}
    back = Session.from_json("dev", s.to_json())
    assert back == s

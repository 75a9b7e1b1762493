"""Brief T1 on Remoting: users x resources x request kinds, every cell decided by the live
broker and NameServer and compared with a reference evaluation of section 2.4 written here
(independent of orbitmq.auth's model and request table)."""

from __future__ import annotations

from typing import Any

from orbitmq.common.codes import ResponseCode
from orbitmq.protocol.bodies import TopicConfig, encode_body
from orbitmq.protocol.codes import RequestCode as R
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.messages import encode_send_body
from orbitmq.protocol.signature import Signer
from tests.auth.conftest import SECRETS, Cluster

# conftest.seed's ACLs as (type, pattern, actions, decision); pattern "x*" is a prefix.
ACLS: dict[str, list[tuple[str, str, set[str], str]]] = {
    "alice": [("Topic", "orders", {"Pub", "Sub"}, "Allow"), ("Group", "g1", {"Sub"}, "Allow")],
    "bob": [
        ("Topic", "ord*", {"Pub", "Sub", "Get"}, "Allow"),
        ("Topic", "orders-secret", {"All"}, "Deny"),
        ("Group", "g*", {"Sub", "Get"}, "Allow"),
    ],
    "carol": [],
}


def reference(user: str, needs: list[tuple[str, str, set[str]]]) -> bool:
    if user == "admin":
        return True
    for rtype, name, wanted in needs:
        if rtype == "Topic" and name.startswith("%RETRY%"):
            # RocketMQ: Group Sub; OrbitMQ keeps admin actions asked alone (security.md)
            rtype, name = "Group", name[len("%RETRY%") :]
            wanted = {"Sub"} if wanted & {"Pub", "Sub", "Get"} else wanted
        ranked = []
        for etype, pattern, acts, decision in ACLS[user]:
            if etype != rtype or not (acts & wanted or "All" in acts):
                continue
            if pattern.endswith("*"):
                if not name.startswith(pattern[:-1]):
                    continue
                rank = (1, -len(pattern))
            elif pattern == name:
                rank = (0, -len(pattern))
            else:
                continue
            ranked.append((rank, 0 if decision == "Deny" else 1, decision))
        if not ranked or min(ranked)[2] != "Allow":
            return False
    return True


TOPICS = ["orders", "ordx", "orders-secret", "payments", "%RETRY%g1", "%RETRY%h1"]
GROUPS = ["g1", "g7", "h1"]


def cells() -> list[tuple[str, Frame, list[tuple[str, str, set[str]]]]]:
    out: list[tuple[str, Frame, list[tuple[str, str, set[str]]]]] = []
    body = encode_send_body([b"m"], [b""])
    for t in TOPICS:
        out += [
            ("b", Frame(R.SEND_MESSAGE, fields={"topic": t, "queue_id": 0}, body=body),
             [("Topic", t, {"Pub"})]),
            ("b", Frame(R.GET_MAX_OFFSET, fields={"topic": t, "queue_id": 0}),
             [("Topic", t, {"Sub", "Get"})]),
            ("b", Frame(R.GET_TOPIC_STATS, fields={"topic": t}), [("Topic", t, {"Get"})]),
            ("b", Frame(R.UPDATE_AND_CREATE_TOPIC, body=encode_body(TopicConfig(topic_name=t))),
             [("Topic", t, {"Create", "Update"})]),
            ("n", Frame(R.GET_ROUTEINFO_BY_TOPIC, fields={"topic": t}),
             [("Topic", t, {"Pub", "Sub", "Get"})]),
        ]  # fmt: skip
        for g in GROUPS:
            pull = {"topic": t, "queue_id": 0, "queue_offset": 0, "group": g}
            out.append(
                ("b", Frame(R.PULL_MESSAGE, fields=pull),
                 [("Topic", t, {"Sub"}), ("Group", g, {"Sub"})])
            )  # fmt: skip
    for g in GROUPS:
        out += [
            ("b", Frame(R.GET_CONSUMER_LIST_BY_GROUP, fields={"group": g}),
             [("Group", g, {"Sub", "Get"})]),
            ("b", Frame(R.GET_CONSUME_STATS, fields={"group": g}), [("Group", g, {"Get"})]),
        ]  # fmt: skip
    cluster = [("Cluster", "DefaultCluster", {"Get", "List"})]
    out += [
        ("n", Frame(R.GET_BROKER_CLUSTER_INFO), [("Cluster", "DefaultCluster", {"Get"})]),
        (
            "n",
            Frame(R.GET_ALL_TOPIC_LIST_FROM_NAMESERVER),
            [("Cluster", "DefaultCluster", {"List"})],
        ),
        ("b", Frame(R.GET_ALL_TOPIC_CONFIG), cluster),
        ("b", Frame(R.GET_BROKER_CONFIG), [("Cluster", "DefaultCluster", {"Get"})]),
        ("n", Frame(R.AUTH_LIST_USER), cluster),
    ]
    for t in TOPICS:  # deletions last: they change what the cells above see
        out.append(("b", Frame(R.DELETE_TOPIC_IN_BROKER, fields={"topic": t}),
                    [("Topic", t, {"Delete"})]))  # fmt: skip
    register = {"cluster": "DefaultCluster", "broker_name": "ghost", "broker_id": 0,
                "broker_addr": "127.0.0.9:10911"}  # fmt: skip
    out += [
        ("n", Frame(R.REGISTER_BROKER, fields=register), [("Cluster", "DefaultCluster", {"Update"})]),
        ("n", Frame(R.WIPE_WRITE_PERM_OF_BROKER, fields={"broker_name": "ghost"}),
         [("Cluster", "DefaultCluster", {"Update"})]),
        ("b", Frame(R.UPDATE_BROKER_CONFIG, body=b"long_polling_max_ms=5000\n"),
         [("Cluster", "DefaultCluster", {"Update"})]),
    ]  # fmt: skip
    return out


class _Peer:
    peer = "127.0.0.1:40001"
    transport = None


async def test_remoting_matrix_matches_the_reference(cluster: Cluster) -> None:
    wrong: list[str] = []
    total = 0
    for user in ("carol", "alice", "bob", "admin"):
        sign = Signer(user, SECRETS[user])
        for server, frame, needs in cells():
            f = Frame(frame.code, fields=dict(frame.fields), body=frame.body)
            sign(f)
            answer: Any
            if server == "b":
                answer = await cluster.broker.dispatcher.handle(f, _Peer())  # type: ignore[arg-type]
            else:
                answer = cluster.namesrv.processor.process(f, _Peer())
            if isinstance(answer, tuple):  # a pull's reply with its record buffers
                answer = answer[0]
            refused = answer.code == ResponseCode.NO_PERMISSION
            total += 1
            if refused == reference(user, needs):
                wrong.append(
                    f"{user} {R(f.code).name} {frame.fields}: {answer.code} {answer.remark}"
                )
    assert not wrong, "\n".join(wrong[:20])
    assert total > 200

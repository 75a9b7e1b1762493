"""KafkaConfig: the Kafka gateway's settings (the ``[kafka]`` table).

Defaults follow Apache Kafka's where a Kafka client would notice (port 9092, 100 MiB requests,
session timeouts 6 s - 30 min); the initial rebalance delay is shorter than Kafka's 3 s so a
single consumer starts at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from orbitmq.common.config import PORT, at_least, non_empty, setting


@dataclass(frozen=True, slots=True)
class KafkaConfig:
    namesrv_addrs: tuple[str, ...] = setting(
        ("127.0.0.1:9876",),
        "NameServers whose routes the gateway follows (it is a client of the brokers).",
        non_empty(),
    )
    host: str = setting("127.0.0.1", 'Listen address ("0.0.0.0" for every interface).')
    port: int = setting(9092, "Kafka listener port; 0 picks a free one.", PORT)
    advertised_host: str | None = setting(
        None,
        "Host clients are told to connect to (Metadata); None: the listen host. Set it when "
        "clients reach the gateway through another name (a wrong one is the classic 'bootstraps, "
        "then hangs').",
    )
    advertised_port: int | None = setting(None, "Port clients are told; None: the bound port.")
    node_id: int = setting(0, "This gateway's Kafka node id.", at_least(0))
    cluster_id: str = setting("orbitmq", "Cluster id reported in Metadata.", non_empty())
    auto_create_topics: bool = setting(
        True,
        "Create a topic a producer's Metadata asks for when it does not exist (Kafka's "
        "auto.create.topics.enable).",
    )
    default_partitions: int = setting(
        4, "Queues of a topic created automatically or with num_partitions -1.", at_least(1)
    )
    max_request_bytes: int = setting(
        100 * 1024 * 1024,
        "Largest request frame (Kafka's socket.request.max.bytes).",
        at_least(1024),
    )
    group_min_session_timeout_ms: int = setting(6000, "Smallest session timeout a member may ask.")
    group_max_session_timeout_ms: int = setting(
        1_800_000, "Largest session timeout a member may ask."
    )
    group_initial_rebalance_delay_ms: int = setting(
        300,
        "How long the first rebalance of an empty group waits for more members (Kafka: 3000).",
        at_least(0),
    )
    max_inflight_produce: int = setting(
        5,
        "Produce requests of one connection worked on at once (librdkafka sends up to "
        "max.in.flight=5); answers still go out in request order and each partition's batches "
        "are appended in request order. 1: one at a time, as before.",
        at_least(1),
    )
    idempotence_scan: int = setting(
        64,
        "Messages read back from a queue's end to rebuild an idempotent producer's last batches "
        "after a restart.",
        at_least(5),
    )

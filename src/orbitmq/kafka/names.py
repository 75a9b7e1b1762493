"""Which Kafka topic names and group ids the gateway accepts: those that are OrbitMQ names as-is.

A Kafka topic is the OrbitMQ topic of the same name and a Kafka group the OrbitMQ group of the
same name (docs/kafka.md), so `orbitmq topic list` and `orbitmq group describe` show them
unchanged and a RocketMQ client reaches the same topic and offsets under the name it knows. No
escaping: a reversible escape would show Kafka users a name they never chose, and could collide
with a RocketMQ name spelled like an escape. So a Kafka name OrbitMQ cannot hold is refused with
Kafka's own error code instead (INVALID_TOPIC_EXCEPTION, INVALID_GROUP_ID):

- topics: Kafka's characters ``[a-zA-Z0-9._-]``, not ``.`` or ``..``, at most 127 characters
  (OrbitMQ's limit; Kafka allows 249);
- group ids: OrbitMQ's group characters ``[A-Za-z0-9%|_.-]``, not ``.`` or ``..``, at most 120
  characters. Kafka allows any string; ``my.app``, ``orders-service_v2`` and the like pass.
"""

from __future__ import annotations

import re

from orbitmq.common.validation import TOPIC_MAX_LENGTH, validate_group

_TOPIC = re.compile(rf"[a-zA-Z0-9._-]{{1,{TOPIC_MAX_LENGTH}}}")


def legal_topic(name: str) -> bool:
    return bool(_TOPIC.fullmatch(name)) and name not in (".", "..")


def legal_group(group_id: str) -> bool:
    try:
        validate_group(group_id)
    except ValueError:
        return False
    return True

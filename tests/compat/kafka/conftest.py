"""The Kafka compatibility tests run against the same in-process stack as tests/kafka."""

from tests.kafka.conftest import stack

__all__ = ["stack"]

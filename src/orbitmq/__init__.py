"""OrbitMQ: a distributed messaging and streaming platform in Python, on the design of RocketMQ 5."""

__version__ = "0.1.0"

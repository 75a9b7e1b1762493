"""RocketMQ 5 Pop consumption on the broker, with its state kept durably (see docs/pop.md)."""

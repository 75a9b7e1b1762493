"""The Kafka gateway: unmodified Kafka clients produce to and consume from OrbitMQ topics.

A Kafka listener (port 9092) that speaks the wire protocol with `orbitmq.protocol.kafka` and
reaches the brokers the way the gRPC proxy does, through the client SDK: a Kafka topic is the
OrbitMQ topic of the same name, a partition is one of its queues, a Kafka offset is the queue
offset, and group offsets are the consumer offsets RocketMQ consumers use. See docs/kafka.md.
"""

"""The producer, split by role as RocketMQ's Java client and aiokafka split theirs.

- :mod:`.config`: :class:`~.config.ProducerConfig`, every setting with its default and rule;
- :mod:`.types`: what a send returns (SendResult, SendStatus) and the queue selectors;
- :mod:`.accumulator`: message preparation (validation, unique id, compression) and the
  automatic batches of ``send_async`` (aiokafka's RecordAccumulator);
- :mod:`.sender`: one send frame to a broker, with the retry loop every send mode uses;
- :mod:`.producer`: :class:`~.producer.AsyncProducer`, the asyncio producer wiring them;
- :mod:`.blocking`: :class:`~.blocking.Producer`, the blocking one on a private loop thread.

Import names from their modules (or from :mod:`orbitmq.client`); this package imports nothing,
so a process that needs only a config does not load the sender.
"""

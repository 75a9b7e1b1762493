"""The transactional producer (half message, local transaction, COMMIT or ROLLBACK).

- :mod:`.types`: property names, LocalTransactionState, the listener, results, TransactionConfig;
- :mod:`.halves`: packing a transactional batch, reading a check-back's half message;
- :mod:`.producer`: :class:`~.producer.AsyncTransactionProducer` (how it works is told there);
- :mod:`.blocking`: :class:`~.blocking.TransactionProducer`.

Import names from their modules (or from :mod:`orbitmq.client`); this package imports nothing.
"""

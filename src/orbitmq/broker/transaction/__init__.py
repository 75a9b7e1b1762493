"""Transactional messages: half messages, op records, END_TRANSACTION, check-back, restart
replay (see :mod:`orbitmq.broker.transaction.service` and docs/transactions.md)."""

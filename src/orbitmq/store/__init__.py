"""The storage engine: CommitLog, ConsumeQueue, IndexFile, flush, recovery and retention.

A library with blocking calls and background threads; it knows nothing of networking.
Start with :class:`orbitmq.store.message_store.MessageStore`.
"""

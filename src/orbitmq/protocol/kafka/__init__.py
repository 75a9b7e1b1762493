"""Kafka's wire protocol, sans-IO: message codecs generated from Kafka's JSON definitions
(`generate.py` -> `messages_gen.py`, run by `codec.py`), record batch v2 (`records.py`) and the
server side of a connection (`connection.py`). No sockets, no broker: the Kafka gateway drives
these with bytes. See docs/kafka.md."""

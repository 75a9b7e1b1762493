"""The Broker: topics, send, pull and the bridge to the message store."""

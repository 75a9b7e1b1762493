"""The NameServer: a stateless, in-memory route registry."""

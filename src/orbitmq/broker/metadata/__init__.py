"""The metadata log: topic, group, offset and service-checkpoint changes carried through the
CommitLog so replicas get them with the data (docs/ha.md, "Metadata replication")."""

"""The `orbitmq` command."""

from tests.harness import cluster

__all__ = ["cluster"]

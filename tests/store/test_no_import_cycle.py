"""The store's modules import one another without a cycle.

Helpers (recovery, retention, reads) take the store's parts, never the store: a helper that
imports ``message_store`` (even under ``TYPE_CHECKING``) closes a cycle and fails here. The
graph is grimp's, the one import-linter checks its contracts on; it includes
``TYPE_CHECKING`` imports.
"""

from __future__ import annotations

import grimp

PACKAGE = "orbitmq.store"


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per back edge met in a depth-first walk (empty: the graph is acyclic)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        path.append(module)
        for nxt in sorted(edges[module]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, path)
        path.pop()
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [])
    return cycles


def test_find_cycles_sees_a_cycle() -> None:
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_no_import_cycle_inside_the_store() -> None:
    graph = grimp.build_graph("orbitmq", cache_dir=None)
    modules = {m for m in graph.modules if m == PACKAGE or m.startswith(PACKAGE + ".")}
    assert "orbitmq.store.message_store" in modules
    edges = {m: graph.find_modules_directly_imported_by(m) & modules for m in modules}
    cycles = find_cycles(edges)
    assert not cycles, "import cycles in orbitmq.store:\n" + "\n".join(
        " -> ".join(c) for c in cycles
    )

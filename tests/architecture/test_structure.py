"""Structure rules of docs/architecture.md that import-linter cannot state.

- No import cycle between modules of ``orbitmq`` (imports under ``TYPE_CHECKING`` count too: a
  cycle in the type graph is still a cycle a reader has to untangle).
- No source file over 600 lines, generated code excepted: a file has one job you can name.
"""

from __future__ import annotations

from pathlib import Path

import grimp

SRC = Path(__file__).resolve().parents[2] / "src" / "orbitmq"
MAX_LINES = 600
GENERATED = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi", "_gen.py")


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [
            (root, sorted(graph.find_modules_directly_imported_by(root)))
        ]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in graph.modules:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.find_modules_directly_imported_by(nxt))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _without_packages(graph: grimp.ImportGraph) -> grimp.ImportGraph:
    """Drop the edges from a package's ``__init__`` to its own submodules.

    ``orbitmq.client`` re-exports its submodules' names (lazily); a submodule importing a sibling
    through the package is the cycle worth finding, the package naming its own parts is not.
    """
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if imported.startswith(module + "."):
                graph.remove_import(importer=module, imported=imported)
    return graph


def test_no_import_cycle() -> None:
    graph = _without_packages(grimp.build_graph("orbitmq"))
    cycles = _cycles(graph)
    assert cycles == [], "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for name in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(name)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.a")
    graph.add_import(importer="p.c", imported="p.a")
    assert _cycles(graph) == [["p.a", "p.b"]]


def test_no_source_file_over_600_lines() -> None:
    long = {
        str(path.relative_to(SRC)): n
        for path in sorted(SRC.rglob("*.py"))
        if not path.name.endswith(GENERATED)
        and (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}, f"files over {MAX_LINES} lines: {long}"

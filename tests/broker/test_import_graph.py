"""The broker's modules import each other one way only (issue #12): no import cycle inside
``orbitmq.broker``, and no service or processor reaches the controller. The layers contract in
pyproject.toml pins the order; this pins the absence of cycles, which a layers contract does
not check for modules it does not list."""

from __future__ import annotations

import grimp

PACKAGE = "orbitmq.broker"


def _graph() -> grimp.ImportGraph:
    return grimp.build_graph("orbitmq")


def test_no_import_cycle_inside_the_broker() -> None:
    graph = _graph()
    modules = sorted(m for m in graph.modules if m.startswith(PACKAGE + "."))
    cycles = [
        (a, b)
        for i, a in enumerate(modules)
        for b in modules[i + 1 :]
        if graph.chain_exists(importer=a, imported=b) and graph.chain_exists(importer=b, imported=a)
    ]
    assert cycles == []


def test_only_the_entry_point_imports_the_controller() -> None:
    graph = _graph()
    importers = graph.find_modules_that_directly_import(f"{PACKAGE}.controller")
    inside = sorted(m for m in importers if m.startswith(PACKAGE + "."))
    assert inside == [f"{PACKAGE}.__main__"]

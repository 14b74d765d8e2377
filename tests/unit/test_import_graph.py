"""No import circles of any size among the modules of launcher/, train/, contract/ and bench/ (issue 48, item 28).

The graph is grimp's (the library under import-linter): every import is an arrow, an import inside a function or
under TYPE_CHECKING included, and a package's `__init__` is a module like any other. Two modules that need each
other share a third module below them."""

from __future__ import annotations

from pathlib import Path

import grimp
import networkx as nx

PACKAGES = ("launcher", "train", "contract", "bench")


def import_graph() -> nx.DiGraph:
    graph = grimp.build_graph(*PACKAGES, include_external_packages=False, cache_dir=None)
    arrows = nx.DiGraph()
    for module in graph.modules:
        arrows.add_node(module)
        for imported in graph.find_modules_directly_imported_by(module):
            arrows.add_edge(module, imported, lines=sorted(
                d["line_number"] for d in graph.get_import_details(importer=module, imported=imported)))
    return arrows


def circles(arrows: nx.DiGraph) -> list[str]:
    """Each circle (a strongly connected set of two or more modules), one line naming its arrows and their lines."""
    found = []
    for members in sorted(sorted(c) for c in nx.strongly_connected_components(arrows) if len(c) > 1):
        inside = arrows.subgraph(members)
        edges = ", ".join(f"{a} -> {b} (line {', '.join(map(str, inside.edges[a, b]['lines']))})"
                          for a, b in sorted(inside.edges))
        found.append(f"{' <-> '.join(members)}: {edges}")
    return found


def test_the_graph_sees_imports_inside_functions() -> None:
    """The check would pass vacuously if grimp missed the arrows that made the circles: a function's import is one."""
    arrows = import_graph()
    assert {"launcher.sweeps.search", "train.loop", "contract.config.schema", "bench.__main__"} <= set(arrows.nodes)
    # launcher/sweeps/sweep.py imports run_search inside SearchSweeper.sweep
    assert arrows.has_edge("launcher.sweeps.sweep", "launcher.sweeps.search")


def test_no_import_circles_in_launcher_train_contract_or_bench() -> None:
    found = circles(import_graph())
    assert not found, "import circles (move what both sides need into a module below them):\n" + "\n".join(found)


def test_a_circle_is_found_and_named(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The check itself: a two-module circle through a function's import is reported with both arrows."""
    package = tmp_path / "circlepkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from circlepkg import b\n")
    (package / "b.py").write_text("def f():\n    from circlepkg import a\n    return a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("circlepkg", include_external_packages=False, cache_dir=None)
    arrows = nx.DiGraph()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            arrows.add_edge(module, imported, lines=[1])
    assert circles(arrows) == ["circlepkg.a <-> circlepkg.b: circlepkg.a -> circlepkg.b (line 1), "
                               "circlepkg.b -> circlepkg.a (line 1)"]

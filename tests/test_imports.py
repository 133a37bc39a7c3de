"""The ``stopline`` package's import graph has no circles.

Every module under ``python/stopline`` is parsed with ``ast`` (nothing is
imported, so optional extras need not be installed). An edge ``a -> b`` is any
``import`` or ``from ... import`` statement in ``a`` that names module ``b`` of
the package, absolute or relative, wherever the statement sits: at module level,
in a ``try``, or inside a function. A function-level import only puts the circle
off until the first call, and a lower layer must not import a higher one either
way (the constraints <-> kernel circle this test was written for went through
one). Left out: statements under ``if TYPE_CHECKING:`` (they never run) and
imports built from strings (``importlib.import_module``; the package has none
of its own). ``from pkg import name`` is an edge to ``pkg.name`` when that is a
module, else to ``pkg``; a parent package that Python initialises on the way is
not an edge (a package's ``__init__`` re-exporting its submodules would
otherwise be a circle with each of them).
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

Edges = dict[str, dict[str, int]]  # module -> {imported module: line of the first such statement}


def _modules(root: Path, package: str) -> dict[str, Path]:
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _statements(nodes: Iterable[ast.AST]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements among ``nodes`` and under them that can run (``if TYPE_CHECKING:`` bodies skipped)."""
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _statements(node.orelse)
        else:
            yield from _statements(ast.iter_child_nodes(node))


def import_graph(root: Path, package: str) -> Edges:
    """Each module of ``package`` (its files under ``root``) -> the package's modules it imports."""
    modules = _modules(root, package)
    graph: Edges = {}
    for name, path in modules.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: dict[str, int] = {}
        for stmt in _statements(ast.parse(path.read_text(encoding="utf-8"), str(path)).body):
            if isinstance(stmt, ast.Import):
                targets = [alias.name for alias in stmt.names]
            else:
                if stmt.level:
                    base = here.split(".")[: len(here.split(".")) - stmt.level + 1]
                    source = ".".join(base + ([stmt.module] if stmt.module else []))
                else:
                    source = stmt.module or ""
                targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                           for alias in stmt.names]
            for target in targets:
                if target in modules and target != name:
                    edges.setdefault(target, stmt.lineno)
        graph[name] = edges
    return graph


def find_cycle(graph: Edges) -> list[str] | None:
    """One circle as the modules along it (the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def _shown(graph: Edges, cycle: list[str]) -> str:
    return "\n".join(f"  {a} -> {b}  (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:]))


def _stopline_root() -> Path:
    spec = importlib.util.find_spec("stopline")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations)))


def test_the_package_has_no_import_circle() -> None:
    graph = import_graph(_stopline_root(), "stopline")
    # The parse sees the package and its lazy imports (else no circle would be a vacuous pass).
    assert len(graph) > 30
    assert "stopline.logits.triton_kernel" in graph["stopline.logits.constraints"]
    cycle = find_cycle(graph)
    assert cycle is None, "import circle:\n" + _shown(graph, cycle)


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.mark.parametrize("kernel_import", [
    "from .constraints import helper\n",  # module level, relative
    "def launch():\n    from pkg.sub.constraints import helper\n",  # function level, absolute
    "try:\n    import pkg.sub.constraints\nexcept ImportError:\n    pass\n",
])
def test_a_circle_is_found_and_shown(tmp_path: Path, kernel_import: str) -> None:
    root = _package(tmp_path, {
        "__init__.py": "from .sub import constraints\n",
        "sub/__init__.py": "",
        "sub/constraints.py": "import os\n\ndef apply():\n    from .kernel import launch\n",
        "sub/kernel.py": kernel_import,
    })
    graph = import_graph(root, "pkg")
    cycle = find_cycle(graph)
    assert cycle == ["pkg.sub.constraints", "pkg.sub.kernel", "pkg.sub.constraints"]
    assert "pkg.sub.constraints -> pkg.sub.kernel  (line 4)" in _shown(graph, cycle)


def test_what_is_not_an_edge(tmp_path: Path) -> None:
    """A type-checking import and the parent package of an imported module make no edge."""
    root = _package(tmp_path, {
        "__init__.py": "from .a import f\n",
        "a.py": ("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from pkg import f\nelse:\n"
                 "    from . import b\n\nimport pkg.b.c\n\ndef f():\n    pass\n"),
        "b/__init__.py": "",
        "b/c.py": "import json\n",
    })
    graph = import_graph(root, "pkg")
    assert graph == {"pkg": {"pkg.a": 1}, "pkg.a": {"pkg.b": 6, "pkg.b.c": 8}, "pkg.b": {}, "pkg.b.c": {}}
    assert find_cycle(graph) is None

"""The import graph of pedsl/: no cycles, and the layers keep their direction.

Rule: every ``import`` / ``from ... import`` statement counts, at module level or inside a function
(a lazy import still ties the two modules together), except under ``if TYPE_CHECKING:`` (never run).
``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``; the package
``__init__`` files Python runs on the way to a submodule are not edges of their own.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

from compiler_helpers import ROOT

PKG = ROOT / "pedsl"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST):
    """Import statements outside ``if TYPE_CHECKING:`` blocks."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                yield from _imports(ast.Module(body=[child], type_ignores=[]))
        else:
            yield from _imports(node)


def import_graph() -> nx.DiGraph:
    files = {_module_name(p): p for p in PKG.rglob("*.py")}
    g = nx.DiGraph()
    for mod, path in files.items():
        g.add_node(mod)
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    origin = ".".join(base + ([node.module] if node.module else []))
                else:
                    origin = node.module or ""
                targets = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in files else origin for a in node.names]
            for t in targets:
                if t.split(".")[0] in ("pedsl", "benchmarks", "compiler_tests") and t != mod:
                    g.add_edge(mod, t, line=node.lineno)
    return g


def test_no_import_cycles_in_pedsl():
    g = import_graph()
    cycles = [c for c in nx.simple_cycles(g.subgraph([n for n in g if n.startswith("pedsl")]))]
    shown = ["  " + " -> ".join(c + [c[0]]) + "  (" + ", ".join(
        f"{a} line {g.edges[a, b]['line']}" for a, b in zip(c, c[1:] + c[:1])) + ")" for c in cycles[:10]]
    assert not cycles, "import cycles in pedsl/:\n" + "\n".join(shown)


def test_layers_point_one_way():
    g = import_graph()

    def reaches(src_prefix: str, dst_prefix: str) -> list[tuple[str, str]]:
        return [(a, b) for a, b in g.edges if a.startswith(src_prefix) and b.startswith(dst_prefix)]

    assert not reaches("pedsl.ops", "pedsl.lang"), "the kernels must not import the language"
    assert not reaches("pedsl.ops", "pedsl.compiler"), "the kernels must not import the compiler"
    assert not reaches("pedsl.lang", "pedsl.compiler"), "the front end must not import the compiler"
    assert not reaches("pedsl", "benchmarks") and not reaches("pedsl", "compiler_tests"), "pedsl is self-contained"
    assert not reaches("pedsl.config", "pedsl.lang"), "settings must not load schemes (see pedsl.scheme_config)"


def test_the_graph_sees_lazy_imports():
    """The rule counts function-level imports: a known lazy import is an edge."""
    g = import_graph()
    assert g.has_edge("pedsl.compiler.module", "pedsl.compiler.reference")  # inside SchemeAttention.forward
    assert g.has_edge("pedsl.lang.resolve", "pedsl.lang.lint")  # inside the resolver
    assert not g.has_edge("pedsl.lang.lint", "pedsl.lang.resolve")  # only under TYPE_CHECKING


def test_pedsl_never_edits_sys_path():
    for path in PKG.rglob("*.py"):
        assert "sys.path" not in path.read_text(encoding="utf-8"), f"{path} edits sys.path"

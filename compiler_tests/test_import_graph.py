"""The import graph of pedsl/: no cycles, and the layers keep their direction.

Rule: every ``import`` / ``from ... import`` statement counts, wherever it is: at module level, inside
a function (a lazy import still ties the two modules together) or under ``if TYPE_CHECKING:`` (a
type-only import is still a dependency of the reader). ``from pkg import name`` is an edge to
``pkg.name`` when that is a module, else to ``pkg``; the package ``__init__`` files Python runs on the
way to a submodule are not edges of their own. Cycles are forbidden between modules and between
packages (``pedsl.lang`` -> ``pedsl.compiler`` -> ``pedsl.lang`` is a circle even when no two modules
form one).
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
    """Every import statement of a file, at any depth."""
    return (node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)))


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


def package_of(mod: str) -> str:
    """The unit of the package rule: the package directly under pedsl/ holding ``mod`` (``pedsl.lang``
    for ``pedsl.lang.builtin_defs.record``: a sub-package is a part of its package), or a module
    directly in pedsl/ itself (``pedsl.errors``, ``pedsl.model``)."""
    return ".".join(mod.split(".")[:2])


def package_graph() -> nx.DiGraph:
    """The packages of pedsl/ and the imports between them: an edge per module edge that crosses two."""
    g = nx.DiGraph()
    for a, b, data in import_graph().edges(data=True):
        if not (a.startswith("pedsl.") and b.startswith("pedsl.")):
            continue
        pa, pb = package_of(a), package_of(b)
        if pa != pb:
            g.add_edge(pa, pb, line=f"{a} line {data['line']} imports {b}")
    return g


def test_no_import_cycles_between_packages():
    g = package_graph()
    cycles = list(nx.simple_cycles(g))
    shown = ["  " + " -> ".join(c + [c[0]]) + ":\n" + "\n".join(
        f"      {g.edges[a, b]['line']}" for a, b in zip(c, c[1:] + c[:1])) for c in cycles[:10]]
    assert not cycles, "import cycles between the packages of pedsl/:\n" + "\n".join(shown)


def test_the_package_graph_sees_a_circle():
    """The package rule is not vacuous: pedsl.compiler imports pedsl.runtime, so the reverse edge would close a circle."""
    g = package_graph()
    assert g.has_edge("pedsl.compiler", "pedsl.runtime")
    g.add_edge("pedsl.runtime", "pedsl.compiler")
    assert list(nx.simple_cycles(g))


def test_layers_point_one_way():
    g = import_graph()

    def reaches(src_prefix: str, dst_prefix: str) -> list[tuple[str, str]]:
        return [(a, b) for a, b in g.edges if a.startswith(src_prefix) and b.startswith(dst_prefix)]

    assert not reaches("pedsl.ops", "pedsl.lang"), "the kernels must not import the language"
    assert not reaches("pedsl.ops", "pedsl.compiler"), "the kernels must not import the compiler"
    assert not reaches("pedsl.lang", "pedsl.compiler"), "the front end must not import the compiler"
    assert not reaches("pedsl", "benchmarks") and not reaches("pedsl", "compiler_tests"), "pedsl is self-contained"
    assert not reaches("pedsl.config", "pedsl.lang"), "settings must not load schemes (see pedsl.scheme_config)"
    assert not reaches("pedsl.runtime", "pedsl.compiler"), "the evaluators run below the compiler that uses them"


def test_the_graph_sees_every_import_statement(tmp_path):
    """Imports inside functions and under ``if TYPE_CHECKING:`` are edges like module-level ones."""
    tree = ast.parse("import a\nif TYPE_CHECKING:\n    import b\ndef f():\n    import c\n"
                     "class K:\n    def m(self):\n        from d import e\n")
    assert sorted(n.names[0].name if isinstance(n, ast.Import) else n.module for n in _imports(tree)) == \
        ["a", "b", "c", "d"]


def test_pedsl_never_edits_sys_path():
    for path in PKG.rglob("*.py"):
        assert "sys.path" not in path.read_text(encoding="utf-8"), f"{path} edits sys.path"

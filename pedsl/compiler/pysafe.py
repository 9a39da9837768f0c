"""Safe pieces of generated Python: every user string as a data literal, every identifier from one allocator.

`pedsl compile` writes a module that people import, so nothing a `.pe` file contains may
become code. Three rules, each enforced here and nowhere else:

- text (descriptions, comments, names, file names, the scheme source) reaches the module only
  through :func:`literal` / :func:`text_block` (``repr``, so always a data literal) or
  :func:`comment` (escaped onto one printable ASCII line);
- every identifier the generator invents comes from one :class:`Names` per module, which
  turns a hint into a valid identifier that is unique in the module and never a keyword,
  soft keyword, builtin, dunder or a name the module already defines or imports;
- the module's file name comes from :func:`module_file_stem`, which never shadows a
  standard-library module or a package that importing torch loads.
"""

from __future__ import annotations

import ast
import builtins
import keyword
import math
import re
import sys
from typing import Iterable

#: Top-level packages the generated module (``import torch``) loads or may load lazily; a generated
#: file of one of these names next to the user's code would be imported in its place.
THIRD_PARTY = frozenset({
    "torch", "torchgen", "functorch", "triton", "numpy", "sympy", "mpmath", "networkx", "jinja2",
    "markupsafe", "filelock", "fsspec", "typing_extensions", "tqdm", "setuptools", "pkg_resources",
    "packaging", "nvidia", "opt_einsum", "optree", "pedsl", "dill",  # torch imports dill when installed
})
#: Every name a Python module cannot safely bind at top level or as a local.
PYTHON_RESERVED = frozenset(keyword.kwlist) | frozenset(keyword.softkwlist) | frozenset(dir(builtins))

_NOT_IDENT = re.compile(r"[^0-9A-Za-z_]+")


def literal(value) -> str:
    """A Python literal that evaluates to ``value`` (str, bool, None, int, float, and lists/tuples/dicts of them).

    Strings go through ``repr``; non-finite floats, which ``repr`` would spell as the
    undefined names ``inf``/``nan``, become ``float('inf')`` and friends.
    """
    if value is None or isinstance(value, (bool, str)):
        return repr(value)
    if isinstance(value, int):
        return repr(int(value))
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else f"float({repr(value)!r})"
    if isinstance(value, list):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    if isinstance(value, tuple):
        items = [literal(v) for v in value]
        return f"({items[0]},)" if len(items) == 1 else "(" + ", ".join(items) + ")"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no literal for {type(value).__name__}")


def comment(text: str) -> str:
    """``# text`` on one line of printable ASCII: newlines, quotes' escapes and non-ASCII are backslash-escaped."""
    return "# " + str(text).encode("unicode_escape").decode("ascii")


def text_block(text: str, indent: str = "") -> str:
    """A readable multi-line string literal: one ``repr``'d line per source line, joined implicitly in parentheses.

    As a module's first statement it is the docstring (``ast.get_docstring`` reads it).
    """
    lines = str(text).splitlines(keepends=True) or [""]
    body = "\n".join(f"{indent}    {line!r}" for line in lines)
    return f"{indent}(\n{body}\n{indent})"


def identifier(hint: str) -> str:
    """``hint`` reduced to the characters of a Python identifier (not yet checked for clashes)."""
    name = _NOT_IDENT.sub("_", str(hint)) or "_"
    name = "_" + name if name[0].isdigit() else name
    return re.sub(r"^__+", "_", name)  # a leading '__' is name-mangled inside the generated class


def is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def module_names(source: str) -> set[str]:
    """Every name a piece of module source binds at top level or uses anywhere (imports, defs, assignments)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.alias):
            out.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.arg):
            out.add(node.arg)
    return out


class Names:
    """Allocates the identifiers of one generated module: valid, unique, and clear of everything reserved.

    ``new(hint, ...)`` returns the first of the hints (made into identifiers) that is free,
    else the last one with ``_2``, ``_3``, ... appended; the result is then taken. Two calls
    never return the same name, so distinct groups get distinct constants even when their
    names differ only in case.
    """

    def __init__(self, reserved: Iterable[str] = ()):
        self.taken: set[str] = set(PYTHON_RESERVED) | set(reserved)

    def free(self, name: str) -> bool:
        return name.isidentifier() and name not in self.taken and not name.startswith("__")

    def new(self, *hints: str) -> str:
        cands = [identifier(h) for h in hints] or ["_"]
        for c in cands:
            if self.free(c):
                self.taken.add(c)
                return c
        base, n = cands[-1].rstrip("_"), 2
        while not self.free(f"{base}_{n}"):
            n += 1
        self.taken.add(f"{base}_{n}")
        return f"{base}_{n}"


def module_file_stem(scheme_name: str) -> str:
    """The file name (without ``.py``) for a scheme's module: the scheme name unless importing it by that
    name would be ambiguous (a keyword, a dunder, a standard-library module, a package torch loads)."""
    stem = identifier(scheme_name)
    top = stem.lower()
    if (keyword.iskeyword(stem) or keyword.issoftkeyword(stem) or is_dunder(stem)
            or top in {m.lower() for m in sys.stdlib_module_names} or top in THIRD_PARTY):
        stem += "_scheme"
    return stem

"""Syntax IR -> resolved, checked :class:`~pedsl.lang.scheme.Scheme`.

Stages, each reporting every problem it finds before giving up:

1. load the file and its imports (cycles, missing files, where imports may come from);
2. merge a scheme with its ``extends`` chain (cycles, unknown bases);
3. bind parameters: defaults, overrides (``-P name=value``), types, constraints;
4. type-check every expression (unknown names with did-you-mean, axes);
5. lay out channel groups against ``head_dim``; classify transports and biases;
6. lint: legal but suspicious schemes (warnings, silenced by ``allow NAME``).

Merging rule for ``extends``: ``param``/``let`` override by name; ``layout``,
``bias``, ``temperature`` and the ``channels`` block as a whole; ``train`` and
``eval`` entries key by key; and the transports as a set: a child that declares
any ``qk``/``qkv`` line replaces all of its base's transports.
"""

from __future__ import annotations

import hashlib
import math
import os
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from pedsl.errors import CheckError, Diagnostic, DiagnosticSink, ParamError, ParseError, PedslError, did_you_mean
from pedsl.lang import ast, bounds
from pedsl.limits import MAX_IMPORT_DEPTH, MAX_IMPORTS, MAX_LENGTH
from pedsl.lang.builtins import CONSTANTS, FUNCTIONS, KEYWORDS, STRUCTURAL_DEFAULTS, WARNINGS
from pedsl.lang.evaluate import DYNAMIC, channel_ranges, EvalIssue, GroupSpec, StaticEnv, Vec, evaluate, group_channels
from pedsl.lang.exprs import distance_coefficient, inline_lets, names_in, split_terms, to_source, walk
from pedsl.lang.library import library_dir, scheme_file
from pedsl.lang.parser import decode, parse_module, read_bytes
from pedsl.lang.scheme import (
    ChannelGroup,
    DistanceBias,
    GateBias,
    HouseholderSteps,
    RotateTransport,
    RotationSteps,
    Scheme,
)
from pedsl.lang.typecheck import Checker
from pedsl.lang.types import Ty

MAX_INLINED = 5_000  # expression nodes of one let after inlining the lets it uses
MAX_CHAIN = 64  # schemes in one extends chain

# ------------------------------------------------------------------ loading files


@dataclass
class Source:
    """One loaded file: its text, syntax tree and the modules it imports."""

    file: str | None
    text: str
    module: ast.Module
    imports: list["Source"] = field(default_factory=list)
    scope: dict | None = field(default=None, repr=False)  # visible_schemes(), once loading is done
    by_name: dict | None = field(default=None, repr=False)  # scheme name -> its declarations here


# Import policy: a .pe file is data, and its imports may only name other .pe files under the folder
# of the file being loaded (the one named on the command line; the current folder for text), the
# scheme library, or a root allowed explicitly (PEDSL_IMPORT_PATH, `pedsl --allow-import-root DIR`,
# allow_import_roots()). Nothing else is read, and an imported file that does not parse is named,
# never quoted.
IMPORT_PATH_ENV = "PEDSL_IMPORT_PATH"
EXTRA_IMPORT_ROOTS: list[Path] = []  # set by `pedsl --allow-import-root DIR` for this process
_SCOPED_ROOTS: list[Path] = []  # allow_import_roots() (e.g. a run folder's copy of its scheme)


@contextmanager
def allow_import_roots(*dirs: str | Path) -> Iterator[None]:
    """Allow imports from ``dirs`` (and their subfolders) while the block runs."""
    added = [Path(d).resolve() for d in dirs]
    _SCOPED_ROOTS.extend(added)
    try:
        yield
    finally:
        for d in added:
            _SCOPED_ROOTS.remove(d)


def import_roots(top_dir: Path) -> list[Path]:
    """The folders a load that starts in ``top_dir`` may import from."""
    env = [Path(p) for p in os.environ.get(IMPORT_PATH_ENV, "").split(os.pathsep) if p.strip()]
    return [Path(top_dir).resolve(), library_dir().resolve(),
            *(p.resolve() for p in (*env, *EXTRA_IMPORT_ROOTS)), *_SCOPED_ROOTS]


def _within(path: Path, roots: list[Path]) -> bool:
    return any(path == r or path.is_relative_to(r) for r in roots)


def import_target(base_dir: Path, name: str, roots: list[Path]) -> tuple[Path, str | None]:
    """Where ``import "name"`` in a file of ``base_dir`` leads, and why it is refused (None when allowed).

    The path is relative to the importing file; when no such file exists there, the library file of
    that name is used. The target must be a regular ``.pe`` file under one of ``roots`` (after
    following symbolic links)."""
    target = real_path(base_dir / name)  # CheckError for a symlink loop
    if not target.exists() and (library_dir() / name).is_file():
        target = (library_dir() / name).resolve()  # a library scheme, from any folder
    if not name.endswith(".pe") or target.suffix != ".pe":
        what = f"'{name}'" if target.name == Path(name).name else f"'{name}' (a link to '{target.name}')"
        return target, f"cannot import {what}: only .pe files can be imported"
    if not _within(target, roots):
        return target, (f"cannot import '{name}': it lies outside the folders imports may come from "
                        f"(the folder of the scheme file given, its subfolders, and the scheme library)")
    try:
        st = target.stat()
    except OSError:
        return target, f"cannot import '{name}': no such file"
    if not stat.S_ISREG(st.st_mode):
        return target, f"cannot import '{name}': it is not a regular file"
    return target, None


class Loader:
    def __init__(self) -> None:
        self.cache: dict[str, Source] = {}
        self.roots: list[Path] | None = None  # set by each top-level file (its folder, the library, ...)

    def load_path(self, path: Path, stack: tuple[str, ...] = ()) -> Source:
        key = str(real_path(path))
        if key in self.cache:
            return self.cache[key]
        if not stack:
            self.roots = import_roots(path.parent)
        if len(self.cache) >= MAX_IMPORTS:
            raise CheckError(f"more than {MAX_IMPORTS} .pe files are imported (loading {path})", code="E208",
                             file=str(path), line=1, col=1, hint="import fewer files (see pedsl/limits.py)")
        try:
            data = read_bytes(path)
        except FileNotFoundError:
            raise CheckError(f"no such file: {path}", code="E209", file=str(path), line=1, col=1,
                             hint="check the path") from None
        except IsADirectoryError:
            raise CheckError(f"{path} is a folder, not a .pe file", code="E209", file=str(path), line=1, col=1,
                             hint="give the .pe files inside it, e.g. folder/*.pe") from None
        except OSError as exc:
            raise CheckError(f"cannot read {path}: {exc.strerror}", code="E209", file=str(path), line=1,
                             col=1) from None
        text = decode(data, str(path))
        return self._load(text, str(path), path.parent, stack + (key,), key)

    def load_text(self, text: str, file: str | None = None, base_dir: Path | None = None) -> Source:
        self.roots = import_roots(base_dir or Path.cwd())
        return self._load(text, file, base_dir or Path.cwd(), (), None)

    def _load(self, text: str, file: str | None, base_dir: Path, stack: tuple[str, ...], key: str | None) -> Source:
        module = parse_module(text, file)
        src = Source(file, text, module)
        if key:
            self.cache[key] = src
        sink = DiagnosticSink(file=file, source=text)
        roots = self.roots if self.roots is not None else import_roots(base_dir)
        for imp in module.imports:
            if len(stack) >= MAX_IMPORT_DEPTH:
                line, col = (imp.span.line, imp.span.col) if imp.span else (None, None)
                sink.add("E208", f"imports nested more than {MAX_IMPORT_DEPTH} files deep", line=line, col=col,
                         hint="import the base schemes directly instead of through a long chain of files")
                break
            try:
                target, refused = import_target(base_dir, imp.path, roots)
            except CheckError as err:
                line, col = (imp.span.line, imp.span.col) if imp.span else (None, None)
                sink.add("E209", f"cannot import '{imp.path}': {err}", line=line, col=col, hint=err.hint)
                continue
            line, col = (imp.span.line, imp.span.col) if imp.span else (None, None)
            if refused and "outside the folders" in refused:
                sink.add("E209", refused, line=line, col=col,
                         hint=f"allow its folder explicitly: `pedsl --allow-import-root DIR ...` or the "
                              f"{IMPORT_PATH_ENV} environment variable (folders separated by '{os.pathsep}')")
                continue
            if refused and "no such file" not in refused:
                sink.add("E209", refused, line=line, col=col, hint="import a .pe scheme file")
                continue
            if str(target) in stack:
                sink.add("E208", f"import cycle: {imp.path} imports this file again", line=line, col=col,
                         hint="remove one of the imports; a scheme can only extend what came before")
                continue
            if refused:
                sink.add("E209", f"cannot import '{imp.path}': no such file", line=line, col=col,
                         hint=f"paths are relative to {base_dir}, or name a file of the scheme library "
                              f"({library_dir()})")
                continue
            try:
                src.imports.append(self.load_path(target, stack))
            except ParseError as err:  # named with a position, never quoted (it may not be a scheme at all)
                first = err.diagnostics[0] if err.diagnostics else None
                where = f" at line {first.line}, column {first.col}" if first and first.line else ""
                sink.add("E209", f"cannot import '{imp.path}': it is not a valid .pe file (a syntax error{where})",
                         line=line, col=col, hint=f"run `pedsl check {target}` to see the error")
            except PedslError as err:
                sink.items.extend(err.diagnostics)
        sink.raise_if_errors()
        return src


def real_path(path: Path) -> Path:
    """``path.resolve()``, or a CheckError for a symlink loop (or a name the OS refuses)."""
    try:
        return path.resolve()
    except (RuntimeError, OSError) as exc:
        what = "a symlink loop" if isinstance(exc, RuntimeError) or getattr(exc, "errno", None) == 40 else \
            (getattr(exc, "strerror", None) or str(exc))
        raise CheckError(f"cannot resolve {path}: {what}", code="E209", file=str(path), line=1, col=1,
                         hint="fix or remove the symlink") from None



def looks_like_text(x: str) -> bool:
    return "\n" in x or "{" in x or x.strip() == ""


def load_source(path_or_text: str | Path, loader: Loader | None = None) -> Source:
    loader = loader or Loader()
    if isinstance(path_or_text, Path) or not looks_like_text(path_or_text):
        return loader.load_path(scheme_file(path_or_text))  # a path, or the name of a library scheme
    return loader.load_text(path_or_text, "<text>")


# ------------------------------------------------------------------ scheme lookup and extends


@dataclass
class Located:
    """A statement with the file it came from (for diagnostics in base files)."""

    stmt: Any
    src: Source


def visible_schemes(src: Source) -> dict[str, tuple[ast.SchemeDecl, Source]]:
    """Schemes declared in src or in the files it imports (cached: chains ask for it per link)."""
    if src.scope is not None:
        return src.scope
    out: dict[str, tuple[ast.SchemeDecl, Source]] = {}
    for imp in src.imports:
        out.update(visible_schemes(imp))
    for decl in src.module.schemes:
        out[decl.name] = (decl, src)
    src.scope = out
    return out


def select_scheme(src: Source, name: str | None) -> ast.SchemeDecl:
    decl = _select(src, name)
    if src.by_name is None:
        src.by_name = {}
        for d in src.module.schemes:
            src.by_name.setdefault(d.name, []).append(d)
    same = src.by_name[decl.name]
    if len(same) > 1:
        sink = _sink(src)
        sink.add("E205", f"scheme '{decl.name}' is declared twice", **_pos(same[1]),
                 hint=f"the first is on line {same[0].span.line}" if same[0].span else None)
        sink.raise_if_errors()
    return decl


def _select(src: Source, name: str | None) -> ast.SchemeDecl:
    decls = src.module.schemes
    if name is not None:
        for d in decls:
            if d.name == name:
                return d
        hint = did_you_mean(name, [d.name for d in decls])
        raise CheckError(
            f"no scheme named '{name}' in {src.file or 'the input'}", code="E215", file=src.file,
            hint=hint or ("it declares: " + ", ".join(d.name for d in decls) if decls else "it declares no scheme"),
        )
    if not decls:
        raise CheckError(f"{src.file or 'the input'} declares no scheme", code="E215", file=src.file, line=1, col=1,
                         hint='write one: scheme name "description" { ... }')
    if len(decls) == 1:
        return decls[0]
    stem = Path(src.file).stem if src.file else None
    for d in decls:
        if d.name == stem:
            return d
    return decls[-1]


def _sink(src: Source) -> DiagnosticSink:
    return DiagnosticSink(file=src.file, source=src.text)


def _pos(node: Any) -> dict:
    span = getattr(node, "span", None)
    if span is None:
        return {}
    end = span.end_col if span.end_line == span.line else None
    return {"line": span.line, "col": span.col, "end_col": end}


def chain(decl: ast.SchemeDecl, src: Source, diags: list[Diagnostic]) -> list[tuple[ast.SchemeDecl, Source]]:
    """The extends chain, root first. Reports unknown bases and cycles."""
    scope = visible_schemes(src)
    out = [(decl, src)]
    seen = {decl.name}
    cur, cur_src = decl, src
    while cur.base is not None:
        if cur.base in seen:
            sink = _sink(cur_src)
            path = " -> ".join([d.name for d, _ in out] + [cur.base])
            sink.add("E207", f"extends cycle: {path}", hint="a scheme cannot extend itself, directly or not",
                     **_pos(cur))
            diags.extend(sink.items)
            break
        found = visible_schemes(cur_src).get(cur.base) or scope.get(cur.base)
        if found is None:
            sink = _sink(cur_src)
            hint = did_you_mean(cur.base, scope)
            sink.add("E206", f"'{cur.name}' extends unknown scheme '{cur.base}'",
                     hint=hint or "declare it above or import the file that declares it", **_pos(cur))
            diags.extend(sink.items)
            break
        if len(out) >= MAX_CHAIN:
            sink = _sink(cur_src)
            sink.add("E207", f"extends chain of '{decl.name}' is longer than {MAX_CHAIN} schemes",
                     hint="extend a scheme nearer the root", **_pos(decl if cur_src is src else cur))
            diags.extend(sink.items)
            break
        seen.add(cur.base)
        cur, cur_src = found
        out.append((cur, cur_src))
    return list(reversed(out))


@dataclass
class Merged:
    name: str
    doc: str = ""
    bases: tuple[str, ...] = ()
    params: dict[str, Located] = field(default_factory=dict)
    lets: dict[str, Located] = field(default_factory=dict)
    layout: Located | None = None
    channels: Located | None = None
    transports: list[Located] = field(default_factory=list)
    bias: Located | None = None
    temperature: Located | None = None
    train: dict[str, Located] = field(default_factory=dict)
    eval: dict[str, Located] = field(default_factory=dict)
    allow: list[Located] = field(default_factory=list)


def merge(links: list[tuple[ast.SchemeDecl, Source]], diags: list[Diagnostic]) -> Merged:
    decl, _ = links[-1]
    m = Merged(name=decl.name, bases=tuple(d.name for d, _ in reversed(links[:-1])))
    for d, src in links:
        if d.doc:
            m.doc = d.doc
        own_transports: list[Located] = []
        seen: dict[tuple[str, str], ast.Node] = {}
        sink = _sink(src)
        for st in d.body:
            loc = Located(st, src)
            key = None
            if st.kind in ("param", "let"):
                key = ("name", st.name)
            elif st.kind in ("layout", "channels", "bias", "temperature"):
                key = (st.kind, "")
            if key is not None:
                if key in seen:
                    what = f"'{st.name}'" if key[0] == "name" else f"'{st.kind}'"
                    sink.add("E205", f"{what} is declared twice in scheme '{d.name}'",
                             hint=f"the first is on line {seen[key].span.line}" if seen[key].span else None,
                             **_pos(st))
                    continue
                seen[key] = st
            if st.kind in ("param", "let"):
                other = m.lets if st.kind == "param" else m.params
                if st.name in other and other[st.name].src is src and d is decl:
                    sink.add("E205", f"'{st.name}' is both a param and a let", **_pos(st))
                (m.params if st.kind == "param" else m.lets)[st.name] = loc
                (m.lets if st.kind == "param" else m.params).pop(st.name, None)
            elif st.kind == "layout":
                m.layout = loc
            elif st.kind == "channels":
                m.channels = loc
            elif st.kind == "transport":
                own_transports.append(loc)
            elif st.kind == "bias":
                m.bias = loc
            elif st.kind == "temperature":
                m.temperature = loc
            elif st.kind == "section":
                table = m.train if st.section == "train" else m.eval
                for entry in st.entries:
                    table[entry.name] = Located(entry, src)
            elif st.kind == "allow":
                m.allow.append(loc)
        if own_transports:
            m.transports = own_transports
        diags.extend(sink.items)
    return m


# ------------------------------------------------------------------ parameters


def parse_override(text: str) -> Any:
    """A -P value: int, float, bool or string (quotes optional)."""
    t = text.strip()
    if t in ("true", "false"):
        return t == "true"
    try:
        return int(t)
    except ValueError:
        pass
    try:
        return float(t)
    except ValueError:
        pass
    if len(t) >= 2 and t[0] == t[-1] == '"':
        return t[1:-1]
    return t


def _coerce(value: Any, typ: str) -> Any:
    if typ == "int":
        if isinstance(value, bool):
            raise TypeError
        if isinstance(value, float):
            if not value.is_integer():
                raise TypeError
            return int(value)
        if isinstance(value, int):
            return value
        raise TypeError
    if typ == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError
        if not math.isfinite(float(value)):
            raise TypeError
        return float(value)
    if typ == "bool":
        if not isinstance(value, bool):
            raise TypeError
        return value
    if typ == "str":
        if not isinstance(value, str):
            raise TypeError
        return value
    raise TypeError  # pragma: no cover


_CMP = {
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    "!=": lambda a, b: a != b,
}


def _type_name(v: Any) -> str:
    return {bool: "bool", int: "int", float: "float", str: "str"}.get(type(v), type(v).__name__)


# ------------------------------------------------------------------ the resolver


class Resolver:
    def __init__(self, merged: Merged, overrides: dict[str, Any], structural: dict[str, int], file_src: Source):
        self.m = merged
        self.overrides = overrides
        self.structural = structural
        self.src = file_src
        self.diags: list[Diagnostic] = []
        self.values: dict[str, Any] = {}
        self.types: dict[str, Ty | None] = {}
        self._typing: set[str] = set()
        self._failed_groups: set[str] = set()

    # reporting ---------------------------------------------------------
    def report(self, code: str, message: str, node: Any = None, *, hint: str | None = None, src: Source | None = None,
               severity: str = "error") -> None:
        src = src or self._current
        sink = _sink(src)
        sink.add(code, message, hint=hint, severity=severity, **_pos(node))
        self.diags.extend(sink.items)

    _current: Source

    # parameters --------------------------------------------------------
    def _param_error(self, code: str, message: str, node: Any, src: Source, *, hint: str | None) -> None:
        """A bad -P override stops resolution; the diagnostic points at the declaration it concerns."""
        sink = _sink(src)
        sink.add(code, message, hint=hint, **_pos(node))
        raise ParamError(message, diagnostics=sink.items)

    def bind_params(self) -> None:
        decl = next((d for d in self.src.module.schemes if d.name == self.m.name), None)
        for name, struct in self.structural.items():
            if name not in self.m.params:
                self.values[name] = struct
                if name in self.overrides:  # -P heads=8 sets the model's structure too
                    try:
                        value = _coerce(self.overrides[name], "int")
                    except TypeError:
                        self._param_error("E302", f"'{name}' is an int, got {self.overrides[name]!r} (-P {name}=...)",
                                          decl, self.src, hint=f"give -P {name}=<int>")
                    if value < 1:
                        self._param_error("E303", f"'{name}' must be >= 1, got {value} (-P {name}=...)", decl,
                                          self.src, hint=f"choose {name} >= 1")
                    self.values[name] = value
        for name in self.overrides:
            if name not in self.m.params and name not in self.structural:
                hint = did_you_mean(name, list(self.m.params) + list(self.structural))
                known = ", ".join(sorted(self.m.params)) or "none"
                decl = next((d for d in self.src.module.schemes if d.name == self.m.name), None)
                self._param_error("E301", f"unknown parameter '{name}' (-P {name}=...) for scheme '{self.m.name}'",
                                  decl, self.src, hint=hint or f"its parameters are: {known}")
        for name, loc in self.m.params.items():
            p: ast.Param = loc.stmt
            self._current = loc.src
            if name in CONSTANTS or name in FUNCTIONS or name in KEYWORDS:
                if name not in STRUCTURAL_DEFAULTS:
                    self.report("E205", f"parameter '{name}' shadows a builtin name", p)
                    continue
            env = StaticEnv(values=dict(self.values))
            if name in self.overrides:
                raw = self.overrides[name]
                try:
                    value = _coerce(raw, p.type)
                except TypeError:
                    self._param_error("E302", f"parameter '{name}' of scheme '{self.m.name}' is {p.type}, "
                                      f"got {raw!r} (-P {name}=...)", p, loc.src, hint=f"give -P {name}=<{p.type}>")
                origin = "override"
            else:
                try:
                    value = evaluate(p.default, env)
                except EvalIssue as issue:
                    self.report("E217", f"default of '{name}': {issue}", issue.node or p.default, hint=issue.hint)
                    continue
                if value is DYNAMIC:
                    self.report("E204", f"the default of '{name}' must be known at compile time", p.default)
                    continue
                try:
                    value = _coerce(value, p.type)
                except TypeError:
                    self.report("E204", f"'{name}' is declared {p.type} but its default is {_type_name(value)}",
                                p.default, hint=f"write {'an' if p.type == 'int' else 'a'} {p.type} literal")
                    continue
                origin = "default"
            ok = True
            for c in p.constraints:
                try:
                    bound = evaluate(c.value, env)
                except EvalIssue as issue:
                    self.report("E217", str(issue), c.value)
                    ok = False
                    continue
                if isinstance(bound, (int, float)) and isinstance(value, (int, float)) and not isinstance(value, bool):
                    if not _CMP[c.op](value, bound):
                        msg = f"parameter '{name}' = {value!r} violates its constraint ({c.op} {bound!r})"
                        if origin == "override":
                            self._param_error("E303", msg + f" (-P {name}=...)", c, loc.src,
                                              hint=f"choose {name} {c.op} {bound!r}")
                        self.report("E212", msg, p, hint=f"choose a default {c.op} {bound!r}")
                        ok = False
                else:
                    self.report("E204", "a constraint compares numbers", c)
                    ok = False
            if ok:
                self.values[name] = value

    # types --------------------------------------------------------------
    def checker(self) -> Checker:
        names = getattr(self, "_names", None)
        if names is None:  # built once: rebuilding it per let made checking quadratic in the lets
            names = {}
            for name, loc in self.m.params.items():
                typ = loc.stmt.type
                t = {"int": Ty("num", integer=True), "float": Ty("num"), "bool": Ty("bool"), "str": Ty("str")}[typ]
                names[name] = (lambda t=t: t)
            for name, loc in self.m.lets.items():
                names[name] = (lambda name=name: self.let_type(name))
            self._names = names
        return Checker(names, lambda code, msg, node, hint=None: self.report(code, msg, node, hint=hint))

    def let_type(self, name: str) -> Ty | None:
        if name in self.types:
            return self.types[name]
        loc = self.m.lets[name]
        if name in self._typing:
            self.report("E205", f"'{name}' is defined in terms of itself", loc.stmt, src=loc.src)
            self.types[name] = None
            return None
        self._typing.add(name)
        saved = self._current
        self._current = loc.src
        t = self.checker().infer(loc.stmt.value)
        self._current = saved
        self._typing.discard(name)
        self.types[name] = t
        return t

    def check_let_sizes(self, lets: dict[str, ast.Expr]) -> bool:
        """Report lets whose inlined expression would be huge (``let b = a + a`` chains double it)."""
        sizes: dict[str, int] = {}

        def size(name: str, stack: frozenset) -> int:
            if name not in sizes:
                if name in stack:
                    return 1  # a cycle: reported by the type checker
                total = 0
                for node in walk(lets[name]):
                    total += size(node.id, stack | {name}) if node.kind == "name" and node.id in lets else 1
                sizes[name] = total
            return sizes[name]

        too_big = False
        for name, loc in self.m.lets.items():
            n = size(name, frozenset())
            if n > MAX_INLINED:
                self.report("E217", f"'{name}' expands to {n:,} nodes once the lets it uses are inlined "
                            f"(the limit is {MAX_INLINED:,})", loc.stmt, src=loc.src,
                            hint="write it with fewer repeated uses of other lets, or as a param")
                too_big = True
                break  # the lets built on it are too big as well: one report is enough
        return too_big

    # main ---------------------------------------------------------------
    def resolve(self) -> tuple[Scheme | None, list[Diagnostic]]:
        m = self.m
        self._current = self.src
        try:
            self.bind_params()
        except ParamError:
            raise
        lets = {n: loc.stmt.value for n, loc in m.lets.items()}
        for n, loc in m.lets.items():
            if n in CONSTANTS or n in FUNCTIONS or n in KEYWORDS:
                self.report("E205", f"'{n}' shadows a builtin name or keyword", loc.stmt, src=loc.src)
        for n in m.lets:
            self.let_type(n)
        if self.check_let_sizes(lets) or self.check_structure():
            return None, self.diags
        heads = int(self.values.get("heads", self.structural["heads"]))
        head_dim = int(self.values.get("head_dim", self.structural["head_dim"]))
        env = StaticEnv(values=dict(self.values), lets=lets)

        layout = m.layout.stmt.value if m.layout else "halves"
        groups = self.resolve_groups(env, head_dim)
        transports = self.resolve_transports(env, lets, groups)
        biases = self.resolve_bias(lets)
        temperature = self.resolve_temperature(lets)
        self.check_values(env, lets, temperature)
        train = self.resolve_section(m.train, env, "train")
        evals = self.resolve_section(m.eval, env, "eval")
        self.check_block("train", m.train, train, train)
        self.check_block("eval", m.eval, evals, train)
        allow = self.resolve_allow()
        if any(d.severity == "error" for d in self.diags):
            return None, self.diags
        scheme = Scheme(
            name=m.name,
            doc=m.doc,
            file=self.src.file,
            bases=m.bases,
            params={k: v for k, v in self.values.items() if k in m.params},
            heads=heads,
            head_dim=head_dim,
            layout=layout,
            groups=tuple(groups.values()),
            transports=tuple(transports),
            biases=tuple(biases),
            temperature=temperature,
            train=train,
            eval=evals,
            allow=tuple(allow),
            source=self.src.text,
            source_hash=hashlib.sha256(self.src.text.encode()).hexdigest(),
        )
        from pedsl.lang.lint import lint

        for d in lint(scheme, self):
            self.diags.append(d)
        return scheme, self.diags

    # limits (pedsl/limits.py) and values that would fail later -------------
    def check_structure(self) -> bool:
        """heads / head_dim within their caps, before anything is sized by them."""
        bad = False
        for name in ("heads", "head_dim"):
            msg = bounds.structural_issue(name, self.values.get(name, self.structural[name]))
            if msg is None:
                continue
            bad = True
            if name in self.m.params:
                loc = self.m.params[name]
                self.report("E212", msg, loc.stmt, src=loc.src, hint=f"choose a smaller {name}")
            else:
                decl = next((d for d in self.src.module.schemes if d.name == self.m.name), None)
                how = "-P" if name in self.overrides else "the model's shape (--heads / --head-dim)"
                self.report("E303", msg + f" (from {how})", decl, src=self.src, hint=f"choose a smaller {name}")
        return bad

    def check_values(self, env: StaticEnv, lets, temperature) -> None:
        """Static builtin arguments, biases and the temperature, probed where they are used."""
        seen: set = set()
        for loc in self.m.transports:
            self._current = loc.src
            bounds.check_calls(inline_lets(loc.stmt.value, lets), env, self.report, seen)
        if self.m.bias is not None:
            self._current = self.m.bias.src
            value = inline_lets(self.m.bias.stmt.value, lets)
            bounds.check_calls(value, env, self.report, seen)
            if not _errors(self.diags):
                bounds.probe(value, env, self.report, "the bias")
        if temperature is not None:
            self._current = self.m.temperature.src
            bounds.check_calls(temperature, env, self.report, seen)
            if not _errors(self.diags):
                bounds.probe(temperature, env, self.report, "the temperature", bound=bounds.MAX_TEMPERATURE)

    def check_block(self, which: str, table: dict[str, Located], values: dict[str, Any], train: dict[str, Any]) -> None:
        """A train/eval block through the config models the commands use (caps, ranges)."""
        if not table or _errors(self.diags):
            return
        msg, fld, hint = bounds.config_issue(which, values, train)
        if not msg:
            return
        parts = (fld or "").split(".")
        at = next((loc for key, loc in table.items() if key in (fld, parts[0], parts[-1], ".".join(parts[:2]))),
                  next(iter(table.values())))
        self._current = at.src
        self.report("E213", msg, at.stmt, hint=hint)

    def resolve_groups(self, env: StaticEnv, head_dim: int) -> dict[str, ChannelGroup]:
        groups: dict[str, ChannelGroup] = {}
        if self.m.channels is None:
            groups["all"] = ChannelGroup(name="all", channels=tuple(range(head_dim)), spec="all")
            return groups
        loc = self.m.channels
        self._current = loc.src
        taken: set[int] = set()
        rest_groups = []
        chk = self.checker()
        for g in loc.stmt.groups:
            self._failed_groups.add(g.name)  # until it resolves; its transports then stay quiet
            if g.name in groups or g.name in [r.name for r in rest_groups]:
                self.report("E205", f"channel group '{g.name}' is declared twice", g)
                continue
            t = chk.infer(g.spec)
            if t is None:
                continue
            if t.kind != "group":
                self.report("E204", f"channel group '{g.name}' needs a layout (all, rest, fraction(f), "
                            f"quarters(a, b), range(a, b)), not {t.show()}", g.spec)
                continue
            try:
                spec = evaluate(g.spec, env)
            except EvalIssue as issue:
                self.report("E217", str(issue), issue.node or g.spec, hint=issue.hint)
                continue
            if isinstance(spec, GroupSpec) and spec.kind == "rest":
                rest_groups.append(g)
                self._failed_groups.discard(g.name)
                continue
            try:
                chans = group_channels(spec, head_dim, taken)
            except EvalIssue as issue:
                self.report("E210", f"channel group '{g.name}': {issue}", g.spec, hint=issue.hint)
                continue
            overlap = taken & set(chans)
            if overlap:
                self.report("E211", f"channel group '{g.name}' overlaps another group (channels "
                            f"{channel_ranges(sorted(overlap))})", g.spec)
                continue
            taken |= set(chans)
            groups[g.name] = ChannelGroup(name=g.name, channels=tuple(chans), spec=to_source(g.spec))
            self._failed_groups.discard(g.name)
        for g in rest_groups:
            chans = [c for c in range(head_dim) if c not in taken]
            taken |= set(chans)
            groups[g.name] = ChannelGroup(name=g.name, channels=tuple(chans), spec="rest")
        return groups

    def resolve_transports(self, env: StaticEnv, lets, groups: dict[str, ChannelGroup]) -> list:
        out = []
        used: dict[int, str] = {}
        for loc in self.m.transports:
            st: ast.Transport = loc.stmt
            self._current = loc.src
            gname = st.group or "all"
            if gname == "all" and "all" not in groups:
                head_dim = len({c for g in groups.values() for c in g.channels}) or self.structural["head_dim"]
                group = ChannelGroup(name="all", channels=tuple(range(int(self.values.get("head_dim", head_dim)))),
                                     spec="all")
            elif gname not in groups:
                if gname in self._failed_groups:
                    continue  # its declaration was reported already
                hint = did_you_mean(gname, groups) or ("declare it in a channels { ... } block" if groups else None)
                self.report("E211", f"unknown channel group '{gname}'", st, hint=hint)
                continue
            else:
                group = groups[gname]
            if st.value.kind == "name" and st.value.id == "none":
                continue
            t = self.checker().infer(st.value)
            if t is None:
                continue
            if t.kind != "transport":
                self.report("E204", f"a {st.targets} line needs a transport (rotate(...) or accumulate(...)), "
                            f"not {t.show()}", st.value)
                continue
            clash = sorted(c for c in group.channels if c in used)
            if clash:
                self.report("E214", f"two transports act on channels {channel_ranges(clash)} (groups '{used[clash[0]]}' "
                            f"and '{gname}')", st, hint="give each transport its own channel group")
                continue
            for c in group.channels:
                used[c] = gname
            if len(group.channels) % 2 and "householder" not in t.detail:
                self.report("E210", f"group '{gname}' has {len(group.channels)} channels; rotations need pairs", st)
                continue
            value = inline_lets(st.value, lets)
            if gname == "all" and "all" not in groups:
                groups["all"] = group
            out.append(self._classify(st, value, t, gname, env, group))
        return [x for x in out if x is not None]

    def _classify(self, st: ast.Transport, value: ast.Expr, t: Ty, gname: str, env: StaticEnv, group: ChannelGroup):
        fn = value
        if fn.kind == "call" and fn.func == "rotate":
            phase = _arg(fn, "phase")
            self._check_static(phase, env, len(group.channels) // 2)
            scale_expr = next((kw.value for kw in fn.kwargs if kw.name == "scale"),
                              fn.args[1] if len(fn.args) > 1 else None)
            scale = self._rotate_scale(scale_expr, st, env)
            if scale is None:
                return None
            return RotateTransport(targets=st.targets, group=gname, phase=phase, dynamic=t.runtime, scale=scale,
                                   scale_expr=scale_expr)
        if fn.kind == "call" and fn.func == "accumulate":
            step = _arg(fn, "step")
            if step.kind == "call" and step.func == "rotation":
                angle = _arg(step, "angle")
                self._check_static(angle, env, len(group.channels) // 2)
                return RotationSteps(targets=st.targets, group=gname, angle=angle, data=t.data, learned=t.learned)
            if step.kind == "call" and step.func == "householder":
                w, beta = _arg(step, "w"), _arg(step, "beta")
                try:
                    bval = evaluate(beta, env)
                except EvalIssue:
                    bval = DYNAMIC
                ortho = isinstance(bval, (int, float)) and bval in (0, 2)
                return HouseholderSteps(targets=st.targets, group=gname, w=w, beta=beta, orthogonal=ortho)
        self.report("E204", "write a transport as rotate(PHASE), accumulate(rotation(ANGLE)) or "
                    "accumulate(householder(w = ..., beta = ...))", st.value)
        return None

    def _rotate_scale(self, expr: ast.Expr | None, st: ast.Transport, env: StaticEnv) -> float | None:
        """The static value of rotate(..., scale = S) (1 when absent); None after reporting an error."""
        if expr is None:
            return 1.0
        try:
            value = evaluate(expr, env)
        except EvalIssue as issue:
            self.report("E217", str(issue), issue.node or expr, hint=issue.hint)
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            self.report("E217", f"rotate(): scale must be a positive number, got {value!r}", expr)
            return None
        if st.targets == "qkv" and value != 1:
            self.report("E204", "rotate(): a scale applies to q and k only; it cannot go with value rotation (qkv)",
                        expr, hint="write 'qk:' or drop the scale")
            return None
        return float(value)

    def _check_static(self, e: ast.Expr, env: StaticEnv, pairs: int) -> None:
        """Evaluate the static parts (grids) once so their errors show up at check time."""
        try:
            evaluate(e, env.child(pairs=pairs))
            # Probe once at position 1 so math errors in static parts mixed with the position
            # (e.g. "position / factor" with factor = 0) surface at check time too.
            probe = StaticEnv(values={**env.values, "position": 1}, lets=env.lets, pairs=pairs, n=env.n)
            evaluate(e, probe)
            # And at the longest sequence pedsl runs: grids that read the length (dynamic_ntk) change there.
            evaluate(e, StaticEnv(values=env.values, lets=env.lets, pairs=pairs, n=MAX_LENGTH))
        except EvalIssue as issue:
            self.report("E217", str(issue), issue.node or e, hint=issue.hint)

    def resolve_bias(self, lets) -> list:
        loc = self.m.bias
        if loc is None:
            return []
        self._current = loc.src
        value = loc.stmt.value
        if value.kind == "name" and value.id == "none":
            return []
        t = self.checker().infer(value)
        if t is None:
            return []
        if t.kind == "num" and not t.axes <= {"head", "dist"}:
            self.report("E204", f"a bias is a field over head and distance, not {t.show()}", value,
                        hint="e.g. -slopes(heads) * distance, or accumulate(log_sigmoid(linear(x, to = head)))")
            return []
        if t.kind not in ("num", "bias"):
            self.report("E204", f"a bias must be a number field or accumulate(log-gate), not {t.show()}", value)
            return []
        out = []
        for term in split_terms(inline_lets(value, lets)):
            if term.kind == "call" and term.func == "accumulate":
                out.append(GateBias(log_gate=_arg(term, "step"), data="x" in names_in(term)))
            elif term.kind == "unary" and term.operand.kind == "call" and term.operand.func == "accumulate":
                from pedsl.lang.exprs import neg

                out.append(GateBias(log_gate=neg(_arg(term.operand, "step")), data="x" in names_in(term)))
            elif "distance" in names_in(term):
                out.append(DistanceBias(term=term, slope=distance_coefficient(term)))
            elif "constant_bias" not in {n for loc in self.m.allow for n in loc.stmt.names}:
                # a term that depends on neither i - j nor the route cancels in the softmax
                self.report("W106", "this bias term does not depend on the distance: it cancels in the softmax",
                            term, severity="warning", hint="remove it, or 'allow constant_bias'")
        return out

    def resolve_temperature(self, lets) -> ast.Expr | None:
        loc = self.m.temperature
        if loc is None:
            return None
        self._current = loc.src
        value = loc.stmt.value
        if value.kind == "name" and value.id == "none":
            return None
        t = self.checker().infer(value)
        if t is None:
            return None
        if t.kind != "num" or not t.axes <= {"pos", "head"} or t.data:
            self.report("E204", f"a temperature is a number per query position (and head), not {t.show()}", value,
                        hint="e.g. log_length(train_length) or a constant")
            return None
        return inline_lets(value, lets)

    def resolve_section(self, table: dict[str, Located], env: StaticEnv, which: str) -> dict[str, Any]:
        fields = _config_fields(which)
        out: dict[str, Any] = {}
        for key, loc in table.items():
            self._current = loc.src
            entry: ast.Entry = loc.stmt
            if fields is not None and key not in fields:
                hint = did_you_mean(key, fields) or f"the {which} keys are: {', '.join(sorted(fields))}"
                self.report("E213", f"unknown {which} setting '{key}'", entry, hint=hint)
                continue
            if self.checker().infer(entry.value) is None:
                continue
            try:
                v = evaluate(entry.value, env)
            except EvalIssue as issue:
                self.report("E217", str(issue), issue.node or entry.value, hint=issue.hint)
                continue
            if v is DYNAMIC or isinstance(v, (Vec, GroupSpec)):
                self.report("E204", f"{which} setting '{key}' must be a constant (number, string or list)",
                            entry.value)
                continue
            if isinstance(v, list):
                v = [int(x) if isinstance(x, float) and x.is_integer() else x for x in v]
            out[key] = v
        return out

    def resolve_allow(self) -> list[str]:
        out = []
        for loc in self.m.allow:
            self._current = loc.src
            for name in loc.stmt.names:
                if name not in WARNINGS:
                    self.report("E216", f"unknown warning '{name}' in allow", loc.stmt,
                                hint=did_you_mean(name, WARNINGS) or "known: " + ", ".join(WARNINGS))
                else:
                    out.append(name)
        return out


def _arg(call: ast.Call, name: str) -> ast.Expr:
    spec = FUNCTIONS[call.func]
    pnames = [p for p, _ in spec.params]
    for p, a in zip(pnames, call.args):
        if p == name:
            return a
    for kw in call.kwargs:
        if kw.name == name:
            return kw.value
    raise KeyError(name)  # pragma: no cover - the checker guarantees required args


def _config_fields(which: str) -> set[str] | None:
    """The keys a train/eval block may use: the fields of the config models the commands read."""
    try:
        from pedsl import config
    except ImportError:  # pragma: no cover - the config module ships with pedsl
        return None
    return config.train_block_keys() if which == "train" else config.eval_block_keys()


# ------------------------------------------------------------------ entry points


def resolve(
    src: Source, scheme: str | None = None, params: dict[str, Any] | None = None,
    structural: dict[str, int] | None = None,
) -> tuple[Scheme, list[Diagnostic]]:
    """Resolve one scheme of a loaded file; raise CheckError with every error found."""
    decl = select_scheme(src, scheme)
    diags: list[Diagnostic] = []
    links = chain(decl, src, diags)
    merged = merge(links, diags)
    struct = dict(STRUCTURAL_DEFAULTS)
    struct.update({k: int(v) for k, v in (structural or {}).items() if v is not None})
    overrides = {k: (parse_override(v) if isinstance(v, str) else v) for k, v in (params or {}).items()}
    try:
        result, more = Resolver(merged, overrides, struct, src).resolve() if not _errors(diags) else (None, [])
    except RecursionError:  # a safety net: every input must end in a diagnostic
        decl_pos = _pos(decl)
        sink = _sink(src)
        sink.add("E103", f"definitions in scheme '{decl.name}' are nested too deeply to check", **decl_pos,
                 hint="shorten chains of lets that refer to each other")
        result, more = None, sink.items
    diags.extend(more)
    if result is None or _errors(diags):
        errs = sorted(diags, key=lambda d: (d.severity != "error", d.file or "", d.line or 0, d.col or 0))
        raise CheckError(errs[0].message, diagnostics=errs)
    return result, diags


def _errors(diags: list[Diagnostic]) -> bool:
    return any(d.severity == "error" for d in diags)


def check_all(src: Source, params: dict[str, Any] | None = None) -> list[Diagnostic]:
    """Every diagnostic (errors and warnings) for every scheme of a file."""
    out: list[Diagnostic] = []
    seen: set[tuple] = set()
    names: dict[str, ast.SchemeDecl] = {}
    if not src.module.schemes:
        sink = _sink(src)
        sink.add("E215", f"{src.file or 'the input'} declares no scheme", line=1, col=1,
                 hint='write one: scheme name "description" { ... }')
        return sink.items
    for decl in src.module.schemes:
        if decl.name in names:
            sink = _sink(src)
            sink.add("E205", f"scheme '{decl.name}' is declared twice", **_pos(decl),
                     hint=f"the first is on line {names[decl.name].span.line}" if names[decl.name].span else None)
            out.extend(sink.items)
            continue
        names[decl.name] = decl
        own = {k: v for k, v in (params or {}).items()}
        try:
            _, diags = resolve(src, decl.name, own)
        except CheckError as err:
            diags = err.diagnostics
        except ParseError as err:  # pragma: no cover - parsing happened already
            diags = err.diagnostics
        for d in diags:
            key = (d.file, d.line, d.col, d.code, d.message)
            if key not in seen:
                seen.add(key)
                out.append(d)
    return out

"""Loading ``.pe`` files and their imports, and the import policy (where an import may come from)."""

from __future__ import annotations

import os
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from pedsl.errors import CheckError, DiagnosticSink, ParseError, PedslError
from pedsl.lang import ast
from pedsl.lang.library import library_dir, scheme_file
from pedsl.lang.parser import decode, parse_module, read_bytes
from pedsl.limits import MAX_IMPORT_DEPTH, MAX_IMPORTS


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


def _exists(path: Path, regular: bool = False) -> bool:
    """Whether ``path`` exists (is a regular file); False for a name the OS refuses (over 255 bytes)."""
    try:
        return path.is_file() if regular else path.exists()
    except OSError:
        return False


def import_target(base_dir: Path, name: str, roots: list[Path]) -> tuple[Path, str | None]:
    """Where ``import "name"`` in a file of ``base_dir`` leads, and why it is refused (None when allowed).

    The path is relative to the importing file; when no such file exists there, the library file of
    that name is used. The target must be a regular ``.pe`` file under one of ``roots`` (after
    following symbolic links)."""
    target = real_path(base_dir / name)  # CheckError for a symlink loop
    if not _exists(target) and _exists(library_dir() / name, regular=True):
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
        return self._load(read_source(path), str(path), path.parent, stack + (key,), key)

    def load_text(self, text: str, file: str | None = None, base_dir: Path | None = None,
                  path: Path | None = None) -> Source:
        """Load ``text``; ``path``, when the text is an edited copy of that file, counts for import cycles
        as the file itself would."""
        self.roots = import_roots(base_dir or Path.cwd())
        stack = (str(real_path(path)),) if path is not None else ()
        return self._load(text, file, base_dir or Path.cwd(), stack, None)

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


def read_source(path: Path) -> str:
    """The text of a ``.pe`` file as every reader of one takes it: a regular file only, at most the size
    limit, UTF-8; a CheckError (E209) for a file that cannot be read, a ParseError for its bytes."""
    try:
        data = read_bytes(path)
    except FileNotFoundError:
        raise CheckError(f"no such file: {path}", code="E209", file=str(path), line=1, col=1,
                         hint="check the path") from None
    except IsADirectoryError:
        raise CheckError(f"{path} is a folder, not a .pe file", code="E209", file=str(path), line=1, col=1,
                         hint="give the .pe files inside it, e.g. folder/*.pe") from None
    except OSError as exc:
        raise CheckError(f"cannot read {path}: {exc.strerror or exc}", code="E209", file=str(path), line=1,
                         col=1) from None
    except ValueError:  # a NUL byte or a lone surrogate: no file can have that name
        raise CheckError(f"cannot read {path}: not a valid file name", code="E209", file=str(path), line=1,
                         col=1) from None
    return decode(data, str(path))


def real_path(path: Path) -> Path:
    """``path.resolve()``, or a CheckError for a symlink loop (or a name the OS refuses)."""
    try:
        return path.resolve()
    except ValueError:  # a NUL byte or a lone surrogate in the name
        raise CheckError(f"cannot resolve {path}: not a valid file name", code="E209", file=str(path), line=1,
                         col=1, hint="name a .pe file") from None
    except (RuntimeError, OSError) as exc:
        what = "a symlink loop" if isinstance(exc, RuntimeError) or getattr(exc, "errno", None) == 40 else \
            (getattr(exc, "strerror", None) or str(exc))
        raise CheckError(f"cannot resolve {path}: {what}", code="E209", file=str(path), line=1, col=1,
                         hint="fix or remove the symlink") from None



def looks_like_text(x: str) -> bool:
    """Whether a string given where a scheme is read is ``.pe`` source text rather than a path or a
    library name: it holds a newline or a brace, or nothing - unless it names something that exists
    (``d{1}/rope.pe`` is a path)."""
    if len(x) < 4096 and os.path.lexists(x):
        return False
    return "\n" in x or "{" in x or x.strip() == ""


def load_source(path_or_text: str | Path, loader: Loader | None = None) -> Source:
    loader = loader or Loader()
    if isinstance(path_or_text, Path) or not looks_like_text(path_or_text):
        return loader.load_path(scheme_file(path_or_text))  # a path, or the name of a library scheme
    return loader.load_text(path_or_text, "<text>")

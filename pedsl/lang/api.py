"""The front end's public API: ``load``, ``parse``, ``format``, ``check`` (and, for a text held in an editor,
``load_text``, ``format_text``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pedsl.errors import Diagnostic
from pedsl.lang import ast
from pedsl.lang.formatter import format_module
from pedsl.lang.parser import decode, parse_module, read_bytes
from pedsl.lang.imports import Loader, Source, load_source, looks_like_text
from pedsl.lang.resolve import check_all, resolve
from pedsl.lang.scheme import Scheme
from pedsl.errors import CheckError


def _text_of(path_or_text: str | Path) -> tuple[str, str | None]:
    if isinstance(path_or_text, Path) or not looks_like_text(path_or_text):
        p = Path(path_or_text)
        try:
            return decode(read_bytes(p), str(p)), str(p)
        except FileNotFoundError:
            raise CheckError(f"no such file: {p}", code="E209", file=str(p), line=1, col=1,
                             hint="check the path") from None
        except IsADirectoryError:
            raise CheckError(f"{p} is a folder, not a .pe file", code="E209", file=str(p), line=1, col=1) from None
        except OSError as exc:
            raise CheckError(f"cannot read {p}: {exc.strerror}", code="E209", file=str(p), line=1, col=1) from None
    return path_or_text, None


def parse(path_or_text: str | Path) -> ast.Module:
    """The syntax tree of a file or text (no checking beyond syntax)."""
    text, file = _text_of(path_or_text)
    return parse_module(text, file)


def format(path_or_text: str | Path) -> str:  # noqa: A001 - pedsl.format, as `pedsl fmt` names it
    """The canonical text of a file or text."""
    text, file = _text_of(path_or_text)
    return format_module(parse_module(text, file), text)


def format_text(text: str, file: str | None = None) -> str:
    """The canonical text of ``text`` (what ``pedsl fmt`` writes); ``file`` names it in diagnostics."""
    return format_module(parse_module(text, file), text)


def load_text(text: str, file: str | Path | None = None, base_dir: Path | None = None) -> Source:
    """A file's text as an editor holds it, loaded with its imports as ``pedsl check FILE`` loads the file:
    imports relative to ``base_dir`` (the file's folder; the current folder when neither is given) and
    confined to that folder tree, the scheme library and the allowed import roots; an import cycle back
    to ``file`` is found as in the file. Raises ParseError or CheckError (syntax, imports); pass the
    result to :func:`check` or :func:`load_with_warnings`."""
    if base_dir is None:
        base_dir = Path(file).parent if file is not None else Path.cwd()
    try:
        path = Path(file) if file is not None and Path(file).is_file() else None
    except OSError:  # a name the OS refuses (over 255 bytes): no file on disk is this text
        path = None
    return Loader().load_text(text, None if file is None else str(file), Path(base_dir), path=path)


def load(
    path_or_text: str | Path | Scheme,
    params: dict[str, Any] | None = None,
    scheme: str | None = None,
    *,
    heads: int | None = None,
    head_dim: int | None = None,
    layers: int | None = None,
) -> Scheme:
    """The resolved, checked scheme (after imports, extends and parameters).

    ``path_or_text`` is a path (str or Path) or the text of a `.pe` file; a file with
    several schemes needs ``scheme`` unless one is named like the file. ``params``
    overrides parameters (values or ``-P``-style strings); ``heads``/``head_dim`` set
    the structural names the model fixes, ``layers`` its layer count (read by a ``layers`` scheme).
    """
    if isinstance(path_or_text, Scheme):
        same_count = layers is None or path_or_text.layers is None or path_or_text.layers.count == layers
        if not params and heads in (None, path_or_text.heads) and head_dim in (None, path_or_text.head_dim) \
                and same_count:
            return path_or_text
        src = Loader().load_text(path_or_text.source, path_or_text.file,
                                 Path(path_or_text.file).parent if path_or_text.file else None)
        scheme = scheme or path_or_text.name
        params = {**path_or_text.params, **(params or {})}
    else:
        src = load_source(path_or_text)
    result, _ = resolve(src, scheme, params, {"heads": heads, "head_dim": head_dim, "layers": layers})
    return result


def _source(path_or_text: str | Path | Source) -> Source:
    return path_or_text if isinstance(path_or_text, Source) else load_source(path_or_text)


def load_with_warnings(path_or_text, params=None, scheme=None, **structural) -> tuple[Scheme, list[Diagnostic]]:
    """Like :func:`load`, with the lint warnings; also takes a :func:`load_text` result."""
    return resolve(_source(path_or_text), scheme, params, structural)


def check(path_or_text: str | Path | Source, params: dict[str, Any] | None = None) -> list[Diagnostic]:
    """All diagnostics (errors and warnings) of every scheme in a file (a path, text, or a :func:`load_text`
    result); raises only on syntax and import errors."""
    return check_all(_source(path_or_text), params)

"""The front end's public API: ``load``, ``parse``, ``format``, ``check``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pedsl.errors import Diagnostic
from pedsl.lang import ast
from pedsl.lang.formatter import format_module
from pedsl.lang.parser import decode, parse_module, read_bytes
from pedsl.lang.imports import Loader, load_source, looks_like_text
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


def load(
    path_or_text: str | Path | Scheme,
    params: dict[str, Any] | None = None,
    scheme: str | None = None,
    *,
    heads: int | None = None,
    head_dim: int | None = None,
) -> Scheme:
    """The resolved, checked scheme (after imports, extends and parameters).

    ``path_or_text`` is a path (str or Path) or the text of a `.pe` file; a file with
    several schemes needs ``scheme`` unless one is named like the file. ``params``
    overrides parameters (values or ``-P``-style strings); ``heads``/``head_dim`` set
    the structural names the model fixes.
    """
    if isinstance(path_or_text, Scheme):
        if not params and heads in (None, path_or_text.heads) and head_dim in (None, path_or_text.head_dim):
            return path_or_text
        src = Loader().load_text(path_or_text.source, path_or_text.file,
                                 Path(path_or_text.file).parent if path_or_text.file else None)
        scheme = scheme or path_or_text.name
        params = {**path_or_text.params, **(params or {})}
    else:
        src = load_source(path_or_text)
    result, _ = resolve(src, scheme, params, {"heads": heads, "head_dim": head_dim})
    return result


def load_with_warnings(path_or_text, params=None, scheme=None, **structural) -> tuple[Scheme, list[Diagnostic]]:
    src = load_source(path_or_text)
    return resolve(src, scheme, params, structural)


def check(path_or_text: str | Path, params: dict[str, Any] | None = None) -> list[Diagnostic]:
    """All diagnostics (errors and warnings) of every scheme in a file; raises only on syntax errors."""
    return check_all(load_source(path_or_text), params)

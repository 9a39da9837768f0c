"""Front-end commands: ``check``, ``fmt``, ``show``, ``schema`` and ``list``.

They read `.pe` files through :mod:`pedsl.lang.api` and never import torch.
Every problem with an input becomes a positioned diagnostic (``file:line:col:
error[CODE]: ...``) and exit code 1; a wrong command line is exit code 2.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import sys
from pathlib import Path
from typing import Iterable

import click

from pedsl.cli.options import raw_params as parse_params
from pedsl.cli.render import render_scheme
from pedsl.errors import CheckError, Diagnostic, ParseError, PedslError, UsageError
from pedsl.fsio import atomic_write_text
from pedsl.lang.api import format_text, load_with_warnings, parse
from pedsl.lang.imports import Loader, load_source
from pedsl.lang.library import library_dir
from pedsl.lang.parser import MAX_BYTES, decode, read_bytes
from pedsl.lang.resolve import check_all
from pedsl.lang.scheme import Scheme

# ------------------------------------------------------------------ helpers


def _printable(line: str | None) -> str | None:
    """A source line safe to print: control characters (escape sequences, NUL) become '?', one
    character each so the caret stays under the right column."""
    if line is None or line.isprintable():
        return line
    return "".join(c if c.isprintable() or c == "\t" else "?" for c in line)


def _with_file(diags: Iterable[Diagnostic], file: str) -> list[Diagnostic]:
    """Diagnostics that name no file (parameter overrides, missing files) get the file they concern."""
    return [dataclasses.replace(d, file=d.file or file, source_line=_printable(d.source_line)) for d in diags]


def _diagnostics_of(path: str, params: dict[str, str], loader=None) -> list[Diagnostic]:
    """Every diagnostic for one file; errors that stop checking early are diagnostics too.

    ``loader`` (a :class:`pedsl.lang.imports.Loader`) is shared across the files of one run,
    so a file imported by several others is parsed once.
    """
    try:
        if path == "-":  # standard input: imports resolve from the current directory
            src = (loader or Loader()).load_text(_read_stdin(), "<stdin>", Path.cwd())
        else:
            src = load_source(Path(path), loader)
        diags = check_all(src, params or None)
    except PedslError as err:
        diags = err.diagnostics
    return _with_file(diags, "<stdin>" if path == "-" else path)


def _echo_diag(d: Diagnostic) -> None:
    click.echo(d.render())


def _exit(code: int) -> None:
    """End the command with an exit code (returned by ``main`` in non-standalone mode)."""
    click.get_current_context().exit(code)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


# ------------------------------------------------------------------ check


@click.command()
@click.argument("files", nargs=-1, required=True)
@click.option("--strict", is_flag=True, help="Treat warnings as errors (exit 1 on any warning).")
@click.option("--json", "as_json", is_flag=True, help="Print the diagnostics as a JSON list.")
@click.option("-P", "--param", "params", multiple=True, metavar="NAME=VALUE",
              help="Override a scheme parameter (repeatable).")
@click.option("-q", "--quiet", is_flag=True, help="Print errors only: no warnings (in --json too), no summary.")
def check(files: tuple[str, ...], strict: bool, as_json: bool, params: tuple[str, ...], quiet: bool) -> None:
    """Check .pe FILES (- reads standard input): syntax, names, types, layouts, parameters, then lint warnings.

    Exit code 0 when every file is valid, 1 when a file has an error (or a
    warning with --strict).
    """
    overrides = parse_params(params)
    loader = Loader()
    all_diags: list[Diagnostic] = []
    for path in files:
        all_diags.extend(_diagnostics_of(path, overrides, loader))
    if strict:
        all_diags = [dataclasses.replace(d, severity="error") if d.severity == "warning" else d for d in all_diags]
    errors = sum(d.severity == "error" for d in all_diags)
    warnings = len(all_diags) - errors
    if as_json:
        shown = [d for d in all_diags if d.severity == "error"] if quiet else all_diags
        click.echo(json.dumps([d.to_json() for d in shown], indent=2))
    else:
        for d in all_diags:
            if quiet and d.severity != "error":
                continue
            _echo_diag(d)
        if not quiet:
            status = "ok" if not errors else "failed"
            click.echo(
                f"pedsl check: {_plural(len(files), 'file')}, {_plural(errors, 'error')}, "
                f"{_plural(warnings, 'warning')}: {status}",
                err=True,
            )
    _exit(1 if errors else 0)


# ------------------------------------------------------------------ fmt


def _read(path: str) -> str:
    try:
        data = read_bytes(Path(path))
    except FileNotFoundError:
        raise CheckError(f"no such file: {path}", code="E209", file=path, line=1, col=1,
                         hint="check the path") from None
    except IsADirectoryError:
        raise CheckError(f"{path} is a folder, not a .pe file", code="E209", file=path, line=1, col=1) from None
    except OSError as exc:
        raise CheckError(f"cannot read {path}: {exc.strerror}", code="E209", file=path, line=1, col=1) from None
    return decode(data, path)


def _read_stdin() -> str:
    stream = sys.stdin
    data = stream.buffer.read(MAX_BYTES + 1) if hasattr(stream, "buffer") else stream.read().encode("utf-8")
    if len(data) > MAX_BYTES:
        raise ParseError(f"input too large (over {MAX_BYTES / 1e6:.0f} MB)", code="E102", file="<stdin>", line=1,
                         col=1, hint="a .pe file declares schemes in a few lines")
    return decode(data, "<stdin>")


def write_atomic(path: str, text: str) -> None:
    """Replace ``path`` with ``text`` atomically, keeping its permissions (see :mod:`pedsl.fsio`); `fmt --write`
    edits the source the user named, so through a symlink it rewrites the file the link points to."""
    atomic_write_text(path, text, follow_symlinks=True)


def _diff(old: str, new: str, path: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"{path}", f"{path} (formatted)"))


@click.command()
@click.argument("files", nargs=-1, required=True)
@click.option("--check", "check_only", is_flag=True, help="Change nothing; exit 1 listing the files that would change.")
@click.option("--diff", "show_diff", is_flag=True, help="Change nothing; print a unified diff of the changes.")
def fmt(files: tuple[str, ...], check_only: bool, show_diff: bool) -> None:
    """Rewrite .pe FILES in canonical form (in place, only when they change).

    `-` reads standard input and writes the canonical text to standard output.
    Comments are kept; the meaning never changes (parse(fmt(x)) == parse(x)).
    """
    failed = False
    changed: list[str] = []
    for path in files:
        try:
            name = "<stdin>" if path == "-" else path
            text = _read_stdin() if path == "-" else _read(path)
            new = format_text(text, name)
        except PedslError as err:
            for d in _with_file(err.diagnostics, path):
                _echo_diag(d)
            failed = True
            continue
        if new == text:
            if path == "-" and not (check_only or show_diff):
                click.echo(new, nl=False)
            continue
        changed.append(path)
        if show_diff:
            click.echo(_diff(text, new, path), nl=False)
        if check_only or show_diff:
            continue
        if path == "-":
            click.echo(new, nl=False)
        else:
            try:
                write_atomic(path, new)
            except PedslError as err:
                _echo_diag(err.diagnostics[0])
                failed = True
    if check_only or show_diff:
        for path in changed:
            if check_only:
                click.echo(f"would reformat {path}", err=True)
        if changed and check_only:
            click.echo(f"pedsl fmt: {_plural(len(changed), 'file')} would be reformatted", err=True)
            _exit(1)
    elif changed and not (len(files) == 1 and files[0] == "-"):
        click.echo(f"pedsl fmt: reformatted {_plural(len(changed), 'file')}", err=True)
    _exit(1 if failed else 0)


# ------------------------------------------------------------------ show


@click.command()
@click.argument("file")
@click.option("--scheme", "scheme_name", metavar="NAME", help="The scheme to show (default: the one named like the file).")
@click.option("-P", "--param", "params", multiple=True, metavar="NAME=VALUE", help="Override a scheme parameter.")
@click.option("--json", "as_json", is_flag=True, help="Print the resolved IR as JSON.")
def show(file: str, scheme_name: str | None, params: tuple[str, ...], as_json: bool) -> None:
    """Show the resolved scheme of FILE: after imports, extends and parameters."""
    overrides = parse_params(params)
    try:
        scheme, warnings = load_with_warnings(Path(file), overrides or None, scheme_name)
    except PedslError as err:
        err.diagnostics = _with_file(err.diagnostics, file)
        raise
    for d in _with_file(warnings, file):
        if d.severity == "warning":
            click.echo(d.render(), err=True)
    if as_json:
        click.echo(json.dumps(scheme.model_dump(mode="json", exclude={"source"}), indent=2))
    else:
        click.echo(render_scheme(scheme))


# ------------------------------------------------------------------ schema


@click.command()
def schema() -> None:
    """Print the JSON Schema of the resolved IR (pedsl.lang.scheme.Scheme)."""
    schema = Scheme.model_json_schema()
    if "$ref" in schema:  # Scheme refers to itself (a layers scheme's parts): its definition at the root
        name = schema.pop("$ref").rsplit("/", 1)[-1]
        schema = {**schema["$defs"][name], "$defs": schema["$defs"]}
    click.echo(json.dumps(schema, indent=2))


# ------------------------------------------------------------------ list


@click.command("list")
@click.argument("directory", required=False)
def list_schemes(directory: str | None) -> None:
    """List the schemes declared in DIR (default: the scheme library) with one-line descriptions."""
    folder = Path(directory) if directory else library_dir()
    if not folder.is_dir():
        raise UsageError(f"{folder} is not a folder", hint="give a folder of .pe files, or no argument for the library")
    files = sorted(folder.glob("*.pe"))
    if not files:
        click.echo(f"no .pe files in {folder}", err=True)
        return
    rows: list[tuple[str, str, str]] = []
    failed = False
    for path in files:
        try:
            module = parse(path)
        except PedslError as err:
            for d in _with_file(err.diagnostics, str(path)):
                click.echo(d.render(), err=True)
            failed = True
            continue
        for decl in module.schemes:
            doc = decl.doc or (f"(extends {decl.base})" if decl.base else "")
            rows.append((decl.name, doc.splitlines()[0] if doc else "", path.name))
    width = max((len(r[0]) for r in rows), default=0)
    for name, doc, fname in rows:
        click.echo(f"{name.ljust(width)}  {doc}  [{fname}]" if doc else f"{name.ljust(width)}  [{fname}]")
    _exit(1 if failed else 0)


__all__ = ["check", "fmt", "show", "schema", "list_schemes", "write_atomic"]

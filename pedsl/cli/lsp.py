"""``pedsl lsp``: the `.pe` language server over standard input and output, for editors.

It needs the ``lsp`` extra (pygls, lsprotocol); without it the command says so in one line and
exits 1. Nothing here is imported unless ``pedsl lsp`` runs.
"""

from __future__ import annotations

import importlib.util

import click

from pedsl.errors import PedslError

EXTRA = "lsp"
NEEDS = ("pygls", "lsprotocol")


def missing_extra() -> PedslError | None:
    """The error to report when a package of the ``lsp`` extra is not installed (None when all are)."""
    absent = [m for m in NEEDS if importlib.util.find_spec(m) is None]
    if not absent:
        return None
    return PedslError(f"`pedsl lsp` needs the '{EXTRA}' extra ({', '.join(absent)} not installed): "
                      f"pip install 'pedsl[{EXTRA}]'", code="E980")


@click.command()
@click.option("--stdio", is_flag=True, help="Talk over standard input and output (the default and only transport).")
def lsp(stdio: bool) -> int:
    """Run the .pe language server (diagnostics, completion, hover, go to definition, formatting) over stdio.

    Point an editor's LSP client at `pedsl lsp`; see docs/editors.md.
    """
    err = missing_extra()
    if err is not None:
        raise err
    from pedsl.lsp.server import main

    return main()  # 0, or 1 when the client exits without asking to shut down first (the protocol's rule)

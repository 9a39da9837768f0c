"""Where a diagnostic of the resolver points: a sink for one source file and the position of a syntax node."""

from __future__ import annotations

from typing import Any

from pedsl.errors import Diagnostic, DiagnosticSink
from pedsl.lang.imports import Source


def sink_for(src: Source) -> DiagnosticSink:
    """A sink whose diagnostics point into ``src``."""
    return DiagnosticSink(file=src.file, source=src.text)


def node_pos(node: Any) -> dict:
    """The position keywords (line, col, end_col) of a syntax node, or none when it has no span."""
    span = getattr(node, "span", None)
    if span is None:
        return {}
    end = span.end_col if span.end_line == span.line else None
    return {"line": span.line, "col": span.col, "end_col": end}


def has_errors(diags: list[Diagnostic]) -> bool:
    return any(d.severity == "error" for d in diags)

"""Diagnostic helpers shared by the resolver's stages (imports, extends, parameters, terms), and the
state those stages read from the :class:`~pedsl.lang.resolve.Resolver` they are mixed into."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pedsl.errors import Diagnostic, DiagnosticSink
from pedsl.lang.fold import fold_expr
from pedsl.lang.values import EvalIssue

FAILED = object()  # what ResolverStage.fold_or_report returns after reporting

if TYPE_CHECKING:
    from pedsl.lang.imports import Source
    from pedsl.lang.inherit import Merged
    from pedsl.lang.typecheck import Checker


def sink_for(src: "Source") -> DiagnosticSink:
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


class ResolverStage:
    """What the Resolver's stage mixins (params, terms, sections) read and call; the Resolver provides it."""

    m: Merged
    src: Source
    overrides: dict[str, Any]
    structural: dict[str, int]
    values: dict[str, Any]
    diags: list[Diagnostic]
    _current: Source

    if TYPE_CHECKING:
        def report(self, code: str, message: str, node: Any = None, *, hint: str | None = None,
                   src: Source | None = None, severity: str = "error") -> None: ...

        def checker(self) -> Checker: ...

    def fold_or_report(self, expr: Any, env: Any) -> Any:
        """The static value of ``expr`` in ``env``, or :data:`FAILED` after reporting why it cannot be
        folded (E217, at the sub-expression at fault, with its hint)."""
        try:
            return fold_expr(expr, env)
        except EvalIssue as issue:
            self.report("E217", str(issue), issue.node or expr, hint=issue.hint)
            return FAILED

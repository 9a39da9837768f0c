"""What the resolver's stage mixins (parameters, terms, sections) share: the state they read from the
:class:`~pedsl.lang.resolve.Resolver` they are mixed into, and folding a value or reporting why not."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pedsl.errors import Diagnostic
from pedsl.lang.fold import fold_expr
from pedsl.lang.imports import Source
from pedsl.lang.inherit import Merged
from pedsl.lang.typecheck import Checker
from pedsl.lang.values import EvalIssue

FAILED = object()  # what ResolverStage.fold_or_report returns after reporting


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

    def given_value(self, loc: Any) -> Any:
        """The value of a statement that may be absent or ``none`` (which drops an inherited one): None
        for either, else the value, with diagnostics pointed at the statement's file."""
        if loc is None:
            return None
        self._current = loc.src
        value = loc.stmt.value
        return None if value.kind == "name" and value.id == "none" else value

    def fold_or_report(self, expr: Any, env: Any) -> Any:
        """The static value of ``expr`` in ``env``, or :data:`FAILED` after reporting why it cannot be
        folded (E217, at the sub-expression at fault, with its hint)."""
        try:
            return fold_expr(expr, env)
        except EvalIssue as issue:
            self.report("E217", str(issue), issue.node or expr, hint=issue.hint)
            return FAILED

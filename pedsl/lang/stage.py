"""What the resolver's stage mixins (parameters, terms, sections) share: the state they read from the
:class:`~pedsl.lang.resolve.Resolver` they are mixed into, and folding a value or reporting why not."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pedsl.errors import Diagnostic, did_you_mean
from pedsl.lang.exprs import inline_lets
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

    def named_options(self, call: Any, names: Any, code: str, usage: str, hint: str, env: Any,
                      lets: Any) -> dict[str, tuple[Any, Any]] | None:
        """A statement builtin's options, given by name (``cope(max_pos = 64)``), folded: ``{name: (value,
        node)}``; None after reporting (``code``) a positional argument (``usage`` says how to write the call), an
        option not among ``names`` (with did-you-mean), or one that does not fold."""
        if call.args:
            self.report(code, f"{call.func} takes its options by name: {usage}", call.args[0], hint=hint)
            return None
        got: dict[str, tuple[Any, Any]] = {}
        for kw in call.kwargs:
            if kw.name not in names:
                near = did_you_mean(kw.name, names)
                self.report(code, f"{call.func} has no option '{kw.name}'" + (f"; {near}" if near else "")
                            + f" (options: {', '.join(names)})", kw, hint=hint)
                return None
            folded = self.fold_or_report(inline_lets(kw.value, lets), env)
            if folded is FAILED:
                return None
            got[kw.name] = (folded, kw.value)
        return got

    def fold_or_report(self, expr: Any, env: Any) -> Any:
        """The static value of ``expr`` in ``env``, or :data:`FAILED` after reporting why it cannot be
        folded (E217, at the sub-expression at fault, with its hint)."""
        try:
            return fold_expr(expr, env)
        except EvalIssue as issue:
            self.report("E217", str(issue), issue.node or expr, hint=issue.hint)
            return FAILED

"""Checks that a scheme's values stay within :mod:`pedsl.limits` and cannot fail later.

Run by the resolver once types are known: the model sizes a scheme fixes (``heads``,
``head_dim``), the static arguments of every builtin call a transport, bias or temperature
reaches (``slopes(0)``, ``log_length(1)``, ``linear(rank = -5)``), the temperature and the
biases probed at a few query positions (``sqrt(-1)``, ``1e300``), and the ``train {}`` /
``eval {}`` blocks validated by the same configuration models the commands use. Every finding
is a positioned diagnostic, found before anything is allocated.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from pedsl import limits
from pedsl.lang import ast
from pedsl.lang.fold import ARG_RULES, CHECKED_ARGS, SignatureIssue, fold_expr
from pedsl.lang.exprs import walk
from pedsl.lang.values import DYNAMIC, EvalIssue, StaticEnv, Vec

# A temperature multiplies every attention score: past this the float32 scores of ordinary
# queries and keys overflow or the softmax collapses to one key.
MAX_TEMPERATURE = limits.MAX_TEMPERATURE

# Query positions the temperature and biases are probed at (the first, an early, a far one).
PROBES = (0, 1, limits.MAX_LENGTH - 1)

Report = Callable[..., None]


def structural_issue(name: str, value: Any) -> str | None:
    """Why a value of ``heads`` / ``head_dim`` cannot be used, or None."""
    cap = limits.MAX_HEADS if name == "heads" else limits.MAX_HEAD_DIM
    if isinstance(value, bool) or not isinstance(value, int):
        return None  # typing reports it
    if not 1 <= value <= cap:
        return f"'{name}' = {value:,} is out of range (1 .. {cap:,}; see pedsl/limits.py)"
    return None


def check_calls(expr: ast.Expr, env: StaticEnv, report: Report, seen: set, *, checked_args: bool = True) -> None:
    """Evaluate the static arguments of every run-time builtin and slopes() call in ``expr``, and
    refuse a number (a literal or a parameter) beyond float32: next to a run-time value it becomes
    a float32 tensor, infinite (``1e300 * sigmoid(...)``). ``checked_args=False`` leaves the calls with
    arguments that must fold (``learned(init)``) to a caller that folds them with the group's pairs."""
    for node in walk(expr):
        if node.kind == "num" or (node.kind == "name" and node.id in env.values):
            v = node.value if node.kind == "num" else env.values[node.id]
            if isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) > limits.FLOAT32_MAX:
                key = ("num", node.span.line, node.span.col) if node.span else id(node)
                if key not in seen:
                    seen.add(key)
                    report("E217", f"{v:g} is beyond the float32 range (+-3.4e38): it overflows in a tensor", node,
                           hint="rescale the constant")
            continue
        if node.kind != "call" or (node.func not in ARG_RULES and node.func != "slopes"
                                   and not (checked_args and node.func in CHECKED_ARGS)):
            continue
        key = (node.span.line, node.span.col) if node.span else id(node)
        if key in seen:
            continue
        seen.add(key)
        try:
            fold_expr(node, env)
        except SignatureIssue:
            continue  # the type checker's E203
        except EvalIssue as issue:
            report("E217", str(issue), issue.node or node, hint=issue.hint)


def probe(expr: ast.Expr, env: StaticEnv, report: Report, what: str, *, bound: float | None = None) -> None:
    """Evaluate ``expr`` at a few query positions (and equal distances); report math errors and values
    that are not finite (or exceed ``bound`` in magnitude)."""
    for i in PROBES:
        penv = StaticEnv(values={**env.values, "position": i, "distance": i, "query_position": i}, lets=env.lets,
                         n=i + 1)
        try:
            v = fold_expr(expr, penv)
        except SignatureIssue:
            return  # the type checker's E203
        except EvalIssue as issue:
            report("E217", f"{what}: {issue}", issue.node or expr, hint=issue.hint)
            return
        if v is DYNAMIC:
            continue
        values = v.values if isinstance(v, Vec) else (v,) if isinstance(v, (int, float)) else ()
        for x in values:
            if not math.isfinite(x) or (bound is not None and abs(x) > bound):
                report("E217", f"{what} is {x:g} at query position {i}: "
                       + (f"beyond +-{bound:g}" if bound is not None and math.isfinite(x) else "not a finite number"),
                       expr, hint="a temperature scales every attention score: keep it moderate (see pedsl/limits.py)"
                       if bound is not None else "keep static values finite")
                return


def config_issue(section: str, values: dict[str, Any], train: dict[str, Any]) -> tuple[str, str | None, str | None]:
    """Validate a ``train {}`` / ``eval {}`` block with the config models:
    (message, the setting at fault or None, hint) or ('', None, None) when it is valid."""
    from pedsl import config  # on use: `pedsl check` of a scheme without these blocks never loads yaml
    from pedsl.errors import ConfigError

    try:
        if section == "train":
            config.resolve_train_config(block=values, step_memory=False)  # checked by `pedsl train`
        else:
            try:
                context = config.resolve_train_config(block=train, step_memory=False).context
            except ConfigError:
                context = 128
            config.resolve_eval_config(block=values, context=context)
    except ConfigError as err:
        return str(err), getattr(err, "field", None), err.hint
    return "", None, None

"""The ``train`` / ``eval`` blocks of a scheme (keys checked against the config models) and ``allow``."""

from __future__ import annotations

from typing import Any

from pedsl.errors import did_you_mean
from pedsl.lang import ast, bounds
from pedsl.lang.builtins import WARNINGS
from pedsl.lang.inherit import Located
from pedsl.lang.diagnostics import has_errors
from pedsl.lang.exprs import calls_in
from pedsl.lang.stage import FAILED, ResolverStage
from pedsl.lang.values import DYNAMIC, GroupSpec, StaticEnv, Vec


class SectionResolution(ResolverStage):
    """The Resolver's train/eval/allow stage."""

    def check_block(self, which: str, table: dict[str, Located], values: dict[str, Any], train: dict[str, Any]) -> None:
        """A train/eval block through the config models the commands use (caps, ranges)."""
        if not table or has_errors(self.diags):
            return
        msg, fld, hint = bounds.config_issue(which, values, train)
        if not msg:
            return
        parts = (fld or "").split(".")
        at = next((loc for key, loc in table.items() if key in (fld, parts[0], parts[-1], ".".join(parts[:2]))),
                  next(iter(table.values())))
        self._current = at.src
        self.report("E213", msg, at.stmt, hint=hint)

    def check_xpos_lengths(self, transports, train: dict[str, Any]) -> None:
        """Each xpos() transport computable in float32 at the training context (the train block's or the default)."""
        xpos = [t for t in transports if getattr(t, "xpos_gamma", None) is not None]
        if not xpos or has_errors(self.diags):
            return
        lengths = bounds.declared_lengths(train)
        sites = [loc for loc in self.m.transports if "xpos" in calls_in(loc.stmt.value)] or list(self.m.transports)
        for i, t in enumerate(xpos):
            issue = bounds.xpos_issue(t.xpos_gamma, t.xpos_zeta, lengths) if lengths else None
            if issue is not None:
                loc = sites[min(i, len(sites) - 1)]
                self._current = loc.src
                self.report("E217", issue, loc.stmt.value, hint="raise gamma (the paper's is 512), or shorten the "
                            "train context")

    def resolve_section(self, table: dict[str, Located], env: StaticEnv, which: str) -> dict[str, Any]:
        fields = _config_fields(which)
        out: dict[str, Any] = {}
        for key, loc in table.items():
            self._current = loc.src
            entry: ast.Entry = loc.stmt
            if fields is not None and key not in fields:
                hint = did_you_mean(key, fields) or f"the {which} keys are: {', '.join(sorted(fields))}"
                self.report("E213", f"unknown {which} setting '{key}'", entry, hint=hint)
                continue
            if self.checker().infer(entry.value) is None:
                continue
            v = self.fold_or_report(entry.value, env)
            if v is FAILED:
                continue
            if v is DYNAMIC or isinstance(v, (Vec, GroupSpec)):
                self.report("E204", f"{which} setting '{key}' must be a constant (number, string or list)",
                            entry.value)
                continue
            if isinstance(v, list):
                v = [int(x) if isinstance(x, float) and x.is_integer() else x for x in v]
            out[key] = v
        return out

    def resolve_allow(self) -> list[str]:
        out = []
        for loc in self.m.allow:
            self._current = loc.src
            for name in loc.stmt.names:
                if name not in WARNINGS:
                    self.report("E216", f"unknown warning '{name}' in allow", loc.stmt,
                                hint=did_you_mean(name, WARNINGS) or "known: " + ", ".join(WARNINGS))
                else:
                    out.append(name)
        return out


def _config_fields(which: str) -> set[str] | None:
    """The keys a train/eval block may use: the fields of the config models the commands read."""
    try:
        from pedsl import config  # on use: yaml only for a scheme with train/eval blocks
    except ImportError:  # pragma: no cover - the config module ships with pedsl
        return None
    return config.train_block_keys() if which == "train" else config.eval_block_keys()

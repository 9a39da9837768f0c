"""Content-position terms: ``relative = shaw(...) | transformer_xl(...) | deberta(...)``, checked.

Each form adds to the raw score ``q_i . k_j`` of a pair terms that read the query or the key of that pair
with a table over a row index of the signed distance ``i - j`` (docs/semantics.md §3b):

* ``shaw(max_distance = K)``: ``q_i . a[clip(j - i, -K, K) + K]``, a learned ``(2K + 1, head_dim)`` table
  shared by the heads (Shaw et al. 2018, relative key embeddings);
* ``transformer_xl(dim = E)``: ``(q_i + v_h) . (R(i - j) W_R)_h + u_h . k_j``, R the sinusoid of width E,
  ``W_R`` ``(E, heads * head_dim)``, ``u``, ``v`` ``(heads, head_dim)`` learned (Dai et al. 2019);
* ``deberta(buckets = S, max_distance = M, c2p = true, p2c = true)``: ``q_i . Kr_h[r] + k_j . Qr_h[r]``,
  r DeBERTa-v2's log bucket of ``i - j`` shifted by S and clamped to ``0 .. 2S - 1``, Kr and Qr learned
  ``(2S, heads, head_dim)`` tables (the projections of the position embeddings, shared with the
  content projections or not: a reparametrisation the tables hold either way), every raw score divided by
  ``sqrt(head_dim (1 + terms))`` (He et al. 2021; Hugging Face's ``DisentangledSelfAttention``).

What they read is the query and key as given: the checker refuses them beside a transport, a temperature, a
sink, CoPE, remapped positions or a normaliser other than softmax (E224), whose composition with them no paper
defines.
"""

from __future__ import annotations

from pedsl.errors import did_you_mean
from pedsl.lang import ast
from pedsl.lang.exprs import to_source
from pedsl.lang.scheme import RelativeTerms
from pedsl.lang.stage import ResolverStage
from pedsl.lang.values import DYNAMIC, StaticEnv
from pedsl.limits import MAX_RELATIVE_ROWS

# each form's options: (name, kind ("int" or "bool"), default or None when required, least value)
RELATIVE_FORMS: dict[str, tuple[tuple[str, str, object, int], ...]] = {
    "shaw": (("max_distance", "int", None, 1),),
    "transformer_xl": (("dim", "int", None, 2),),
    "deberta": (("buckets", "int", None, 4), ("max_distance", "int", None, 4), ("c2p", "bool", True, 0),
                ("p2c", "bool", True, 0)),
}
_HINT = ("relative = shaw(max_distance = 16) (Shaw's relative keys), transformer_xl(dim = 64) (Transformer-XL's "
         "sinusoid terms with u and v), or deberta(buckets = 256, max_distance = 512) (DeBERTa-v2's c2p and p2c)")
# statements whose composition with content-position terms is refused, and why
_REFUSED = (("temperature", "a temperature (DeBERTa's scale is part of deberta(...))"), ("sink", "a sink"),
            ("contextual", "CoPE's contextual positions"), ("remap", "remapped positions"))


class RelativeResolution(ResolverStage):
    """The Resolver's stage for the ``relative`` statement."""

    def resolve_relative(self, env: StaticEnv, lets, transports) -> RelativeTerms | None:
        """The merged scheme's content-position terms, None when absent or after reporting (E223, E224)."""
        located = self.m.relative
        value = self.given_value(located)
        if located is None or value is None:
            return None
        if value.kind != "call" or value.func not in RELATIVE_FORMS:
            name = value.func if value.kind == "call" else (value.id if value.kind == "name" else None)
            near = did_you_mean(name, RELATIVE_FORMS) if name else None
            self.report("E223", f"relative takes shaw(...), transformer_xl(...) or deberta(...), not "
                        f"{to_source(value)}" + (f"; {near}" if near else ""), value, hint=_HINT)
            return None
        options = self._options(value, env, lets)
        if options is None:
            return None
        terms = RelativeTerms(kind=value.func, **options)
        if terms.kind == "transformer_xl" and terms.dim % 2:
            self.report("E223", f"transformer_xl(dim = {terms.dim}) must be even: the sinusoid is sin and cos of "
                        "dim / 2 frequencies", value, hint="Transformer-XL's dim is its model width, e.g. 64")
            return None
        if terms.kind == "deberta" and not (terms.c2p or terms.p2c):
            self.report("E223", "deberta(c2p = false, p2c = false) has no term left", value, hint=_HINT)
            return None
        if terms.kind == "deberta" and terms.max_distance <= terms.buckets // 2 + 1:
            self.report("E223", f"deberta(max_distance = {terms.max_distance}) must exceed buckets / 2 + 1 = "
                        f"{terms.buckets // 2 + 1}: the log buckets span the distances from buckets / 2 to "
                        "max_distance", value, hint="Hugging Face's DeBERTa-v3 uses buckets = 256, max_distance = 512")
            return None
        return None if self._refused(located, transports) else terms

    def _refused(self, located, transports) -> bool:
        """Reports (E224) a statement the terms cannot go with; True when it did."""
        what = [why for name, why in _REFUSED if self._given(name)]
        if transports:
            what.insert(0, "a transport of q and k (the terms read the query and key as given)")
        norm = self.given_value(self.m.normalize)
        if norm is not None and not (norm.kind == "name" and norm.id == "softmax"):
            what.append("a normaliser other than softmax")
        self._current = located.src
        if what:
            self.report("E224", f"relative = {to_source(located.stmt.value)} cannot go with " + ", ".join(what),
                        located.stmt, hint="content-position terms are defined with plain softmax attention over "
                        "the projected q and k; drop the other statement (qk: none for an inherited transport)")
        return bool(what)

    def _given(self, name: str) -> bool:
        """Whether the merged scheme has the statement ``name`` (not ``none``); a sink's value is a bare word."""
        loc = getattr(self.m, name)
        if loc is not None and isinstance(loc.stmt.value, str):
            return loc.stmt.value != "none"
        return self.given_value(loc) is not None

    def _options(self, call: ast.Call, env: StaticEnv, lets) -> dict | None:
        spec = {name: (kind, default, least) for name, kind, default, least in RELATIVE_FORMS[call.func]}
        usage = f"{call.func}(" + ", ".join(f"{n} = ..." for n in spec) + ")"
        given = self.named_options(call, spec, "E223", usage, _HINT, env, lets)
        if given is None:
            return None
        got: dict = {}
        for name, (folded, node) in given.items():
            kind, _, least = spec[name]
            if not _fits(folded, kind, least):
                want = ("true or false" if kind == "bool" else
                        f"an integer from {least} to {MAX_RELATIVE_ROWS:,} known when the scheme is checked")
                self.report("E223", f"{call.func}({name} = ...) takes {want}, got {folded!r}", node, hint=_HINT)
                return None
            got[name] = folded
        for name, (_, default, _) in spec.items():
            if name not in got and default is None:
                self.report("E223", f"{call.func} needs {name}", call, hint=_HINT)
                return None
            got.setdefault(name, default)
        return got


def _fits(value, kind: str, least: int) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    return (value is not DYNAMIC and not isinstance(value, bool) and isinstance(value, int)
            and least <= value <= MAX_RELATIVE_ROWS)

"""The learned parameters a generated module's class declares in ``__init__``: named, shaped and drawn as
:class:`pedsl.compiler.module.SchemeAttention`'s, so one state dict loads into both; None for those the scheme
has not (the class supplies every attribute of :class:`pedsl.compiler.general.protocols.SchemeSide`)."""

from __future__ import annotations

from pedsl.compiler import plan as P
from pedsl.compiler.pysafe import literal
from pedsl.lang.scheme import Scheme


def parameter_lines(scheme: Scheme, plan: P.Plan) -> list[str]:
    """Every learned-parameter line of the class's ``__init__`` beyond the transports' and biases' sites."""
    return [*_sink_init(scheme), *_contextual_init(scheme), *_differential_init(scheme), *_relative_init(scheme),
            *_dense_init(plan, scheme.heads)]


def _sink_init(scheme: Scheme) -> list[str]:
    """The learned sink's parameters, named as SchemeAttention names them (a state dict loads into both); None
    for those the scheme has not (the class supplies every attribute of general.protocols.SchemeSide)."""
    if scheme.sink == "logit":
        return ["self.sink_logit = nn.Parameter(torch.zeros(HEADS))", "self.sink_key = self.sink_value = None"]
    if scheme.sink == "token":
        return ["self.sink_logit = None",
                "self.sink_key = nn.Parameter(torch.randn(HEADS, HEAD_DIM) * HEAD_DIM ** -0.5)",
                "self.sink_value = nn.Parameter(torch.zeros(HEADS, HEAD_DIM))"]
    return ["self.sink_logit = self.sink_key = self.sink_value = None"]


def _contextual_init(scheme: Scheme) -> list[str]:
    """CoPE's embedding, named and shaped as SchemeAttention's (a state dict loads into both)."""
    c = scheme.contextual
    if c is None:
        return ["self.contextual_embedding = None"]
    return [f"self.contextual_embedding = nn.Parameter(torch.zeros({'' if c.shared else 'HEADS, '}COPE_MAX_POS, "
            "HEAD_DIM))"]


def relative_constant(r) -> tuple | None:
    """The generated module's RELATIVE_TERMS: (kind, max_distance, dim, buckets, c2p, p2c) as ModuleScheme gives it."""
    return None if r is None else (str(r.kind), int(r.max_distance), int(r.dim), int(r.buckets), bool(r.c2p),
                                   bool(r.p2c))


def _relative_init(scheme: Scheme) -> list[str]:
    """The content-position terms' tables, named, shaped and drawn as SchemeAttention's (a state dict loads into
    both); None for those the scheme has not."""
    r = scheme.relative
    out = ["self.relative_keys = self.relative_queries = self.relative_u = self.relative_v = None"]
    if r is None:
        return out
    keys = f"{int(r.rows)}, HEAD_DIM" if r.kind == "shaw" else f"{int(r.rows)}, HEADS, HEAD_DIM"
    if r.kind != "deberta" or r.c2p:
        out.append(f"self.relative_keys = nn.Parameter(torch.randn({keys}) * 0.02)")
    if r.kind == "deberta" and r.p2c:
        out.append(f"self.relative_queries = nn.Parameter(torch.randn({int(r.rows)}, HEADS, HEAD_DIM) * 0.02)")
    if r.kind == "transformer_xl":
        out += ["self.relative_u = nn.Parameter(torch.randn(HEADS, HEAD_DIM) * 0.02)",
                "self.relative_v = nn.Parameter(torch.randn(HEADS, HEAD_DIM) * 0.02)"]
    return out


def _differential_init(scheme: Scheme) -> list[str]:
    """Differential attention's learned lambda rows, named, shaped and drawn as SchemeAttention's."""
    if scheme.normalize != "differential":
        return ["self.differential_lambda = None"]
    return ["self.differential_lambda = nn.Parameter(torch.randn(4, HEAD_DIM) * 0.1)"]


def _dense_init(plan: P.Plan, heads: int) -> list[str]:
    """The generators of each dense rotation, named, shaped and drawn as SchemeAttention's."""
    entries = [f"{literal(str(i))}: DenseGenerators(**{literal(t.dense_shape(heads))})"
               for i, t in enumerate(plan.transports) if t.kind == P.DENSE]
    return ["self.dense = nn.ModuleDict({" + ", ".join(entries) + "})"]

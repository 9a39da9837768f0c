"""Codegen of the ``query_mlp`` method of a generated module: each bias of FIRE's form
(:func:`pedsl.compiler.module_values.separable_mlp`: ``mlp(u(distance) * w(query_position))``, one hidden ReLU
layer) as the factors the MLP-bias kernel takes, the same ones :class:`~pedsl.compiler.module_values.ModuleScheme`
gives in process; ``query_mlp = None`` where the scheme has none (its biases run by blocks of queries)."""

from __future__ import annotations

from pedsl.compiler import plan as P
from pedsl.compiler.module_values import separable_mlp
from pedsl.compiler.pysafe import literal


def query_mlp_lines(gen, plan: P.Plan) -> list[str]:
    """The class lines of ``query_mlp`` (``gen``: the module's :class:`pedsl.compiler.codegen._Gen`)."""
    ind = "        "
    branches: list[str] = []
    for i, b in enumerate(plan.biases):
        f = separable_mlp(b.site.expr, gen.values, b.site.name) if b.kind == P.TABLE_BIAS and b.query else None
        if f is None:
            continue
        body: list[str] = []
        u = gen.expr(f.dist, b.site.name, None, None, body, "    ", whole=b.site.expr)
        w = gen.expr(f.query, b.site.name, None, None, body, "    ", whole=b.site.expr)
        branches += [f"if i == {i}:", *body,
                     f"    u = (({u}) * torch.ones(1, 1, 1, L, 1, dtype=F64, device=dev))[0, 0, 0, :, 0]",
                     f"    w = (({w}) * torch.ones(1, 1, L, 1, 1, dtype=F64, device=dev))[0, 0, :, 0, 0]",
                     f"    net = self.learned.sites[{literal(f.key)}]",
                     f"    return ({'1.0 / u' if f.invert == 'dist' else 'u'}, {'1.0 / w' if f.invert == 'query' else 'w'}, "
                     "net[0].weight[:, 0], net[0].bias, net[2].weight, net[2].bias)"]
    if not branches:
        return ["    query_mlp = None  # no bias of FIRE's form: biases that read the query run by blocks of queries"]
    return ["    def query_mlp(self, i, qpos, dev):",
            ind + literal("Bias i as FIRE's mlp(u(distance) * w(query_position)) for the MLP-bias kernel: u over the "
                          "distances 0 .. L-1, w at the queries' positions qpos (L,), float64, and the MLP's W1, b1, "
                          "W2, b2; None for any other bias."),
            ind + "L = qpos.shape[0]",
            ind + "pos5 = qpos.to(F64).view(1, 1, L, 1, 1)",
            *[ind + line for line in branches],
            ind + "return None"]

"""The compiler: a checked scheme -> dataflow graph -> passes -> torch attention module.

    module = compile_scheme("schemes/rope.pe", head_dim=64, num_heads=8)
    out = module(q, k, v)                     # (B, H, L, D) -> (B, H, L, D)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import networkx as nx

from pedsl.compiler.graph import lower
from pedsl.compiler.passes import BACKENDS, PASSES, Options, optimize
from pedsl.errors import CompileError
from pedsl.lang.api import load
from pedsl.lang.scheme import Scheme

__all__ = ["compile_scheme", "compile_graph", "compile_plan", "BACKENDS", "PASSES"]


def compile_graph(scheme: Scheme, *, backend: str = "auto", requires_grad: bool = True,
                  device: str = "cpu") -> nx.DiGraph:
    """The scheme's dataflow graph after every pass (what ``pedsl graph`` prints)."""
    return optimize(lower(scheme), Options(backend=backend, requires_grad=requires_grad, device=device))


def compile_plan(scheme: Scheme, **options):
    """The scheme's lowering plan (:class:`pedsl.compiler.plan.Plan`): what the passes decided."""
    return compile_graph(scheme, **options).graph["plan"]


def compile_scheme(
    source: str | Path | Scheme,
    *,
    params: dict[str, Any] | None = None,
    scheme: str | None = None,
    backend: str = "auto",
    compile: bool = False,
    head_dim: int | None = None,
    num_heads: int | None = None,
    d_model: int | None = None,
    vocab_size: int = 256,
    requires_grad: bool = True,
    device: str = "cpu",
):
    """Compile a scheme (path, text or resolved Scheme) into an attention module.

    ``forward(q, k, v, *, x=None, tokens=None, positions=None, document_ids=None, cache=None,
    attn_mask=None)`` takes q (B, H, Lq, D) and k, v (B, Hkv, L, D); ``x`` (B, L, d_model) feeds
    data-dependent steps and gates, ``tokens`` (B, L) token-indexed steps; the rest (positions,
    packed documents, padding and attention masks, ``module.new_cache(B)`` for decoding) is
    described in :mod:`pedsl.compiler.general`. ``compile=True`` wraps the module in ``torch.compile``.
    """
    if backend not in BACKENDS:
        raise CompileError(f"unknown backend '{backend}'", code="E401", hint="choose one of: " + ", ".join(BACKENDS))
    sch = load(source, params=params, scheme=scheme, heads=num_heads, head_dim=head_dim)
    graph = compile_graph(sch, backend=backend, requires_grad=requires_grad, device=str(device).split(":")[0])
    from pedsl.compiler.module import SchemeAttention  # on use: `import pedsl.compiler` stays free of torch

    module = SchemeAttention(sch, graph, d_model=d_model, vocab_size=vocab_size)
    if compile:
        import torch

        # dynamic=True: one graph for every sequence length. specialize_float: the Python floats
        # the forward reads (2 pi, folded constants) are constants; left symbolic, dynamo traced
        # them, failed to turn them into tensors and restarted its whole analysis (~1.5 s per compile)
        compiled = torch._dynamo.config.patch(specialize_float=True)(torch.compile(module.forward, dynamic=True))
        setattr(module, "forward", compiled)  # this instance's forward, in place of the class's method
    return module

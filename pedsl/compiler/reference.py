"""The reference backend: SEMANTICS section 1 interpreted naively, in float64.

Explicit transport matrices T(j->i) for every (i, j) - rotations from the phase
tables, ordered products of step matrices for accumulated transports - an
explicit (H, L, L) bias and per-query temperature, handed to the loop-based
:func:`pedsl.ops.reference.reference_attention`. It shares only the expression
evaluator (phases, angles, w, beta, gates) with the fast backends, so the
differential tests check every kernel, identity and pass against it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from pedsl.compiler.shapes import as_bhl, as_bhlp, as_table
from pedsl.ops import reference as ref

F64 = torch.float64


def _group_transport(mod, t: dict, L: int, x, tokens, device) -> Tensor:
    """T(j->i) of one group, (B|1, H|1, L, L, D, D) float64."""
    D = mod.head_dim
    ch = list(t["channels"])
    g = mod.graph
    ctx = mod._ctx(L, x, tokens, device, F64, group=t)
    if t["op"] == "rotate":
        phase = mod.evaluator.run(g.nodes[t["phase"]]["expr"], ctx, t["phase"])
        return ref.rotation_transport(as_table(phase, L, len(ch) // 2), mod.layout, ch, D)
    if t["op"] == "accumulate_so2":
        a = mod.evaluator.run(g.nodes[t["steps"]]["expr"], ctx, t["steps"])
        steps = ref.so2_step_matrices(as_bhlp(a, L, len(ch) // 2).to(F64), mod.layout, ch, D)
        return ref.accumulated_transport(steps)
    w = mod.evaluator.run(g.nodes[t["w"]]["expr"], ctx, t["w"])
    beta = mod.evaluator.run(g.nodes[t["beta"]]["expr"], ctx, t["beta"])
    wt = w.align(("batch", "head", "pos", "chan")).to(F64)
    Bw = wt.shape[0]
    wt = wt.expand(Bw, mod.heads, L, len(ch))
    full = torch.zeros(Bw, mod.heads, L, D, dtype=F64, device=device)
    full[..., ch] = wt
    bt = as_bhl(beta, L, mod.heads).to(F64)
    eye = torch.eye(D, dtype=F64, device=device)
    steps = eye - bt[..., None, None] * full[..., :, None] * full[..., None, :]  # (B, H, L, D, D)
    return ref.accumulated_transport(steps)


def _compose(a: Tensor | None, b: Tensor) -> Tensor:
    return b if a is None else a @ b  # groups act on disjoint channels: the product is block-diagonal


def reference_forward(mod, q: Tensor, k: Tensor, v: Tensor, *, x=None, tokens=None) -> Tensor:
    L = q.shape[2]
    T = U = None
    for t in mod.transforms:
        tr = _group_transport(mod, t, L, x, tokens, q.device)
        T = _compose(T, tr)
        if t["targets"] == "qkv":
            U = _compose(U, tr)
    bias = mod.bias_table(L, x, tokens, q.device)
    tau = mod.query_scale(L, q.device)
    return ref.reference_attention(q, k, v, transport=T, value_transport=U, bias=bias,
                                   tau=None if tau is None else tau.to(F64))


def transported_scores(mod, q: Tensor, k: Tensor, *, x=None, tokens=None) -> Tensor:
    """<q_i, T(j->i) k_j>, (B, H, L, L), -inf for j > i; O(L^2 D) for every kind of transport.

    Absolute-factorable transports use the pre-transformed q and k. Householder
    steps move every query leftwards through the steps, one key position at a time:
    (H_i ... H_{j+1})^T q_i = H_{j+1} ... H_i q_i (each H symmetric).
    """
    B, H, L, D = q.shape
    qt, kt, _, _ = mod.transform_qkv(q, k, k, x, tokens)
    hh = [t for t in mod.transforms if t["op"] == "accumulate_householder"]
    if not hh:
        s = qt @ kt.transpose(-1, -2)
    else:
        w, beta, _ = mod.householder_inputs(B, L, x, tokens, q.device, q.dtype)
        cur = qt.clone()  # cur[i] = transported query of i for the current key position
        cols = [None] * L
        for j in range(L - 1, -1, -1):
            cols[j] = (cur * kt[:, :, j : j + 1]).sum(-1)  # (B, H, L)
            if j > 0:  # apply H_j to queries i >= j before moving to key j - 1
                wj, bj = w[:, :, j], beta[:, :, j]  # (B, H, D), (B, H)
                proj = (cur[:, :, j:] * wj[:, :, None]).sum(-1, keepdim=True)
                upd = cur[:, :, j:] - bj[:, :, None, None] * proj * wj[:, :, None]
                cur = torch.cat([cur[:, :, :j], upd], dim=2)
        s = torch.stack(cols, dim=-1)
    mask = torch.ones(L, L, dtype=torch.bool, device=q.device).triu(1)
    return s.masked_fill(mask, float("-inf"))

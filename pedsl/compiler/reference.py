"""The reference backend: docs/semantics.md §1 interpreted naively, in float64.

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

from pedsl.compiler.shapes import as_bhl, as_bhlp, as_hd, as_table
from pedsl.ops import reference as ref

F64 = torch.float64


def _scaled(T: Tensor, t: dict, ch: list, D: int) -> Tensor:
    """rotate(..., scale = m) multiplies q and k of the group by m: the group's block of T by m^2."""
    scale = t.get("scale", 1.0)
    if scale == 1:
        return T
    s = torch.ones(D, dtype=F64, device=T.device)
    s[ch] = scale
    return T * (s[:, None] * s[None, :])


def _group_transport(mod, t: dict, L: int, x, tokens, device) -> Tensor:
    """T(j->i) of one group, (B|1, H|1, L, L, D, D) float64."""
    D = mod.head_dim
    ch = list(t["channels"])
    g = mod.graph
    ctx = mod._ctx(L, x, tokens, device, F64, group=t)
    if t["op"] == "rotate":
        phase = mod.evaluator.run(g.nodes[t["phase"]]["expr"], ctx, t["phase"])
        return _scaled(ref.rotation_transport(as_table(phase, L, len(ch) // 2), mod.layout, ch, D), t, ch, D)
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


def reference_stream(mod, q: Tensor, k: Tensor, v: Tensor, *, x, tokens, positions: Tensor, docs: Tensor,
                     valid: Tensor, step_valid: Tensor, mask4: Tensor | None) -> Tensor:
    """The oracle for the general forward, naively, in float64.

    k, v ``(B, Hkv, L, D)`` are every token; q ``(B, Hq, Lq, D)`` the queries of the last Lq of them.
    Query head h reads key/value head ``h // (Hq / Hkv)``. Token t sits at ``positions[b, t]`` in
    document ``docs[b, t]``; ``step_valid`` False marks padding (its steps are the identity: angle 0,
    beta 0, log-gate 0); a key j is visible to query i iff ``j <= i``, same document, ``valid[b, j]``
    and ``mask4[b, h, i, j]``. Transports are explicit ordered products of the steps of tokens
    ``j+1..i``; a gate bias is the explicit sum of the log-gates of tokens ``j+1..i``; a distance
    bias is read at ``positions[i] - positions[j]``; a query with no visible key gives zeros.
    """
    B, Hq, Lq, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    dev = q.device
    r = Hq // Hkv
    heads = [h // r for h in range(Hq)]  # GQA: explicit head map
    k, v = k.to(F64)[:, heads], v.to(F64)[:, heads]
    stepv = step_valid.to(F64)
    pv = positions[step_valid] if bool(step_valid.any()) else positions
    n = int(pv.max()) + 1 if pv.numel() else 1

    def ctx(group=None):
        c = mod._ctx(L, x, tokens, dev, F64, group=group)
        c.n, c.positions, c.docs, c.valid = n, positions, docs, step_valid
        return c

    g = mod.graph
    T = U = None
    for t in mod.transforms:
        ch = list(t["channels"])
        P = len(ch) // 2
        if t["op"] == "rotate":
            ph = as_bhlp(mod.evaluator.run(g.nodes[t["phase"]]["expr"], ctx(t), t["phase"]), L, P).to(F64)
            tr = _scaled(ref.rotation_transport(ph, mod.layout, ch, D), t, ch, D)
        elif t["op"] == "accumulate_so2":
            a = as_bhlp(mod.evaluator.run(g.nodes[t["steps"]]["expr"], ctx(t), t["steps"]), L, P).to(F64)
            a = a * stepv[:, None, :, None]
            tr = ref.accumulated_transport(ref.so2_step_matrices(a, mod.layout, ch, D))
        else:
            wv = mod.evaluator.run(g.nodes[t["w"]]["expr"], ctx(t), t["w"]).align(("batch", "head", "pos", "chan"))
            wv = wv.to(F64).expand(B, Hq, L, len(ch))
            full = torch.zeros(B, Hq, L, D, dtype=F64, device=dev)
            full[..., ch] = wv
            bt = as_bhl(mod.evaluator.run(g.nodes[t["beta"]]["expr"], ctx(t), t["beta"]), L, Hq).to(F64)
            bt = bt * stepv[:, None, :]
            eye = torch.eye(D, dtype=F64, device=dev)
            tr = ref.accumulated_transport(eye - bt[..., None, None] * full[..., :, None] * full[..., None, :])
        T = _compose(T, tr)
        if t["targets"] == "qkv":
            U = _compose(U, tr)
    # biases, entry by entry
    bias = None
    if mod.biases:
        bias = torch.zeros(B, Hq, L, L, dtype=F64, device=dev)
        for b in mod.biases:
            if b["op"] == "distance_bias":
                top = int((positions.max() - positions.min()).clamp(min=0)) + 1
                term = mod.evaluator.run(b["expr"], mod._ctx(top, device=dev), b["node"])
                tab = as_hd(term, top, Hq).to(F64)  # (H, distance)
                for i in range(L):
                    for j in range(i + 1):
                        d = (positions[:, i] - positions[:, j]).clamp(min=0)  # (B,)
                        bias[:, :, i, j] += tab[:, d].T
            else:
                lg = as_bhl(mod.evaluator.run(b["expr"], ctx(), b["node"]), L, Hq).to(F64)
                lg = (lg * stepv[:, None, :]).expand(B, Hq, L)
                for i in range(L):
                    for j in range(i):
                        bias[:, :, i, j] += lg[:, :, j + 1: i + 1].sum(-1)
    allowed = torch.zeros(B, Hq, L, L, dtype=torch.bool, device=dev)
    for i in range(L):
        for j in range(i + 1):
            allowed[:, :, i, j] = ((docs[:, i] == docs[:, j]) & valid[:, j])[:, None]
    if mask4 is not None:
        allowed[:, :, L - Lq:] &= mask4.expand(B, Hq, Lq, L)
    tau = None
    if mod.temperature is not None:
        tv = mod.evaluator.run(mod.temperature, ctx(), "temperature")
        tau = (tv.align(("batch", "head", "pos")) if tv.axes else tv.t.reshape(1, 1, 1)).to(F64)
        tau = tau.expand(tau.shape[0], tau.shape[1], L)
    return ref.reference_attention(q, k, v, transport=T, value_transport=U, bias=bias, tau=tau,
                                   allowed=allowed, q_offset=L - Lq)

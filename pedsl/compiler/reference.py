"""The reference backend: docs/semantics.md §1 interpreted naively, in float64, from the IR.

It reads the resolved scheme itself (``mod.scheme``: its transports, biases and temperature as
written), not the lowering plan: explicit transport matrices T(j->i) for every (i, j) - rotations
from the phase tables, ordered products of step matrices for accumulated transports (so constant
steps are multiplied out, not recognised as RoPE) - an explicit bias entry by entry (a distance
term read at p_i - p_j, a gate as the explicit sum of the log gates of tokens j+1..i, so a
constant gate is summed, not turned into ALiBi) and a per-query temperature, handed to the
loop-based :func:`pedsl.ops.reference.reference_attention`. It shares with the fast backends
only the expression walk (:class:`pedsl.runtime.torch_backend.Evaluator`, in float64) and the
learned parameters, named by the plan's sites; never the module's bias, temperature or
transport helpers. So the differential tests check every kernel, identity and pass against it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from pedsl.compiler.plan import HOUSEHOLDER, site_name
from pedsl.compiler.shapes import as_bhl, as_bhlp, as_hd
from pedsl.ops import reference as ref

F64 = torch.float64


def _compose(a: Tensor | None, b: Tensor) -> Tensor:
    return b if a is None else a @ b  # groups act on disjoint channels: the product is block-diagonal


def reference_forward(mod, q: Tensor, k: Tensor, v: Tensor, *, x=None, tokens=None) -> Tensor:
    """One causal sequence at positions 0..L-1: :func:`reference_stream` with the trivial layout."""
    B, L = k.shape[0], k.shape[2]
    pos = torch.arange(L, device=q.device).expand(B, L)
    ones = torch.ones(B, L, dtype=torch.bool, device=q.device)
    return reference_stream(mod, q, k, v, x=x, tokens=tokens, positions=pos, docs=torch.zeros_like(pos),
                            valid=ones, step_valid=ones, mask4=None)


def transported_scores(mod, q: Tensor, k: Tensor, *, x=None, tokens=None) -> Tensor:
    """<q_i, T(j->i) k_j>, (B, H, L, L), -inf for j > i; O(L^2 D) for every kind of transport.

    Absolute-factorable transports use the pre-transformed q and k. Householder
    steps move every query leftwards through the steps, one key position at a time:
    (H_i ... H_{j+1})^T q_i = H_{j+1} ... H_i q_i (each H symmetric).
    """
    B, H, L, D = q.shape
    qt, kt, _, _ = mod.transform_qkv(q, k, k, x, tokens)
    if not any(t.kind == HOUSEHOLDER for t in mod.transforms):
        s = qt @ kt.transpose(-1, -2)
    else:
        w, beta, _ = mod.householder_inputs(B, L, x, tokens, q.device, q.dtype)
        cur = qt.clone()  # cur[i] = transported query of i for the current key position
        cols: list[Tensor] = []  # key L - 1 first: each goes in front
        for j in range(L - 1, -1, -1):
            cols.insert(0, (cur * kt[:, :, j : j + 1]).sum(-1))  # (B, H, L)
            if j > 0:  # apply H_j to queries i >= j before moving to key j - 1
                wj, bj = w[:, :, j], beta[:, :, j]  # (B, H, D), (B, H)
                proj = (cur[:, :, j:] * wj[:, :, None]).sum(-1, keepdim=True)
                upd = cur[:, :, j:] - bj[:, :, None, None] * proj * wj[:, :, None]
                cur = torch.cat([cur[:, :, :j], upd], dim=2)
        s = torch.stack(cols, dim=-1)
    mask = torch.ones(L, L, dtype=torch.bool, device=q.device).triu(1)
    return s.masked_fill(mask, float("-inf"))


def reference_stream(mod, q: Tensor, k: Tensor, v: Tensor, *, x, tokens, positions: Tensor, docs: Tensor,
                     valid: Tensor, step_valid: Tensor, mask4: Tensor | None, axes_pos: Tensor | None = None,
                     band: bool = True, spans: Tensor | None = None) -> Tensor:
    """The oracle for the general forward, naively, in float64.

    k, v ``(B, Hkv, L, D)`` are every token; q ``(B, Hq, Lq, D)`` the queries of the last Lq of them.
    Query head h reads key/value head ``h // (Hq / Hkv)``. Token t sits at ``positions[b, t]`` in
    document ``docs[b, t]``; ``step_valid`` False marks padding (its steps are the identity: angle 0,
    beta 0, log-gate 0); a key j is visible to query i iff ``j <= i``, same document, ``valid[b, j]``
    and ``mask4[b, h, i, j]``. Transports are explicit ordered products of the steps of tokens
    ``j+1..i``; a gate bias is the explicit sum of the log-gates of tokens ``j+1..i``; a distance
    bias is read at ``positions[i] - positions[j]``; a query with no visible key gives zeros.
    ``axes_pos (B, L, A)``: the positions along each declared axis, read by ``position.AXIS``.
    A scheme's ``mask`` (docs/semantics.md §11a) shows query i a key j > i too where :func:`_both_ways` says
    (``spans (B, L)``: the call's span ids); then a window is ``|p_i - p_j| < window`` and a distance bias is
    read at ``|p_i - p_j|``.
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

    def ctx(group=None):  # the walk's context at the call's positions, documents and padding
        c = mod._ctx(L, x, tokens, dev, F64, group=group)
        c.n, c.positions, c.docs, c.valid = n, positions, docs, step_valid
        c.axes_pos = axes_pos
        return c

    sch = mod.scheme
    T, U = _stream_transports(mod, ctx, B, Hq, L, D, stepv)
    bias = _stream_bias(mod, ctx, positions, B, Hq, L, stepv, axes_pos)
    allowed = torch.zeros(B, Hq, L, L, dtype=torch.bool, device=dev)
    for i in range(L):
        for j in range(L):
            seen = _both_ways(sch.mask, positions, spans, step_valid, i, j) if j > i else valid[:, j]
            allowed[:, :, i, j] = ((docs[:, i] == docs[:, j]) & valid[:, j] & seen)[:, None]
    if mask4 is not None:
        allowed[:, :, L - Lq:] &= mask4.expand(B, Hq, Lq, L)
    if band:  # band=False: mask4 carries the window or chunk (the caller's, e.g. Hugging Face's own mask)
        _stream_window(sch, allowed, positions)
    scale = None
    if sch.relative is not None:  # content-position terms, entry by entry, scaled as the raw scores
        scale = 1.0 / math.sqrt(D * sch.relative.scale_factor)
        terms = _relative_terms(mod, q.to(F64), k, positions, L - Lq) * scale
        bias = terms if bias is None else bias + terms
    tau = None
    if sch.temperature is not None:
        tv = mod.evaluator.run(sch.temperature, ctx(), site_name("temperature"))
        tau = (tv.align(("batch", "head", "pos")) if tv.axes else tv.t.reshape(1, 1, 1)).to(F64)
        tau = tau.expand(tau.shape[0], tau.shape[1], L)

    def attention(values: Tensor, normalize: str) -> Tensor:
        return ref.reference_attention(q, k, values, transport=T, value_transport=U, bias=bias, tau=tau,
                                       allowed=allowed, q_offset=L - Lq, sink=_stream_sink(mod, q, tau, L - Lq),
                                       normalize=normalize, attend_current=sch.attend_current,
                                       cope=None if sch.contextual is None else mod.contextual_embedding,
                                       softcap=sch.softcap, sigmoid_bias=sch.sigmoid_bias, scale=scale,
                                       causal=sch.mask.causal)

    if sch.normalize == "differential":
        return _differential(mod, attention, v)
    return attention(v, sch.normalize)


def _differential(mod, attention, v: Tensor) -> Tensor:
    """Differential attention (docs/semantics.md §1b) from its definition: the pair (h, h + H/2) weighs both
    heads' values by ``a_h - lambda a_{h + H/2}``, ``lambda = exp(sum q1 k1) - exp(sum q2 k2) + lambda_init``.
    Written as softmax attention over each head's own values and over its partner's (``v`` holds one value
    head per query head)."""
    H = v.shape[1]
    half = H // 2
    partner = [(h + half) % H for h in range(H)]
    own, other = attention(v, "softmax"), attention(v[:, partner], "softmax")  # a_h v_h, a_h v_partner(h)
    q1, k1, q2, k2 = mod.differential_lambda.to(F64)
    lam = torch.exp(sum(q1[c] * k1[c] for c in range(q1.shape[0]))) - \
        torch.exp(sum(q2[c] * k2[c] for c in range(q2.shape[0]))) + mod.scheme.lambda_init
    heads = [own[:, h] - lam * other[:, h + half] if h < half else other[:, h - half] - lam * own[:, h]
             for h in range(H)]
    return torch.stack(heads, dim=1)


def _both_ways(mask, positions: Tensor, spans: Tensor | None, step_valid: Tensor, i: int, j: int) -> Tensor:
    """(B,) bool: whether the mask shows query i the key j > i, straight from its definition (a padded token is
    in no prefix or span)."""
    B = positions.shape[0]
    if mask.kind == "bidirectional":
        return torch.ones(B, dtype=torch.bool, device=positions.device)
    both = step_valid[:, i] & step_valid[:, j]
    if mask.kind == "prefix":
        return (positions[:, i] < mask.prefix) & (positions[:, j] < mask.prefix) & both
    if mask.kind == "spans" and spans is not None:
        return (spans[:, i] == spans[:, j]) & (spans[:, i] != 0) & both
    return torch.zeros(B, dtype=torch.bool, device=positions.device)


def _stream_window(sch, allowed: Tensor, positions: Tensor) -> None:
    """Keep only the keys the window or chunk shows each query: entry by entry, from the positions."""
    if sch.window is None and sch.chunk is None:
        return
    L = positions.shape[1]
    for i in range(L):
        for j in range(L):
            pi, pj = positions[:, i], positions[:, j]  # (B,)
            if sch.window is not None:  # non-causal: symmetric about the query
                keep = (pi - pj) < sch.window if sch.mask.causal else (pi - pj).abs() < sch.window
            else:
                keep = torch.div(pi, sch.chunk, rounding_mode="floor") == torch.div(pj, sch.chunk,
                                                                                    rounding_mode="floor")
            if sch.keep_first is not None:  # StreamingLLM's sinks: the first positions beside the band
                keep = keep | (pj < sch.keep_first)
            allowed[:, :, i, j] &= keep[:, None]


def _stream_sink(mod, q: Tensor, tau, offset: int):
    """The sink's logit per query (B|1, H, Lq) and its value: the head's learned logit, or the learned
    key scored against the query as given, ``tau_i <q_i, k_s> / sqrt(D)``, with the learned value."""
    kind = mod.scheme.sink
    if kind is None:
        return None
    B, H, Lq, D = q.shape
    if kind == "logit":
        return mod.sink_logit.to(F64)[None, :, None].expand(1, H, Lq), None
    logit = torch.einsum("bhld,hd->bhl", q.to(F64), mod.sink_key.to(F64)) / D ** 0.5
    if tau is not None:
        logit = logit * tau[..., offset:offset + Lq]
    return logit, mod.sink_value


def _stream_transports(mod, ctx, B: int, Hq: int, L: int, D: int, stepv: Tensor):
    """The explicit transports (B, H, L, L, D, D) of every transform and of those that move values."""
    sch, dev = mod.scheme, stepv.device
    T = U = None
    for t in sch.transports:
        ch = list(sch.group(t.group).channels)
        P = len(ch) // 2
        c = ctx(mod.plan.transport(t.group))

        def run(expr, role):
            return mod.evaluator.run(expr, c, site_name(role, t.group))

        if t.kind == "rotate":
            if sch.remap is not None:
                tr = _remapped_rotation(mod, sch.remap, c, lambda: run(t.phase, "phase"), ch, D)
            else:
                tr = ref.rotation_transport(as_bhlp(run(t.phase, "phase"), L, P).to(F64), mod.layout, ch, D)
            if t.scale != 1:  # rotate(..., scale = m) multiplies q and k of the group by m: T's block by m^2
                s = torch.ones(D, dtype=F64, device=dev)
                s[ch] = t.scale
                tr = tr * (s[:, None] * s[None, :])
            if t.xpos_gamma is not None:  # xPos: pair k of T(j->i) times zeta_k^((p_i - p_j) / gamma)
                tr = ref.xpos_decay(c.positions, t.xpos_gamma, t.xpos_zeta, mod.layout, ch, D).to(dev) @ tr
        elif t.kind == "accumulate_rotation":
            a = as_bhlp(run(t.angle, "steps"), L, P).to(F64) * stepv[:, None, :, None]
            tr = ref.accumulated_transport(ref.so2_step_matrices(a, mod.layout, ch, D))
        elif t.kind == "dense_rotation":
            pos = c.axes_pos if c.axes_pos is not None else c.positions.unsqueeze(-1).expand(B, L, t.axes)
            tr = _dense_transport(t, mod.dense[str(mod.plan.transport(t.group).index)], pos, ch, D)
        else:
            wv = run(t.w, "w").align(("batch", "head", "pos", "chan")).to(F64).expand(B, Hq, L, len(ch))
            full = torch.zeros(B, Hq, L, D, dtype=F64, device=dev)
            full[..., ch] = wv
            bt = as_bhl(run(t.beta, "beta"), L, Hq).to(F64) * stepv[:, None, :]
            eye = torch.eye(D, dtype=F64, device=dev)
            tr = ref.accumulated_transport(eye - bt[..., None, None] * full[..., :, None] * full[..., None, :])
        T = _compose(T, tr)
        if t.targets == "qkv":
            U = _compose(U, tr)
    return T, U


def _dense_transport(t, params, positions: Tensor, ch: list, D: int) -> Tensor:
    """``T(j->i) = R(p_i)^T R(p_j)`` of a dense rotation (docs/semantics.md §2e), (B, G, L, L, D, D): per token
    ``R(p) = P^T expm(sum_a p_a A_a) P`` on the group's channels (identity elsewhere), every generator A_a
    assembled block by block from the raw parameters, one dense matrix exponential per token and head."""
    raw = params.generator.to(F64)
    G, n, b = raw.shape[0], len(ch), t.block
    nb = n // b
    gens = torch.zeros(G, t.axes, n, n, dtype=F64, device=raw.device)
    for a in range(t.axes):
        for blk in range(nb):
            if t.mode == "split" and blk // (nb // t.axes) != a:
                continue  # ComRoPE-AP: this block belongs to another axis
            m = raw[:, a if t.mode == "independent" else 0, blk]
            m = m - m.transpose(-1, -2)
            if t.mode == "shared":
                m = m * params.scales[a].to(F64)
            gens[:, a, blk * b:(blk + 1) * b, blk * b:(blk + 1) * b] = m
    eye = torch.eye(n, dtype=F64, device=raw.device)
    basis = eye.expand(G, n, n)
    if params.basis is not None:
        s = params.basis.to(F64) - params.basis.to(F64).transpose(-1, -2)
        basis = (eye - s) @ torch.linalg.inv(eye + s)
    B, L, A = positions.shape
    R = torch.eye(D, dtype=F64, device=raw.device).repeat(B, G, L, 1, 1)
    idx = torch.tensor(ch, device=raw.device)
    for bi in range(B):
        for h in range(G):
            for i in range(L):
                arg = sum(positions[bi, i, a].to(F64) * gens[h, a] for a in range(A))
                r = basis[h].transpose(0, 1) @ torch.linalg.matrix_exp(arg) @ basis[h]
                R[bi, h, i, idx[:, None], idx[None, :]] = r
    return R.transpose(-1, -2).unsqueeze(3) @ R.unsqueeze(2)  # [b, h, i, j] = R_i^T R_j


def _remapped_rotation(mod, remap, c, phase, ch: list, D: int) -> Tensor:
    """``T(j->i)`` of a remapped rotation (docs/semantics.md §2d), (B, H|1, L, L, D, D), pair by pair: the regime
    whose bounds hold the distance ``p_i - p_j`` (with ``remap(chunk = c)``: ``p_i // c - p_j // c``) gives the query's position ``query(p_i)`` and the key's
    ``key(p_j)``; pair k of the block rotates by ``phase(key(p_j)) - phase(query(p_i))``, the phase evaluated at
    those (possibly fractional) positions. ``phase()`` evaluates the rotation's phase at ``c.positions``."""
    positions = c.positions
    B, L = positions.shape
    P = len(ch) // 2

    def at(expr, i: int) -> Tensor:  # a regime's position expression at every token, (B, L) float64
        v = mod.evaluator.run(expr, c, f"remap[{i}]")
        return (v.align(("batch", "pos")) if v.axes else v.t.reshape(1, 1)).to(F64).expand(B, L)

    phases = []  # per regime: (query phases, key phases), each (B, H|1, L, P)
    for i, r in enumerate(remap.regimes):
        own = c.positions
        q_at, k_at = at(r.query, i), at(r.key, i)
        c.positions = q_at
        phq = as_bhlp(phase(), L, P).to(F64).expand(B, -1, L, P)
        c.positions = k_at
        phk = as_bhlp(phase(), L, P).to(F64).expand(B, -1, L, P)
        c.positions = own
        phases.append((phq, phk))
    H = max(pq.shape[1] for pq, _ in phases)
    diff = torch.zeros(B, H, L, L, P, dtype=F64, device=positions.device)
    for b in range(B):
        for i in range(L):
            for j in range(L):
                pi, pj = int(positions[b, i]), int(positions[b, j])
                if pi < pj:  # a later key: masked anyway; its block stays the identity
                    continue
                d = pi - pj if remap.chunk is None else pi // remap.chunk - pj // remap.chunk
                hit = [n for n, r in enumerate(remap.regimes) if r.low <= d and (r.high is None or d < r.high)]
                phq, phk = phases[hit[0]]  # the regimes partition 0, 1, 2, ... (checked)
                diff[b, :, i, j] = phk[b, :, j] - phq[b, :, i]
    pairs = ref._pairs(ch, mod.layout, D)
    return ref._rot_matrices(diff, pairs, D)


def _stream_bias(mod, ctx, positions: Tensor, B: int, Hq: int, L: int, stepv: Tensor,
                 axes_pos: Tensor | None = None) -> Tensor | None:
    """The bias (B, H, L, L), entry by entry."""
    sch, dev = mod.scheme, stepv.device
    if not sch.biases:
        return None
    bias = torch.zeros(B, Hq, L, L, dtype=F64, device=dev)
    keys = (lambda i: range(i + 1)) if sch.mask.causal else (lambda i: range(L))  # noqa: E731
    for idx, b in enumerate(sch.biases):
        if b.kind == "distance" and b.axes:
            bias += _axis_distance_bias(mod, b, idx, positions, axes_pos, Hq)
        elif b.kind == "distance" and "pos" in b.term_ty.axes:  # term(head, p_i, d): query_position read too
            top = int((positions.max() - positions.min()).clamp(min=0)) + 1
            c = mod._ctx(top, device=dev, dtype=F64)
            c.positions = positions
            term = mod.evaluator.run(b.term, c, site_name("bias", idx))
            tab = term.align(("batch", "head", "pos", "dist")).to(F64).expand(B, Hq, L, top)
            for i in range(L):
                for j in keys(i):
                    d = _distance(positions, i, j)  # (B,)
                    bias[:, :, i, j] += tab[torch.arange(B), :, i, d]
        elif b.kind == "distance":  # term(head, d) at d = p_i - p_j
            top = int((positions.max() - positions.min()).clamp(min=0)) + 1
            term = mod.evaluator.run(b.term, mod._ctx(top, device=dev, dtype=F64), site_name("bias", idx))
            tab = as_hd(term, top, Hq).to(F64)  # (H, distance)
            for i in range(L):
                for j in keys(i):
                    d = _distance(positions, i, j)  # (B,)
                    bias[:, :, i, j] += tab[:, d].T
        else:  # the sum of the log gates of tokens j+1..i
            lg = as_bhl(mod.evaluator.run(b.log_gate, ctx(), site_name("bias", idx)), L, Hq).to(F64)
            lg = (lg * stepv[:, None, :]).expand(B, Hq, L)
            for i in range(L):
                for j in range(i):
                    bias[:, :, i, j] += lg[:, :, j + 1: i + 1].sum(-1)
    return bias


def _distance(positions: Tensor, i: int, j: int) -> Tensor:
    """The distance a bias reads between query i and key j: p_i - p_j for j <= i (0 where positions go back),
    |p_i - p_j| for a key after the query (a non-causal mask)."""
    d = positions[:, i] - positions[:, j]
    return d.clamp(min=0) if j <= i else d.abs()


def _axis_distance_bias(mod, b, idx: int, positions: Tensor, axes_pos: Tensor | None, Hq: int) -> Tensor:
    """A term over per-axis distances (docs/semantics.md §3a), (B, H, L, L) with zeros for j > i: entry by entry,
    d_a(i, j) = axes_pos[i, a] - axes_pos[j, a] (without per-axis positions every axis reads ``positions``),
    the term evaluated at every (i, j) with query_position = positions[i]."""
    B, L = positions.shape
    A = max(1, len(mod.scheme.axes))
    ap = positions[..., None].expand(B, L, A) if axes_pos is None else axes_pos
    d = torch.zeros(B, L, L, A, dtype=F64, device=positions.device)
    for i in range(L):
        for j in range(L if not mod.scheme.mask.causal else i + 1):
            for a in range(A):
                d[:, i, j, a] = (ap[:, i, a] - ap[:, j, a]).to(F64)
    c = mod._ctx(L, device=positions.device, dtype=F64)
    c.positions, c.axis_dist = positions, d
    tab = mod.evaluator.run(b.term, c, site_name("bias", idx)).align(("batch", "head", "pos", "dist")).to(F64)
    tab = tab.expand(B, Hq, L, L)
    if not mod.scheme.mask.causal:  # every pair may be visible: the mask decides
        return tab
    return tab * torch.ones(L, L, dtype=F64, device=positions.device).tril()


def _relative_terms(mod, q: Tensor, k: Tensor, positions: Tensor, q0: int) -> Tensor:
    """The content-position terms of docs/semantics.md §3b, (B, H, L, L) float64, entry by entry before the
    scale: for query token i (q's row i - q0) and key j at the signed distance d = p_i - p_j, Shaw's
    ``q_i . a[clip(j - i, -K, K) + K]``, Transformer-XL's ``(q_i + v) . (R(d) W_R) + u . k_j`` with R(d) written
    out term by term, DeBERTa's ``q_i . Kr[r] + k_j . Qr[r]`` at ``r = clamp(bucket(d) + S, 0, 2S - 1)``.
    ``k`` has one head per query head already. Rows before q0 stay zero (no query there)."""
    r = mod.scheme.relative
    B, H, Lq, D = q.shape
    L = k.shape[2]
    keys = mod.relative_keys.to(F64) if mod.relative_keys is not None else torch.zeros(0, dtype=F64)  # p2c only: none
    assert r is not None  # the caller's: a scheme with content-position terms
    out = torch.zeros(B, H, L, L, dtype=F64, device=q.device)
    for b in range(B):
        for i in range(q0, q0 + Lq):
            qi = q[b, :, i - q0]  # (H, D)
            for j in range(L):
                d, kj = int(positions[b, i] - positions[b, j]), k[b, :, j]
                if r.kind == "shaw":
                    out[b, :, i, j] = (qi * keys[min(max(-d, -r.max_distance), r.max_distance) + r.max_distance]).sum(-1)
                elif r.kind == "transformer_xl":
                    emb = _sinusoid(d, r.dim).to(q.device)  # (dim,)
                    pos_key = torch.einsum("e,ehd->hd", emb, keys)
                    out[b, :, i, j] = ((qi + mod.relative_v.to(F64)) * pos_key).sum(-1) + (
                        mod.relative_u.to(F64) * kj).sum(-1)
                else:
                    row = min(max(_log_bucket(d, r.buckets, r.max_distance) + r.buckets, 0), 2 * r.buckets - 1)
                    if r.c2p:
                        out[b, :, i, j] += (qi * keys[row]).sum(-1)
                    if r.p2c:
                        out[b, :, i, j] += (kj * mod.relative_queries.to(F64)[row]).sum(-1)
    return out


def _sinusoid(d: int, dim: int) -> Tensor:
    """Transformer-XL's embedding of one distance: sin(d w_k) for k < dim / 2, then cos(d w_k), w_k =
    1 / 10000^(2k / dim)."""
    w = [1.0 / 10000.0 ** (2 * kk / dim) for kk in range(dim // 2)]
    return torch.tensor([math.sin(d * x) for x in w] + [math.cos(d * x) for x in w], dtype=F64)


def _log_bucket(d: int, buckets: int, max_distance: int) -> int:
    """DeBERTa-v2's log bucket of one signed distance (He et al. 2021's ``make_log_bucket_position``): itself
    within buckets / 2, else ``sign(d) (ceil(log(|d| / mid) / log((max - 1) / mid) (mid - 1)) + mid)`` in
    float32, the precision Hugging Face computes it in."""
    mid = buckets // 2
    if abs(d) <= mid:
        return d
    f32 = torch.float32
    ratio = torch.log(torch.tensor(abs(d), dtype=f32) / mid) / torch.log(torch.tensor((max_distance - 1) / mid, dtype=f32))
    return int(math.copysign(int(torch.ceil(ratio * (mid - 1)).item()) + mid, d))

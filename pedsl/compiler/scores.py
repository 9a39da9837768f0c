"""The score pipeline, written once: raw scores ``q . k`` -> scale -> temperature -> bias -> soft cap
(:func:`modified_scores`), then the mask, the sink and the normaliser (:func:`normalised`: softmax with
CoPE's term, softmax plus one, sigmoid or stick-breaking). The sink's logit (:func:`sink_column`) is formed
here too, softmax plus one's pinned logit 0 among them.

Every executor that forms scores explicitly uses these: the general forward's blocks of queries
(:mod:`pedsl.compiler.general`, and so every module ``pedsl compile`` writes, which carries the text below
the banner verbatim), ``SchemeAttention.probs`` and the streamed analysis (:mod:`pedsl.study.streaming`,
whose normaliser is an online softmax over blocks of keys). The fused kernels compute the same pipeline
inside (their declarations, :mod:`pedsl.compiler.kernel_support`, say which modifiers each takes); the
reference interpreter (:mod:`pedsl.compiler.reference`) stays independent of all of it: it is the oracle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:  # annotations only: a generated module carries none of it
    from pedsl.compiler.general.protocols import SchemeSide

# <embedded>
# ---------------------------------------------------------------------------------------------
# The score pipeline (pedsl.compiler.scores, copied verbatim): scale, temperature, bias, soft cap;
# mask, sink, normaliser; the sink's logit.
# ---------------------------------------------------------------------------------------------


def soft_cap(s: Tensor, cap: float | None) -> Tensor:
    """Logit soft-capping (Gemma 2): ``cap * tanh(s / cap)``; ``s`` itself without a cap. A score of
    -inf (a key masked already) stays -inf: the cap bounds scores, it does not unmask keys."""
    return s if cap is None else torch.where(s == float("-inf"), s, cap * torch.tanh(s / cap))


def modified_scores(s: Tensor, *, scale: float | Tensor | None = None, tau: Tensor | None = None,
                    bias: Tensor | None = None, cap: float | None = None) -> Tensor:
    """The modifiers of raw scores ``s = q . k`` in their order: ``scale`` (1 / sqrt(D): a number or a
    tensor that broadcasts), the temperature ``tau`` (per query, broadcast over the keys), the additive
    ``bias``, the soft cap ``cap``. Each may be None (no such modifier)."""
    if scale is not None:
        s = s * scale
    if tau is not None:
        s = s * tau
    if bias is not None:
        s = s + bias
    return soft_cap(s, cap)


def stick_breaking_weights(s: Tensor, ok: Tensor) -> Tensor:
    """Stick-breaking weights (Tan et al. 2024) of scores ``s (..., Lk)`` over the keys ``ok`` in key order:
    ``w_j = sigmoid(s_j) * prod_{t > j, ok_t} (1 - sigmoid(s_t))``, the nearest key breaking the stick
    first; formed in log space (float32 at least) with an exclusive suffix sum, so nothing is subtracted."""
    s = s.to(torch.promote_types(s.dtype, torch.float32))
    log_rest = F.logsigmoid(-s).masked_fill(~ok, 0.0)
    suffix = torch.flip(torch.cumsum(torch.flip(log_rest, [-1]), -1), [-1])  # sum over t >= j
    after = torch.cat([suffix[..., 1:], torch.zeros_like(suffix[..., :1])], -1)  # sum over t > j
    return torch.exp(F.logsigmoid(s) + after).masked_fill(~ok, 0.0)


def cope_term(s: Tensor, ok: Tensor, qc: Tensor, emb: Tensor) -> Tensor:
    """CoPE's term of the logits (Golovneva et al. 2024; docs/semantics.md §1c) for scores ``s (B, H, rows, Lk)``
    over the keys ``ok`` in key order: gates ``sigmoid(s)`` on the visible keys, contextual positions
    ``p_j = sum_{t >= j} gate_t`` (the keys after the query are not visible) clamped to ``max_pos - 1``, and
    ``qc_i . e[p]`` read between the integer rows ``floor(p)`` and ``ceil(p)`` by linear interpolation.
    ``emb``: ``(max_pos, D)`` shared by the heads or ``(H, max_pos, D)``. In float32 at least."""
    ft = torch.promote_types(s.dtype, torch.float32)
    gates = torch.sigmoid(s.to(ft)).masked_fill(~ok, 0.0)
    pos = torch.flip(torch.cumsum(torch.flip(gates, [-1]), -1), [-1]).clamp(max=emb.shape[-2] - 1)
    qe = (torch.einsum("bhrd,pd->bhrp", qc, emb.to(qc.dtype)) if emb.dim() == 2
          else torch.einsum("bhrd,hpd->bhrp", qc, emb.to(qc.dtype))).to(ft)  # (B, H, rows, max_pos)
    low = pos.floor()
    frac = pos - low
    at_low = torch.gather(qe, -1, low.long())
    at_high = torch.gather(qe, -1, pos.ceil().long())
    return at_high * frac + at_low * (1 - frac)


def normalised(s: Tensor, ok: Tensor | None, *, normalize: str = "softmax", sink: Tensor | None = None,
               qc: Tensor | None = None, emb: Tensor | None = None,
               sigmoid_bias: float = 0.0) -> tuple[Tensor, Tensor | None]:
    """The weights of modified scores ``s (..., Lk)`` over the visible keys ``ok`` (None: every key), in
    float32 at least, and the sink's weight: (weights, sink weight (..., 1) or None). CoPE's term (``qc``,
    ``emb``) joins the scores first; then softmax with the sink's logit ``sink (...)`` as one more column
    every row sees (a row with no key and no sink gets zeros); softmax1, whose column is a logit 0 (the sink
    given, or zeros); ``sigmoid(s + sigmoid_bias)`` per key; or stick-breaking (no sink)."""
    s = s.to(torch.promote_types(s.dtype, torch.float32))
    if ok is None:
        ok = torch.ones((), dtype=torch.bool, device=s.device).expand(s.shape)
    if emb is not None:
        if qc is None:
            raise ValueError("CoPE's term needs the queries qc with its embedding emb")
        s = s + cope_term(s, ok, qc, emb)
    if normalize == "sigmoid":  # no sum over the keys: a row with no key is zeros, blocks of keys just add
        return torch.sigmoid(s + sigmoid_bias).masked_fill(~ok, 0.0), None
    if normalize == "stick_breaking":
        return stick_breaking_weights(s.masked_fill(~ok, 0.0), ok), None
    s = s.masked_fill(~ok, float("-inf"))
    if normalize == "softmax1" and sink is None:
        sink = s.new_zeros(s.shape[:-1])
    if sink is not None:
        col = sink.to(s.dtype).unsqueeze(-1).expand(*s.shape[:-1], 1)
        p = torch.softmax(torch.cat([s, col], dim=-1), dim=-1)
        return p[..., :-1], p[..., -1:]
    seen = ok.any(-1, keepdim=True)
    if bool(seen.all()):
        return torch.softmax(s, -1), None
    return torch.softmax(s.masked_fill(~seen, 0.0), -1) * seen, None  # a query with no key: zeros


def differential_lambda(lam: Tensor, lambda_init: float) -> Tensor:
    """Differential attention's lambda (Ye et al. 2024; Hugging Face's DiffLlama) of its learned rows ``lam
    (4, D)`` = (q1, k1, q2, k2): ``exp(q1 . k1) - exp(q2 . k2) + lambda_init``, in float32 at least."""
    lam = lam.to(torch.promote_types(lam.dtype, torch.float32))
    return torch.exp((lam[0] * lam[1]).sum()) - torch.exp((lam[2] * lam[3]).sum()) + lambda_init


def paired_values(v: Tensor, heads: int) -> Tensor:
    """Each value head followed by its pair partner's, ``(B, Hkv, L, D) -> (B, Hkv | heads, L, 2D)``: query head
    h pairs with h + heads/2 (mod heads); with an even Hkv that head reads key/value head g + Hkv/2 when h reads
    g, otherwise the values are first repeated per query head. One softmax per head then weighs both."""
    if v.shape[1] % 2:
        v = v.repeat_interleave(heads // v.shape[1], dim=1)
    return torch.cat([v, v.roll(v.shape[1] // 2, dims=1)], dim=-1)


def differential_heads(r: Tensor, lam: Tensor) -> Tensor:
    """Differential attention's outputs ``(B, H, Lq, D)`` from ``r (B, H, Lq, 2D)``, head h's softmax over its
    values widened by :func:`paired_values` (``a_h [v_h, v_partner]``): head i < H/2 gives
    ``(a_i - lam a_{i+H/2}) v_i``, head i + H/2 gives ``(a_i - lam a_{i+H/2}) v_{i+H/2}``."""
    D, half = r.shape[-1] // 2, r.shape[1] // 2
    first, second = r[:, :half], r[:, half:]
    lam = lam.to(r.dtype)
    return torch.cat([first[..., :D] - lam * second[..., D:], first[..., D:] - lam * second[..., :D]], dim=1)


def own_key_counts(attend_current: bool, normalize: str) -> bool:
    """Whether a query's own key takes part: always, unless ``stick_breaking(current = false)``."""
    return attend_current or normalize != "stick_breaking"


def scale_by_temperature(q: Tensor, tau: Tensor | None) -> Tensor:
    """q times the per-query temperature ``tau (B|1, H|1, Lq)``; half-precision q is multiplied in
    float32 and rounded once."""
    if tau is None:
        return q
    ft = torch.promote_types(q.dtype, torch.float32)
    return (q.to(ft) * tau.to(ft).unsqueeze(-1)).to(q.dtype)


def sink_column(scheme: SchemeSide, q: Tensor, tau: Tensor | None) -> tuple[Tensor, Tensor | None] | None:
    """The sink as one more key column: (its logit (B, Hq, Lq) in q's dtype, its value (1, Hq, 1, D) or
    None for a zero value). ``sink = logit``: the learned logit of the head (GPT-OSS); ``sink = token``:
    ``<q_i, k_s> / sqrt(D)`` with the query as given (no transport; times the temperature) and the
    learned value ``v_s``; ``normalize = softmax1``: the logit 0 pinned in the denominator, a zero value
    (the checker refuses it beside a learned sink). None without a sink."""
    kind = scheme.sink
    B, Hq, Lq, D = q.shape
    if kind is None:
        return (q.new_zeros(B, Hq, Lq), None) if scheme.normalize == "softmax1" else None
    logit, key, value = scheme.sink_logit, scheme.sink_key, scheme.sink_value
    if kind == "logit" and logit is not None:
        return logit.to(q.dtype)[None, :, None].expand(B, Hq, Lq), None
    if kind != "token" or key is None or value is None:
        raise ValueError(f"sink = {kind} without its learned parameters")
    qs = scale_by_temperature(q, tau)
    col = torch.einsum("bhld,hd->bhl", qs, key.to(q.dtype)) * D ** -0.5
    return col, value.to(q.dtype)[None, :, None, :]
# </embedded>

"""The score pipeline lowered to FlexAttention (``torch.nn.attention.flex_attention``): the engine of the
``flex`` backend, the fast path its declaration in :mod:`pedsl.compiler.kernel_support` names.

One fresh call (nothing cached, as many queries as keys) of a plan is computed as the general forward
(:mod:`pedsl.compiler.general`) computes it - the same layout, token values, transports, temperature on q,
coordinates, distance tables and sink column, made by the general forward's own functions - except the
attention itself, which is one FlexAttention call:

* ``score_mod`` (:func:`score_mod`): the scores FlexAttention scaled by 1 / sqrt(D), then the bias and the soft
  cap of :func:`pedsl.compiler.scores.modified_scores` - coordinate differences ``c_i - c_j`` (ALiBi, FoX,
  linear biases counting tokens) taken in float64 per pair, the distance tables gathered at each pair's
  distance (:func:`pedsl.compiler.general.masks.pair_distances`' distance), the tables that read the query
  position at (query, distance), biases over per-axis distances evaluated once per call into a (B, H, L, L)
  table (an expression of the per-axis distances has no closed form a score_mod could compute);
* ``mask_mod`` (:func:`mask_mod`) and its block mask: token order (or the mask's spans, or every pair),
  documents, padding, the caller's attention mask, the window or chunk by
  :func:`pedsl.compiler.general.windows.visible_pairs`;
* the sink (a learned logit or token, softmax plus one's logit 0): one more key after the call's last, as
  the general forward's :func:`pedsl.compiler.general.attention.with_sink` adds it - a zero key whose score the
  score_mod replaces by the sink's logit (neither biased nor capped), the sink's value (zeros for a logit),
  visible to every query (an empty row keeps the sink's value alone).

Torch runs FlexAttention's forward on CPU (eagerly: the unfused scores; or compiled); it has no backward on
CPU, so there the call check sends calls that need gradients to the general forward.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
from torch import Tensor

from pedsl.compiler.general.bias import axis_rows, biases, distance_tables, run_length
from pedsl.compiler.general.inputs import Layout, last_tokens
from pedsl.compiler.general.masks import MASK_SPAN_KINDS, mask_kind
from pedsl.compiler.general.transport import transport_qkv, transports, undo_values
from pedsl.compiler.general.values import Window
from pedsl.compiler.general.windows import shape_of, visible_pairs
from pedsl.compiler.kernel_support import takes_dtype
from pedsl.compiler.scores import modified_scores, scale_by_temperature, sink_column
from pedsl.ops.bias import compiled_flex, compiled_flex_runs_on

if TYPE_CHECKING:  # annotations only
    from pedsl.compiler.general.protocols import Kernels, SchemeSide

F64 = torch.float64


def flex_call(fast, q, k, cache) -> bool:
    """The flex lowering takes a call: the plan lets it run (``fast``: ``Plan.kernels``), a fresh call (no
    cache, as many queries as keys) in a dtype it declares, and no gradient on CPU (torch has no CPU backward
    for FlexAttention)."""
    if not (cache is None and q.shape[2] == k.shape[2] and takes_dtype(fast, "flex", q)) or not _kernel_takes(q):
        return False
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)
    return not (grad and q.device.type == "cpu")


def flex_kernel(device: torch.device) -> Callable:
    """The FlexAttention function the lowering calls: compiled (fused kernels). Tests replace it by the eager
    function (the same semantics, the scores materialised) so that a CPU check takes milliseconds."""
    return compiled_flex()


def _kernel_takes(q: Tensor) -> bool:
    """Whether the kernel :func:`flex_kernel` gives runs q on its device: torch's compiled CPU FlexAttention
    needs an AVX2 CPU (:func:`pedsl.ops.bias.compiled_flex_runs_on`) and takes float32 and half precision only
    (torch 2.13), so any other CPU call runs the general path; the eager function (what tests bind) takes
    every dtype anywhere."""
    if flex_kernel(q.device) is not compiled_flex():
        return True
    return compiled_flex_runs_on(q.device) and not (q.device.type == "cpu" and q.dtype == torch.float64)


def flex_forward(scheme: SchemeSide, kernels: Kernels, q: Tensor, k: Tensor, v: Tensor, *, x=None, tokens=None,
                 lay: Layout) -> Tensor:
    """The fresh call of :func:`pedsl.compiler.general.forward.general_forward` (``lay``: its layout, no cache) with the
    attention of :func:`flex_attend`."""
    Hq, Hkv = q.shape[1], k.shape[1]
    vals = scheme.token_values(Window(lay, x, tokens, None, q.device), q.dtype)
    tr = transports(scheme, kernels, vals, lay, None, q.dtype)
    bi = biases(scheme, vals, lay, None)
    if tr.per_head and Hkv != Hq:  # transports differ per query head: one transported key per query head
        k, v = k.repeat_interleave(Hq // Hkv, dim=1), v.repeat_interleave(Hq // Hkv, dim=1)
    tau = vals.tau
    sink = sink_column(scheme, q, tau)
    q, k, v, undo = transport_qkv(kernels, tr, q, k, v)
    o = flex_attend(scheme, scale_by_temperature(q, tau), k, v, bi, lay, sink)
    return undo_values(kernels, undo, o)


def score_mod(scheme: SchemeSide, bi, lay: Layout, sink_logit: Tensor | None = None) -> Callable | None:
    """The bias and soft cap of the plan as a FlexAttention ``score_mod`` over (batch, head, query, key) token
    indices of one fresh call, or None where the scores pass unchanged. ``sink_logit (B, Hq, L)``: the sink's
    logit, the score of the key after the call's last (index L), neither biased nor capped."""
    pos, cap = lay.positions, scheme.softcap
    L, causal = pos.shape[1], mask_kind(scheme) == "causal"
    coord = bi.coord  # (B, H, L) float64
    tables = list(distance_tables(scheme, bi.tables, pos, pos).values())
    table = sum(tables[1:], tables[0]) if tables else None  # (H, top) float64
    top = run_length(pos, pos)
    queries = [scheme.query_table(i, pos, top, pos.device, top) for i in bi.queries]  # (B|1, H, L, top)
    axial = None
    if bi.axial:
        ax = axis_rows(lay)
        d = (ax[..., :, None] - ax[..., None, :]).permute(0, 2, 3, 1)  # (B, L, L, A): i_a - j_a
        axes = [scheme.axis_table(i, d, pos) for i in bi.axial]
        axial = sum(axes[1:], axes[0])  # (B|1, H, L, L) float64
    if coord is None and table is None and not queries and axial is None and cap is None and sink_logit is None:
        return None

    def modify(score, b, h, qi, ki):
        kj = ki.clamp(max=L - 1)  # the sink's column reads the last key's entries, then is replaced
        terms = []
        if coord is not None:
            c = coord[b, h, qi] - coord[b, h, kj]
            terms.append(c if causal else torch.where(pos[b, qi] >= pos[b, kj], c, -c))
        dist = pos[b, qi] - pos[b, kj]
        dist = dist.clamp(min=0) if causal else dist.abs()
        if table is not None:
            terms.append(table[h, dist])
        terms += [t[b if t.shape[0] > 1 else 0, h, qi, dist] for t in queries]
        if axial is not None:
            terms.append(axial[b if axial.shape[0] > 1 else 0, h, qi, kj])
        bias = sum(terms[1:], terms[0]).to(score.dtype) if terms else None  # summed in float64, rounded once
        s = modified_scores(score, bias=bias, cap=cap)
        return s if sink_logit is None else torch.where(ki == L, sink_logit[b, h, qi].to(s.dtype), s)

    return modify


def mask_mod(scheme: SchemeSide, lay: Layout, sink: bool = False) -> tuple[Callable, bool]:
    """Which (query, key) pairs of one fresh call are visible, as a FlexAttention ``mask_mod`` (``sink``: the key
    after the call's last, index L, is the sink's column, visible to every query), and whether it reads the
    head (the caller's per-head attention mask)."""
    pos, docs, valid, m4 = lay.positions, lay.docs, lay.valid, lay.mask4
    kind, shape, L = mask_kind(scheme), shape_of(scheme), pos.shape[1]
    spans = lay.spans if kind in MASK_SPAN_KINDS else None  # the layout's span keys (prefix, spans)

    def visible(b, h, qi, ki):
        kj = ki.clamp(max=L - 1) if sink else ki
        ok = kj <= qi
        if kind == "bidirectional":
            ok = ok | (kj > qi)
        elif spans is not None:
            ok = ok | ((spans[b, qi] == spans[b, kj]) & (spans[b, qi] != 0))
        ok = ok & (docs[b, qi] == docs[b, kj]) & valid[b, kj]
        if m4 is not None:
            ok = ok & m4[b if m4.shape[0] > 1 else 0, h if m4.shape[1] > 1 else 0, qi, kj]
        if shape is not None:
            ok = ok & visible_pairs(shape, pos[b, qi], pos[b, kj])
        return ok | (ki == L) if sink else ok

    return visible, m4 is not None and m4.shape[1] > 1


def with_sink_column(k: Tensor, v: Tensor, sink, heads: int) -> tuple[Tensor, Tensor]:
    """k and v with the sink as one more key after the last: a zero key (its score is the sink's logit, set by
    :func:`score_mod`) and the sink's value (zeros for a logit sink); a value per query head gives k and v one
    head per query head."""
    vs = sink[1]
    B, Hk, _, D = k.shape
    if vs is not None and Hk != heads:
        k, v = k.repeat_interleave(heads // Hk, dim=1), v.repeat_interleave(heads // Hk, dim=1)
        Hk = heads
    v_s = v.new_zeros(B, Hk, 1, D) if vs is None else vs.to(v.dtype).expand(B, Hk, 1, D)
    return torch.cat([k, k.new_zeros(B, Hk, 1, D)], dim=2), torch.cat([v, v_s], dim=2)


def flex_attend(scheme: SchemeSide, q: Tensor, k: Tensor, v: Tensor, bi, lay: Layout, sink) -> Tensor:
    """FlexAttention of one fresh call's transported, temperature-scaled q over k, v with the plan's
    :func:`score_mod`, :func:`mask_mod` and block mask; the ``sink`` (logit (B, Hq, L), value (1, Hq, 1, D) or
    None) as one more key column (FlexAttention's log-sum-exp would join it too, but its compiled CPU kernel
    does not return one)."""
    from torch.nn.attention.flex_attention import create_block_mask

    B, Hq, L, _ = q.shape
    if not torch.is_grad_enabled():  # torch refuses inputs that require grad on CPU even under no_grad
        q, k, v = q.detach(), k.detach(), v.detach()
    logit = None
    if sink is not None:
        k, v = with_sink_column(k, v, sink, Hq)
        logit = last_tokens(sink[0], L, -1)
    visible, per_head = mask_mod(scheme, lay, sink is not None)
    block = create_block_mask(visible, B, Hq if per_head else None, L, k.shape[2], device=q.device)
    flex = flex_kernel(q.device)
    return flex(q, k, v, score_mod=score_mod(scheme, bi, lay, logit), block_mask=block, enable_gqa=Hq != k.shape[1])

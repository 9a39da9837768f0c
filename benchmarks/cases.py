"""One benchmark case: a scheme at one length, with its floor, hand-written and pedsl variants.

Shapes: q, k, v ``(B, H, L, D)``; x ``(B, L, d_model)``; tokens ``(B, L)``. Inputs are random
(seeded). The hand-written variants read the same data-dependent quantities as pedsl's module
(angles from the token table or the learned embedding, gates from ``linear(x)``, PaTH's w and
beta) through the module's own evaluator, so all variants compute the same function (checked at
a small length by :func:`agreement`) and differ only in how the transport or bias is applied.
Static tables (RoPE cos/sin, the ALiBi (H, L, L) bias) are precomputed outside the timer, as a
model caches them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from benchmarks import baselines as bl
from benchmarks.measure import Variant
from pedsl.compiler.shapes import as_bhl, as_hd
from pedsl.compiler.plan import GATE_BIAS, HOUSEHOLDER, ROPE, SO2
from pedsl.ops import rotary

GB = 2**30


@dataclass
class Case:
    scheme: str
    L: int
    variants: list[Variant]
    grad_out: Tensor
    skipped: dict[str, str] = field(default_factory=dict)  # variant -> why not run
    family: str = ""


def family(mod) -> str:
    ops = {t.kind for t in mod.transforms}
    if HOUSEHOLDER in ops:
        return "path"
    if SO2 in ops:
        return "accumulated"
    if mod.biases and not ops:
        return "bias"
    if ops == {ROPE} and not mod.biases:
        return "rotary"
    return "mixed" if ops or mod.biases else "nope"


def make_inputs(B: int, H: int, L: int, D: int, d_model: int, dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed + L)
    q, k, v = (torch.randn(B, H, L, D, generator=g, dtype=dtype).requires_grad_() for _ in range(3))
    x = torch.randn(B, L, d_model, generator=g, dtype=dtype)
    tokens = torch.randint(0, 256, (B, L), generator=g)
    grad_out = torch.randn(B, H, L, D, generator=g, dtype=dtype)
    return q, k, v, x, tokens, grad_out


def _params(mod) -> list[Tensor]:
    return [p for p in mod.parameters() if p.requires_grad]


def build_case(name: str, mod, cmod, *, B: int, H: int, L: int, D: int, d_model: int, hand: bool = True,
               mem_cap_gb: float = 4.0, dtype=torch.float32) -> Case:
    q, k, v, x, tokens, go = make_inputs(B, H, L, D, d_model, dtype)
    leaves = [q, k, v, *_params(mod)]
    variants = [Variant("floor", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), [q, k, v], "floor")]
    case = Case(name, L, variants, go, family=family(mod))
    if hand:
        for vname, fn, why in hand_variants(mod, case.family, q, k, v, x, tokens, mem_cap_gb):
            if fn is None:
                case.skipped[vname] = why
            else:
                variants.append(Variant(vname, fn, leaves, "hand"))
    variants.append(Variant("pedsl", lambda: mod(q, k, v, x=x, tokens=tokens), leaves, "pedsl"))
    if cmod is not None:
        variants.append(Variant("pedsl-compiled", lambda: cmod(q, k, v, x=x, tokens=tokens), leaves, "pedsl-compiled"))
    return case


# ---------------------------------------------------------------------------- hand-written variants


def _hand_transports(mod, q, x, tokens, cap_gb):
    """The hand-written transports, each ``(q, k, v) -> (q, k, v, undo)`` for the timed region, or
    ``(None, (name, None, reason))`` when there is no baseline for one."""
    B, H, L, D = q.shape
    pre = []  # functions (q, k, v) -> (q, k, v, undo) applied in the timed region
    for t in mod.transforms:
        full = len(t.channels) == D
        if t.kind == ROPE:
            cos, sin = mod.rope_tables(t, L, q.device, q.dtype)
            plan = None if full else rotary._plan(tuple(t.channels), D, mod.layout)
            if plan is not None and plan[0] == "prefix":  # GPT-NeoX rotary_pct: rotate a slice, cat the rest
                m = plan[1]
                c2, s2 = bl.hf_tables(cos, sin, m, None, mod.layout)
                pre.append(lambda q, k, v, c2=c2, s2=s2, m=m: (
                    torch.cat((bl.hf_rotate(q[..., :m], c2, s2, mod.layout), q[..., m:]), -1),
                    torch.cat((bl.hf_rotate(k[..., :m], c2, s2, mod.layout), k[..., m:]), -1), v, None))
                continue
            if plan is not None and plan[0] != "embed":
                return None, ("hf", None, f"channel group {plan[0]} not expressible as HF full-width tables")
            c2, s2 = bl.hf_tables(cos, sin, D, None if full else plan[1], mod.layout)
            pre.append(lambda q, k, v, c2=c2, s2=s2: (bl.hf_rotate(q, c2, s2, mod.layout),
                                                      bl.hf_rotate(k, c2, s2, mod.layout), v, None))
        elif t.kind == SO2:
            if not full:
                return None, ("matrices", None, "partial-channel accumulated groups not in the baseline")
            P = D // 2
            levels = max(1, (L - 1).bit_length()) + 2
            est = levels * 2 * B * H * L * P * 4 * 4
            if est > cap_gb * GB:
                return None, ("matrices", None, f"est. {est / GB:.1f} GB > cap {cap_gb} GB")

            def acc(q, k, v, t=t):
                ang = mod.step_angles(t, L, x, tokens, q.device, q.dtype).to(q.dtype)  # (B|1, H|1, L, P)
                A = bl.scan_rotations(bl.rotation_blocks(ang))  # (B|1, H|1, L, P, 2, 2)
                qr, kr = bl.apply_blocks(q, A, mod.layout), bl.apply_blocks(k, A, mod.layout)
                if t.values:
                    return qr, kr, bl.apply_blocks(v, A, mod.layout), A
                return qr, kr, v, None

            pre.append(acc)
        else:  # pragma: no cover
            return None, ("hand", None, f"no baseline for {t.kind}")
    return pre, None


def hand_variants(mod, fam, q, k, v, x, tokens, cap_gb):
    """Yields ``(name, fn or None, reason)`` for the usual hand-written code of this scheme."""
    B, H, L, D = q.shape
    if fam == "path":
        yield from _path_variants(mod, q, k, v, x, tokens, cap_gb)
        return
    if fam == "nope":
        return
    pre, refusal = _hand_transports(mod, q, x, tokens, cap_gb)
    if refusal is not None:
        yield refusal
        return
    tau = mod.query_scale(L, q.device)
    tau = None if tau is None else tau.to(q.dtype).unsqueeze(-1)
    static_bias, gates = None, []
    for b in mod.biases:
        if b.kind != GATE_BIAS:
            term = mod.evaluator.run(b.site.expr, mod._ctx(L, x, tokens, q.device), b.site.name)
            i = torch.arange(L)
            dist = (i[:, None] - i[None, :]).clamp(min=0)
            tab = as_hd(term, L, H).to(torch.float64)[:, dist].unsqueeze(0)  # (1, H, L, L), static
            static_bias = tab.to(q.dtype) if static_bias is None else static_bias + tab.to(q.dtype)
        else:
            gates.append(b)
    if static_bias is not None or gates:
        bb = B if gates else 1
        est = 3 * bb * H * L * L * 4
        if est > cap_gb * GB:
            yield "materialised", None, f"est. {est / GB:.1f} GB (B|1, H, L, L) bias > cap {cap_gb} GB"
            return
    def run():
        qq, kk, vv = q, k, v
        undo = []
        for f in pre:
            qq, kk, vv, A = f(qq, kk, vv)
            if A is not None:
                undo.append(A)
        if tau is not None:
            qq = qq * tau
        if static_bias is None and not gates:
            o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)
        else:
            bias = static_bias
            for b in gates:
                lg = mod.evaluator.run(b.site.expr, mod._ctx(L, x, tokens, q.device), b.site.name)
                fb = bl.forget_bias(as_bhl(lg, L, H).to(q.dtype))
                bias = fb if bias is None else bias + fb
            o = bl.bias_attention(qq, kk, vv, bias)
        for A in reversed(undo):
            o = bl.apply_blocks(o, A, mod.layout, transpose=True)
        return o

    label = {"rotary": "hf", "bias": "materialised", "accumulated": "matrices"}.get(fam, "hand")
    yield label, run, ""


def _path_variants(mod, q, k, v, x, tokens, cap_gb):
    from pedsl.ops.path import path_attention_materialized

    B, H, L, D = q.shape
    if any(len(t.channels) != D for t in mod.transforms):
        yield "materialized", None, "partial-channel PaTH not in the baseline"
        return
    est = 3.5 * B * H * L * L * D * 4
    if est > cap_gb * GB:
        yield "materialized", None, f"est. {est / GB:.0f} GB of transported keys > cap {cap_gb} GB"
        return

    def run():
        w, beta, lf = mod.householder_inputs(B, L, x, tokens, q.device, q.dtype)
        return path_attention_materialized(q, k, v, w, beta, lf)

    yield "materialized", run, ""


def agreement(case: Case) -> dict[str, float]:
    """Max |out - pedsl out| of every variant (forward, no grad); the floor is skipped."""
    ref = None
    with torch.no_grad():
        outs = {v.name: v.run() for v in case.variants if v.kind != "floor"}
    ref = outs.get("pedsl")
    return {n: float((o - ref).abs().max()) for n, o in outs.items() if n != "pedsl"} if ref is not None else {}

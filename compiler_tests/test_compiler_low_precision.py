"""bfloat16 / float16 inputs at L = 2048 against float64, within 2x of a hand-written baseline.

The baseline is what a careful hand-written low-precision layer does: the half-precision inputs'
exact transforms (rotated q, k, v; the bias b(i, j) in float64) each rounded once to the half
dtype, then SDPA in that dtype with the bias as a float mask (``0.011`` for ALiBi in bfloat16; the
key channel ``g(j) sqrt(D)`` of the fused path was off by more than 1 there). The module's weights
are rounded to the half dtype on both sides, so only the computation differs.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from compiler_helpers import D_MODEL, rnd
from conftest import SCHEMES
from pedsl.compiler import compile_scheme

L = 2048


@pytest.mark.slow
@pytest.mark.parametrize("name,heads", [("alibi", 8), ("fox", 1), ("acc_random_qkv", 1), ("rope_id_alibi", 2)])
def test_half_precision_within_twice_a_hand_written_baseline(name, heads):
    torch.set_flush_denormal(True)
    kw = dict(num_heads=heads, head_dim=32, d_model=D_MODEL)
    m64 = compile_scheme(SCHEMES / f"{name}.pe", **kw).double()
    q, k, v = (rnd(1, heads, L, 32, seed=s) for s in range(3))
    x = rnd(1, L, D_MODEL, seed=3) if m64.needs_x else None
    tok = torch.randint(0, 256, (1, L), generator=torch.Generator().manual_seed(4)) if m64.needs_tokens else None
    for dt in (torch.bfloat16, torch.float16):
        m = compile_scheme(SCHEMES / f"{name}.pe", **kw).to(dt)
        state = {key: val.to(dt) for key, val in m64.state_dict().items()}
        m.load_state_dict(state)
        m64.load_state_dict({key: val.double() for key, val in state.items()})
        r = lambda t: None if t is None else t.to(dt)  # noqa: E731
        with torch.no_grad():
            exact = m64(q, k, v, x=x, tokens=tok)
            ours = (m(r(q), r(k), r(v), x=r(x), tokens=tok).double() - exact).abs().max().item()
            up = lambda t: None if t is None else t.to(dt).double()  # noqa: E731
            qt, kt, vt, restore = m64.transform_qkv(up(q), up(k), up(v), up(x), tok)
            tau = m64.query_scale(L, None)
            if tau is not None:
                qt = qt * tau.unsqueeze(-1)
            bias = m64.bias_table(L, up(x), tok, None)
            causal = torch.ones(L, L, dtype=torch.bool).tril()
            mask = (bias if bias is not None else torch.zeros(1, 1, L, L, dtype=torch.float64)).to(dt)
            ob = F.scaled_dot_product_attention(qt.to(dt), kt.to(dt), vt.to(dt),
                                                attn_mask=mask.masked_fill(~causal, float("-inf")))
            base = (restore(ob).double() - exact).abs().max().item()
        assert ours <= 2 * base, (name, dt, ours, base)

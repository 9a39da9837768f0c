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


@pytest.mark.parametrize("name", ["acc_random_qkv", "fox", "path_fox"])
def test_half_precision_decoding_is_as_accurate_as_one_forward(name):
    """bfloat16 prefill + decoding (PaTH keeps its cache and pending steps in float32) against float64:
    no worse than one bfloat16 forward of the whole sequence."""
    m64 = compile_scheme(SCHEMES / f"{name}.pe", num_heads=2, head_dim=32, d_model=D_MODEL).double()
    m = compile_scheme(SCHEMES / f"{name}.pe", num_heads=2, head_dim=32, d_model=D_MODEL).to(torch.bfloat16)
    state = {key: val.to(torch.bfloat16) for key, val in m64.state_dict().items()}
    m.load_state_dict(state)
    m64.load_state_dict({key: val.double() for key, val in state.items()})
    n, P = 120, 80
    q, k, v = (rnd(1, 2, n, 32, seed=s) for s in range(3))
    x = rnd(1, n, D_MODEL, seed=3)
    tok = torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(4))
    h = lambda t: t.to(torch.bfloat16)  # noqa: E731
    with torch.no_grad():
        exact = m64(q, k, v, x=x, tokens=tok)
        one = (m(h(q), h(k), h(v), x=h(x), tokens=tok).double() - exact)[:, :, P:].abs().max()
        c = m.new_cache(1)
        m(h(q[:, :, :P]), h(k[:, :, :P]), h(v[:, :, :P]), x=h(x[:, :P]), tokens=tok[:, :P], cache=c)
        outs = [m(h(q[:, :, s:s + 1]), h(k[:, :, s:s + 1]), h(v[:, :, s:s + 1]), x=h(x[:, s:s + 1]),
                  tokens=tok[:, s:s + 1], cache=c) for s in range(P, n)]
    dec = (torch.cat(outs, 2).double() - exact[:, :, P:]).abs().max()
    assert dec <= 1.5 * one + 1e-3, (name, float(dec), float(one))

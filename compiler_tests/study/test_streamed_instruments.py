"""Far mass and sink mass streamed over key blocks (for 128x lengths) equal the dense
instruments on the materialised attention matrix, for every kind of scheme: rotary, span grid
with temperature, ALiBi, accumulated rotations on Q/K/V, FoX gates, PaTH Householder steps."""

from __future__ import annotations


import pytest
import torch

from pedsl.compiler import compile_scheme
from pedsl.study import instruments as ins
from pedsl.study.streaming import streamed_far_sink
from compiler_helpers import SCHEMES, float32_bound, float64_bound



@pytest.mark.parametrize("name", ["rope", "rope_id", "alibi", "acc_random_qkv", "fox", "path_fox"])
def test_streamed_far_and_sink_mass_equal_the_dense_ones(name):
    """In float64 the two code paths agree within float64's rounding, in float32 within float32's: masses of at
    most 1 whose longest chain of roundings is n = L * D + 2 L + D deep (PaTH's transport composes a reflection
    per position over the D channels, then a score over D, the softmax and its sum over the L keys)."""
    torch.manual_seed(0)
    B, H, L, D, C = 2, 2, 70, 16, 32
    mod = compile_scheme(SCHEMES / f"{name}.pe", head_dim=D, num_heads=H, d_model=C, requires_grad=False)
    q, k = 2 * torch.randn(B, H, L, D, dtype=torch.float64), 2 * torch.randn(B, H, L, D, dtype=torch.float64)
    x = torch.randn(B, L, C, dtype=torch.float64)
    tokens = torch.randint(0, 256, (B, L))
    n = L * D + 2 * L + D
    with torch.no_grad():
        a = mod.double().probs(q, k, **_extra(mod, x, tokens))
    exact = {"far_mass": ins.far_mass(a, 8), "sink_mass": ins.sink_mass(a)}
    for dtype, bound in ((torch.float64, float64_bound), (torch.float32, float32_bound)):
        mod = mod.to(dtype)
        got = streamed_far_sink(mod, q.to(dtype), k.to(dtype), 8, block=16,  # several blocks, a ragged last one
                                **_extra(mod, x.to(dtype), tokens))
        for key, want in exact.items():
            err = float((got[key].double() - want).abs().max())
            assert err <= bound(n, want), (dtype, key, err, bound(n, want))
    assert 0.05 < float(exact["far_mass"].mean()) < 0.95  # a non-trivial case


def _extra(mod, x, tokens) -> dict:
    kw = {}
    if getattr(mod, "needs_x", False):
        kw["x"] = x
    if getattr(mod, "needs_tokens", False):
        kw["tokens"] = tokens
    return kw

"""Far mass and sink mass streamed over key blocks (for 128x lengths) equal the dense
instruments on the materialised attention matrix, for every kind of scheme: rotary, span grid
with temperature, ALiBi, accumulated rotations on Q/K/V, FoX gates, PaTH Householder steps."""

from __future__ import annotations


import pytest
import torch

from pedsl.compiler import compile_scheme
from pedsl.study import instruments as ins
from pedsl.study.streaming import streamed_far_sink
from compiler_helpers import SCHEMES



@pytest.mark.parametrize("name", ["rope", "rope_id", "alibi", "acc_random_qkv", "fox", "path_fox"])
def test_streamed_far_and_sink_mass_equal_the_dense_ones(name):
    torch.manual_seed(0)
    B, H, L, D, C = 2, 2, 70, 16, 32
    mod = compile_scheme(SCHEMES / f"{name}.pe", head_dim=D, num_heads=H, d_model=C, requires_grad=False)
    q, k = 2 * torch.randn(B, H, L, D), 2 * torch.randn(B, H, L, D)
    x = torch.randn(B, L, C)
    tokens = torch.randint(0, 256, (B, L))
    kw = {}
    if getattr(mod, "needs_x", False):
        kw["x"] = x
    if getattr(mod, "needs_tokens", False):
        kw["tokens"] = tokens
    with torch.no_grad():
        a = mod.probs(q, k, **kw)
    got = streamed_far_sink(mod, q, k, 8, block=16, **kw)  # several blocks, a ragged last one
    assert torch.allclose(got["far_mass"], ins.far_mass(a, 8), atol=1e-5)
    assert torch.allclose(got["sink_mass"], ins.sink_mass(a), atol=1e-5)
    assert 0.05 < float(ins.far_mass(a, 8).mean()) < 0.95  # a non-trivial case

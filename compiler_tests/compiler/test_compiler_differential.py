"""Every library scheme, every backend that accepts it: forward and gradients equal the reference.

The reference backend interprets docs/semantics.md §1 naively in float64 with explicit
transport matrices per (i, j); the fast backends pre-rotate, use key channels and the
blockwise PaTH kernel. Lengths include ones past the cached tables (the module first
runs short, then longer).
"""

from __future__ import annotations

import pytest
import torch

from compiler_helpers import D_MODEL, axis_positions, float32_bound, forward_and_grads, inputs
from compiler_helpers import library
from pedsl.compiler import compile_scheme
from pedsl.errors import CompileError

FAST = ("sdpa", "masked", "blockwise")  # flex (forward only on CPU): test_flex_lowering.py


def _head_dim(path) -> int:
    return 32 if path.stem == "longrope" else 16  # LongRoPE lists one factor per pair of a 32-wide head


def _pair(path, backend):
    kw = dict(num_heads=2, d_model=D_MODEL, head_dim=_head_dim(path))
    try:
        fast = compile_scheme(path, backend=backend, **kw).double()
    except CompileError:
        return None, None
    ref = compile_scheme(path, backend="reference", **kw).double()
    ref.load_state_dict(fast.state_dict())
    return fast, ref


def _has_table(path) -> bool:
    from pedsl.compiler.plan import AXIS_BIAS, TABLE_BIAS

    return any(b.kind in (TABLE_BIAS, AXIS_BIAS) for b in compile_scheme(path, d_model=D_MODEL).plan.biases)


@pytest.mark.parametrize("path", library(), ids=lambda p: p.stem)
def test_matches_reference(path):
    ref = None
    ran = []
    table = _has_table(path)
    for backend in FAST:
        fast, ref_b = _pair(path, backend)
        if fast is None:
            # PaTH schemes refuse the pre-transform backends; a distance table refuses the blockwise scan.
            assert (backend in ("sdpa", "masked") and "path" in path.stem) or (backend == "blockwise" and table)
            continue
        ran.append(backend)
        if ref is None:
            ref, expected = ref_b, {}
        fast.load_state_dict(ref.state_dict())
        for L in (1, 4, 11):  # 11 > the table cached at L = 4
            q, k, v, x, tok = inputs(fast, L=L, seed=L)
            pos = axis_positions(fast, q.shape[0], L, seed=L)  # several axes: (A, B, L) positions
            if L not in expected:
                expected[L] = forward_and_grads(ref, q, k, v, x, tok, pos)
            out_r, g_r = expected[L]
            out_f, g_f = forward_and_grads(fast, q, k, v, x, tok, pos)
            torch.testing.assert_close(out_f, out_r, rtol=1e-9, atol=1e-10)
            for a, b in zip(g_f, g_r):
                torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9)
    assert "blockwise" in ran or (table and ran == ["sdpa", "masked"])


def test_every_library_scheme_has_a_fast_backend():
    for path in library():
        mod = compile_scheme(path, d_model=D_MODEL)
        assert mod.backend in ("sdpa", "blockwise"), (path.stem, mod.backend)


def test_dynamic_ntk_past_the_original_length_matches_reference():
    """The table depends on the run-time length n: check both sides of the original length."""
    from compiler_helpers import SCHEMES

    path = SCHEMES / "dynamic_ntk.pe"
    fast_long = compile_scheme(path, num_heads=2, params={"train_length": 8}).double()
    ref_long = compile_scheme(path, num_heads=2, params={"train_length": 8}, backend="reference").double()
    for L in (6, 13):  # below and above the original length 8
        q, k, v, x, tok = inputs(fast_long, L=L)
        torch.testing.assert_close(fast_long(q, k, v), ref_long(q, k, v), rtol=1e-9, atol=1e-10)
    # and the table really changes with n: the dynamic grid differs from the static one past 8
    stat = compile_scheme(SCHEMES / "rope.pe", num_heads=2, params={"train_length": 8}).double()
    q, k, v, _, _ = inputs(stat, L=13)
    assert (fast_long(q, k, v) - stat(q, k, v)).abs().max() > 1e-6


def test_float32_forward_is_close_to_float64():
    from compiler_helpers import SCHEMES

    for name in ("rope_id", "acc_random_qkv", "alibi", "path_fox"):
        mod = compile_scheme(SCHEMES / f"{name}.pe", num_heads=2, d_model=D_MODEL)
        q, k, v, x, tok = inputs(mod, L=33, dtype=torch.float32, grad=False)
        out32 = mod(q, k, v, x=x, tokens=tok)
        mod64 = compile_scheme(SCHEMES / f"{name}.pe", num_heads=2, d_model=D_MODEL).double()
        mod64.load_state_dict(mod.state_dict())
        out64 = mod64(q.double(), k.double(), v.double(), x=None if x is None else x.double(), tokens=tok)
        # the chain: L positions composed, each step's transform read from x (two d_model-long maps, a head's
        # channels, a few builtins), then the score's D channels and the softmax's and weighted sum's L keys
        L, Dh = q.shape[-2], mod.head_dim
        n = L * (2 * D_MODEL + Dh + 32) + 2 * L + Dh
        assert (out32.double() - out64).abs().max() <= float32_bound(n, out64), name

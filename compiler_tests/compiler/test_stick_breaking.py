"""Stick-breaking attention (docs/semantics.md §1b) against the paper's formula.

No peer is installed (Tan et al.'s kernels need Triton/CUDA), so two independent oracles: the
reference backend's naive float64 loop of the formula (``pedsl.ops.reference.stick_breaking_loop``:
products of ``1 - sigmoid``, no logarithm) for output and gradients with packed documents, padding,
GQA, a rotation and a bias; and, at lengths past one block of queries, the dense log-space form of
the authors' reference code (flash-linear-attention's ``naive_stickbreaking_attn``: ``log sigmoid(z) +
log sigmoid(-z) @ tril(-1)``), written out here, with and without the query's own key.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from compiler_helpers import SCHEMES, assert_packed_padded_call_matches, float32_bound, module_from_text, rnd
from pedsl.lang.api import check

F64 = torch.float64

ROPE_ALIBI = """
scheme sb_rope "stick-breaking over a rotation and a bias" {
  layout interleaved
  qk: rotate(geometric(100.0) * position)
  bias = -slopes(heads) * distance
  normalize = NORM
}
"""


def _mod(text, backend="auto", heads=4, hd=8, tmp=None):
    return module_from_text(text, tmp, backend, heads, hd)


def _rand(*shape, seed):
    return rnd(*shape, seed=seed)


@pytest.mark.parametrize("norm", ["stick_breaking", "stick_breaking(current = false)"])
def test_general_call_equals_the_formula_loop(tmp_path, norm):
    text = ROPE_ALIBI.replace("NORM", norm)
    got = assert_packed_padded_call_matches(_mod(text, tmp=tmp_path), _mod(text, "reference", tmp=tmp_path))
    if "false" in norm:  # the first token of a document has no earlier key
        assert got[1, :, 3].abs().max() == 0 and got[0, :, 0].abs().max() == 0


def _dense(q, k, v, attend_current):
    """The authors' dense log-space reference (fla naive_stickbreaking_attn), float64."""
    T = q.shape[2]
    z = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    masked = torch.ones(T, T, dtype=torch.bool).triu(1 if attend_current else 0)
    log_z = F.logsigmoid(z).masked_fill(masked, -1e5)
    log_beta = F.logsigmoid(-z).masked_fill(masked, 0)
    log_att = log_z + log_beta @ torch.ones(T, T, dtype=F64).tril(-1)
    return log_att.exp() @ v


@pytest.mark.parametrize("current", [True, False])
def test_past_one_block_equals_the_authors_dense_form_with_gradients(tmp_path, current):
    """L = 300 > one block of 256 queries: the blocks (recomputed in the backward pass) join exactly."""
    text = (SCHEMES / "stick_breaking.pe").read_text()
    if not current:
        text = text.replace("normalize = stick_breaking", "normalize = stick_breaking(current = false)")
    m = _mod(text, heads=2, hd=16, tmp=tmp_path)
    q, k, v = (_rand(1, 2, 300, 16, seed=s).requires_grad_() for s in (5, 6, 7))
    got, want = m(q, k, v), _dense(q, k, v, current)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)
    wgt = _rand(*want.shape, seed=8)
    for a, b in zip(torch.autograd.grad((got * wgt).sum(), (q, k, v)), torch.autograd.grad((want * wgt).sum(), (q, k, v))):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9)
    probs = m.probs(q.detach(), k.detach())
    torch.testing.assert_close(probs @ v.detach(), want.detach(), rtol=1e-9, atol=1e-10)
    assert float(probs.sum(-1).max()) <= 1 + 1e-12  # the weights never sum past one


@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16])
def test_decoding_with_a_cache_equals_a_full_forward(tmp_path, dtype):
    m = _mod(ROPE_ALIBI.replace("NORM", "stick_breaking"), tmp=tmp_path).to(dtype)
    q, k, v = (_rand(2, 4, 20, 8, seed=s).to(dtype) for s in (1, 2, 3))
    full = m(q, k, v)
    cache = m.new_cache(2)
    outs = [m(q[:, :, :7], k[:, :, :7], v[:, :, :7], cache=cache)]
    for t in range(7, 20, 3):
        outs.append(m(q[:, :, t:t + 3], k[:, :, t:t + 3], v[:, :, t:t + 3], cache=cache))
    got = torch.cat(outs, dim=2)
    if dtype == F64:
        torch.testing.assert_close(got, full, rtol=1e-10, atol=1e-12)
        return
    want = _mod(ROPE_ALIBI.replace("NORM", "stick_breaking"), tmp=tmp_path)(*(t.double() for t in (q, k, v)))
    if dtype == torch.float32:
        # the float32 chain: the score's 8 channels, the rotation's phase (position x frequency, up to L), the
        # bias, the breaks' log-sum over L keys and the weighted sum's L, the inputs' rounding; the cache and the
        # full forward each within it of float64, so within twice it of each other. A lost cached key errs ~0.1.
        bound = float32_bound(8 + 4 * 20 + 2, want)
        assert float((full.double() - want).abs().max()) <= bound
        assert float((got - full).abs().max()) <= 2 * bound
        return
    torch.testing.assert_close(got, full, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(full.double(), want, rtol=8e-2, atol=8e-2)


def test_compiled_module_equals_the_in_process_one(tmp_path):
    from compiler_helpers import assert_generated_module_matches
    from pedsl.compiler.codegen import generate

    m = _mod(ROPE_ALIBI.replace("NORM", "stick_breaking(current = false)"), tmp=tmp_path)
    src = generate(m.scheme, m.plan)
    assert "NORMALIZE = 'stick_breaking'" in src and "ATTEND_CURRENT = False" in src
    assert_generated_module_matches(m, src, tmp_path / "sb_mod.py")


@pytest.mark.parametrize("text, where", [
    ("normalize = sparsemax", "normalize takes softmax, softmax1, sigmoid, stick_breaking"),
    ("normalize = stick_breaking(current = 3)", "takes true or false"),
    ("normalize = stick_breaking(2)", "normalize takes softmax"),
    ("qk: accumulate(householder(w = normalize(linear(x, to = channel)), beta = 2 * sigmoid(linear(x, to = head))))\n"
     "  normalize = stick_breaking", "cannot go with accumulate(householder"),
])
def test_bad_normalize_is_a_positioned_diagnostic(tmp_path, text, where):
    f = tmp_path / "bad.pe"
    f.write_text('scheme bad "bad" {\n  ' + text + "\n}\n")
    diags = check(f)
    assert diags and diags[0].code == "E242" and where in diags[0].message, [d.render() for d in diags]
    assert diags[0].line == text.count("\n") + 2


def test_extends_overrides_and_resets_the_normaliser(tmp_path):
    f = tmp_path / "chain.pe"
    f.write_text('scheme a "a" {\n  normalize = stick_breaking\n}\n'
                 'scheme b extends a "b" {\n  normalize = softmax\n}\n'
                 'scheme c extends a "c" {\n  qk: rotate(geometric(10000.0) * position)\n}\n')
    from pedsl.lang.api import load

    assert load(f, scheme="a").normalize == "stick_breaking" and load(f, scheme="c").normalize == "stick_breaking"
    assert load(f, scheme="b").normalize == "softmax"


@pytest.mark.parametrize("shape", ["window = 4", "chunk = 5"])
def test_a_window_or_chunk_limits_the_stick_to_the_keys_in_view(tmp_path, shape):
    """Each block of queries reads only its key span: the stick breaks over the keys the window or chunk
    shows, as the reference's formula loop over the allowed keys says."""
    text = ROPE_ALIBI.replace("NORM", "stick_breaking").replace("  layout interleaved", f"  layout interleaved\n  {shape}")
    ref, m = _mod(text, "reference", tmp=tmp_path), _mod(text, tmp=tmp_path)
    q = _rand(2, 4, 13, 8, seed=1).requires_grad_()
    k, v = (_rand(2, 4, 13, 8, seed=s).requires_grad_() for s in (2, 3))
    want, got = ref(q, k, v), m(q, k, v)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)
    for a, b in zip(torch.autograd.grad(got.sum(), (q, k, v)), torch.autograd.grad(want.sum(), (q, k, v))):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9)
    cache = m.new_cache(2)
    steps = [m(q[:, :, :6].detach(), k[:, :, :6].detach(), v[:, :, :6].detach(), cache=cache)]
    steps += [m(q[:, :, t:t + 1].detach(), k[:, :, t:t + 1].detach(), v[:, :, t:t + 1].detach(), cache=cache)
              for t in range(6, 13)]
    torch.testing.assert_close(torch.cat(steps, dim=2), want.detach(), rtol=1e-9, atol=1e-10)


def test_stick_breaking_with_a_sink_is_refused(tmp_path):
    f = tmp_path / "bad.pe"
    f.write_text('scheme bad "bad" {\n  sink = logit\n  normalize = stick_breaking\n}\n')
    (d,) = check(f)
    assert d.code == "E242" and "sink" in d.message and d.line == 3

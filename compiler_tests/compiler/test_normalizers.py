"""Sigmoid attention and softmax plus one (docs/semantics.md §1b) against their formulas.

No peer implements either in the installed libraries, so two independent oracles: the formula written
here as float64 loops over (query, key) - ``sigmoid(s_ij + b)`` with no sum over the keys (Ramapuram et
al. 2024), ``exp(s_ij) / (1 + sum_t exp(s_it))`` (a logit 0 pinned in the denominator) - for output and
gradients; and the reference backend's naive interpreter (``pedsl.ops.reference``) with packed documents,
padding, given positions, grouped key/value heads, a rotation and a bias. Cached decoding equals the full
forward; rows past one block of queries, the streamed instruments and the generated module agree.
"""

from __future__ import annotations

import math

import pytest
import torch

from compiler_helpers import (
    D_MODEL, SCHEMES, assert_generated_module_matches, assert_packed_padded_call_matches, module_from_text,
    rnd,
)
from pedsl.compiler import compile_scheme
from pedsl.lang.api import check, load

F64 = torch.float64
NORMS = ("sigmoid(bias = -1.5)", "softmax1")

ROPE_ALIBI = """
scheme n_rope "a normaliser over a rotation and a bias" {
  qk: rotate(geometric(100.0) * position)
  bias = -slopes(heads) * distance
  normalize = NORM
}
"""
NOPE = 'scheme n_nope "a normaliser alone" {\n  normalize = NORM\n  EXTRA\n}\n'


def _mod(text, backend="auto", heads=4, hd=8, tmp=None):
    return module_from_text(text, tmp, backend, heads, hd)


def _rand(*shape, seed):
    return rnd(*shape, seed=seed)


def formula(q, k, v, norm: str, bias: float = -1.5, window: int | None = None):
    """The normaliser's formula as loops over queries i and keys j <= i (within ``window``), float64, with
    k and v of one key/value head per ``Hq // Hk`` query heads."""
    B, Hq, L, D = q.shape
    rep = Hq // k.shape[1]
    out = torch.zeros(B, Hq, L, D, dtype=F64)
    rows = []
    for b in range(B):
        for h in range(Hq):
            for i in range(L):
                keys = [j for j in range(i + 1) if window is None or i - j < window]
                s = [(q[b, h, i] * k[b, h // rep, j]).sum() / math.sqrt(D) for j in keys]
                if norm == "sigmoid":
                    w = [1 / (1 + torch.exp(-(sj + bias))) for sj in s]
                else:
                    den = 1 + sum(torch.exp(sj) for sj in s)
                    w = [torch.exp(sj) / den for sj in s]
                rows.append(sum(wj * v[b, h // rep, j] for wj, j in zip(w, keys)))
    return torch.stack(rows).reshape(B, Hq, L, D) + out


@pytest.mark.parametrize("norm", ["sigmoid", "softmax1"])
@pytest.mark.parametrize("window", [None, 3])
def test_the_general_call_equals_the_formula_forward_and_backward(tmp_path, norm, window):
    text = NOPE.replace("NORM", "sigmoid(bias = -1.5)" if norm == "sigmoid" else norm)
    m = _mod(text.replace("EXTRA", "" if window is None else f"window = {window}"), heads=2, tmp=tmp_path)
    q = (2 * _rand(2, 2, 7, 8, seed=1)).requires_grad_()
    k, v = (_rand(2, 1, 7, 8, seed=s).requires_grad_() for s in (2, 3))  # one key/value head: GQA
    got, want = m(q, k, v), formula(q, k, v, norm, window=window)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    wgt = _rand(*want.shape, seed=4)
    for a, b in zip(torch.autograd.grad((got * wgt).sum(), (q, k, v)),
                    torch.autograd.grad((want * wgt).sum(), (q, k, v))):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("norm", NORMS)
def test_documents_padding_positions_and_gqa_equal_the_reference(tmp_path, norm):
    text = ROPE_ALIBI.replace("NORM", norm)
    # padded queries see no key: zeros under both normalisers
    assert_packed_padded_call_matches(_mod(text, tmp=tmp_path), _mod(text, "reference", tmp=tmp_path))


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("shape", ["", "window = 4", "chunk = 5"])
def test_cached_decoding_equals_the_full_forward(tmp_path, norm, shape):
    """Both are sums over the keys a query sees, nothing carried between keys: a token decoded after a
    cached prefill weighs its keys as the full forward does (the sigmoid's bias is a number, not the
    run-time length)."""
    text = ROPE_ALIBI.replace("NORM", norm).replace("  bias =", f"  {shape}\n  bias =")
    m = _mod(text, tmp=tmp_path)
    q, k, v = (_rand(2, 4, 13, 8, seed=s) for s in (1, 2, 3))
    full = m(q, k, v)
    cache = m.new_cache(2)
    steps = [m(q[:, :, :6], k[:, :, :6], v[:, :, :6], cache=cache)]
    steps += [m(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], cache=cache) for t in range(6, 13)]
    torch.testing.assert_close(torch.cat(steps, dim=2), full, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("norm", ["sigmoid", "softmax1"])
def test_rows_past_one_block_of_queries_equal_the_dense_formula(tmp_path, norm):
    """300 queries: two blocks of the general path's explicit rows (or SDPA's blocks with the pinned column);
    against the formula written densely in float64."""
    m = _mod(NOPE.replace("NORM", "sigmoid(bias = -1.5)" if norm == "sigmoid" else norm).replace("EXTRA", ""),
             heads=2, tmp=tmp_path)
    q, k, v = (_rand(1, 2, 300, 8, seed=s) for s in (1, 2, 3))
    s = (q @ k.transpose(-1, -2)) / math.sqrt(8)
    causal = torch.ones(300, 300, dtype=torch.bool).tril()
    if norm == "sigmoid":
        w = torch.sigmoid(s - 1.5) * causal
    else:
        e = torch.exp(s) * causal
        w = e / (1 + e.sum(-1, keepdim=True))
    torch.testing.assert_close(m(q, k, v), w @ v, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(m.probs(q, k), w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["rope_sigmoid", "rope_softmax1"])
def test_streamed_instruments_equal_the_dense_ones(name):
    """Sigmoid weights add over blocks of keys with no running maximum; softmax plus one's pinned logit
    joins the online denominator and is no learned sink."""
    from pedsl.study import instruments as ins
    from pedsl.study.streaming import streamed_far_sink

    mod = compile_scheme(SCHEMES / f"{name}.pe", head_dim=16, num_heads=2, d_model=D_MODEL,
                         requires_grad=False).double()
    q, k = (2 * _rand(2, 2, 70, 16, seed=s) for s in (1, 2))
    with torch.no_grad():
        a = mod.probs(q, k)
    got = streamed_far_sink(mod, q, k, 8, block=16)
    torch.testing.assert_close(got["far_mass"], ins.far_mass(a, 8), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(got["sink_mass"], ins.sink_mass(a), rtol=1e-9, atol=1e-12)
    assert float(got["learned_sink_mass"].abs().max()) == 0
    assert float(ins.far_mass(a, 8).mean()) > 0.01


@pytest.mark.parametrize("norm", NORMS)
def test_compiled_module_equals_the_in_process_one(tmp_path, norm):
    from pedsl.compiler.codegen import generate

    m = _mod(ROPE_ALIBI.replace("NORM", norm), tmp=tmp_path)
    src = generate(m.scheme, m.plan)
    assert f"NORMALIZE = {norm.partition('(')[0]!r}" in src
    assert ("SIGMOID_BIAS = -1.5" if norm.startswith("sigmoid") else "SIGMOID_BIAS = 0.0") in src
    assert_generated_module_matches(m, src, tmp_path / "n_mod.py")


def test_the_sigmoid_bias_is_the_papers_minus_log_n(tmp_path):
    s = load(SCHEMES / "rope_sigmoid.pe")
    assert s.normalize == "sigmoid" and s.sigmoid_bias == pytest.approx(-math.log(s.params["train_length"]))
    assert load(SCHEMES / "rope_sigmoid.pe", {"train_length": 1024}).sigmoid_bias == pytest.approx(
        -math.log(1024))
    f = tmp_path / "bare.pe"
    f.write_text(NOPE.replace("NORM", "sigmoid").replace("EXTRA", ""))
    assert load(f).sigmoid_bias == 0.0


def test_no_fused_kernel_takes_them_but_paths_window_takes_softmax1():
    """SDPA, the fused and the decode kernels compute softmax only: neither normaliser is in their
    declaration; PaTH's window kernel and the C++ causal kernel (``bias``) take a sink column, so softmax plus
    one (its logit 0)."""
    assert compile_scheme(SCHEMES / "rope_sigmoid.pe", num_heads=2, head_dim=16).plan.kernels == ()
    assert compile_scheme(SCHEMES / "rope_softmax1.pe", num_heads=2, head_dim=16).plan.kernels == ("bias",)
    src = f'import "{SCHEMES / "path.pe"}"\nscheme s extends path {{\n  window = 3\n  normalize = softmax1\n}}'
    assert compile_scheme(src, num_heads=2, head_dim=16, d_model=D_MODEL).plan.kernels == ("path-window",)


@pytest.mark.parametrize("text, where", [
    ("normalize = sparsemax", "normalize takes softmax, softmax1, sigmoid"),
    ("normalize = sigmoid(2.0)", "normalize takes"),
    ("normalize = sigmoid(current = false)", "normalize takes"),
    ("normalize = sigmoid(bias = n)", "known when the scheme is checked"),
    ("normalize = sigmoid(bias = true)", "finite number"),
    ("sink = logit\n  normalize = softmax1", "cannot go with sink = logit"),
    ("sink = token\n  normalize = sigmoid", "cannot go with sink = token"),
    ("sink = logit\n  normalize = stick_breaking", "cannot go with sink = logit"),
    ("qk: accumulate(householder(w = normalize(linear(x, to = channel)), beta = 2 * sigmoid(linear(x, to = head))))"
     "\n  normalize = sigmoid", "cannot go with accumulate(householder"),
])
def test_bad_normalize_is_a_positioned_diagnostic(tmp_path, text, where):
    f = tmp_path / "bad.pe"
    f.write_text('scheme bad "bad" {\n  ' + text + "\n}\n")
    diags = check(f)
    assert diags and diags[0].code == "E242" and where in diags[0].message, [d.render() for d in diags]
    assert diags[0].line == text.count("\n") + 2


def test_show_and_diff_read_the_normaliser():
    from pedsl.cli.diff import build
    from pedsl.lang.statements import BY_KIND

    a, b = load(SCHEMES / "rope_sigmoid.pe"), load(SCHEMES / "rope_softmax1.pe")
    show = BY_KIND["normalize"].show.lines
    assert show(a) == [f"normalize: sigmoid(bias = {-math.log(128)!r})"] and show(b) == ["normalize: softmax1"]
    edit = next(e for e in build(a, b, "a.pe", "b.pe", {}, {})["edits"] if e["path"] == "normalize")
    assert (edit["old"], edit["new"]) == (f"sigmoid(bias = {-math.log(128)!r})", "softmax1"), edit

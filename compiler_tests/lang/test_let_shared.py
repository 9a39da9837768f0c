"""A name denotes one value: a `let` bound to a learned value is one set of parameters, however many
times - and wherever - it is used (docs/language.md, "let").

``let c = shortconv(linear(x, ...))`` read twice (``c * sigmoid(c)``, the SiLU of FLA's PaTH layer) is
one convolution and one projection: in the module, the reference backend, the generated module, the
numpy sampler of ``diff --numeric``, and the plan that ``pedsl graph`` / ``explain`` print. Gradients
reach the one set of parameters through both uses.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import pedsl
from compiler_helpers import float32_bound, forward_and_grads, run_cli
from compiler_helpers import SCHEMES
from pedsl.compiler import compile_scheme
from pedsl.compiler.codegen import generate
from pedsl.compiler.plan import learned_sites
from pedsl.compiler.reference import reference_forward
from pedsl.lang.api import check
from pedsl.diffing import numeric as N
from pedsl.diffing.sample import Sampler

F64 = torch.float64
DM = 12

SILU = """scheme path_silu "PaTH with w the SiLU of one short convolution" {
  let c = shortconv(linear(x, to = channel, rank = 16))
  qk: accumulate(householder(w = normalize(c * sigmoid(c)), beta = 2 * sigmoid(linear(x, to = head))))
}"""
# one gate logit read by two sites: the Householder beta and the forget-gate bias
TWO_SITES = """scheme shared_gate "one learned logit for beta and the forget gate" {
  let g = linear(x, to = head, init_bias = 2)
  qk: accumulate(householder(w = normalize(shortconv(linear(x, to = channel))), beta = 2 * sigmoid(g)))
  bias = accumulate(log_sigmoid(g))
}"""
LET_KEYS = {"let[c]__linear0", "let[c]__shortconv1"}


def _load(text, **kw):
    return pedsl.load(text, heads=2, head_dim=8, **kw)


def _module(text, backend="auto", seed=0):
    torch.manual_seed(seed)
    return compile_scheme(_load(text), backend=backend, d_model=DM).double()


def _inputs(seed=1, L=7):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 2, L, 8, generator=g, dtype=F64, requires_grad=True) for _ in range(3))
    return q, k, v, torch.randn(2, L, DM, generator=g, dtype=F64)


def test_a_let_read_twice_is_one_site():
    mod = _module(SILU)
    assert set(mod.learned.sites) == LET_KEYS | {"beta[all]__linear0"}
    path = compile_scheme(pedsl.load(SCHEMES / "path.pe", heads=2, head_dim=8), d_model=DM)
    assert sum(p.numel() for p in mod.parameters()) == sum(p.numel() for p in path.parameters())
    sites = {ls.key: dict(ls.readers) for ls in learned_sites(mod.plan)}
    assert sites == {"let[c]__linear0": {"w[all]": 2}, "let[c]__shortconv1": {"w[all]": 2},
                     "beta[all]__linear0": {"beta[all]": 1}}


def test_the_value_is_c_times_sigmoid_c_and_both_uses_carry_gradient():
    """w = normalize(c sigmoid(c)) with one c; d/dc reaches the convolution and projection through both
    factors (dropping either use's gradient gives a different answer)."""
    mod = _module(SILU)
    _, _, _, x = _inputs()
    lin, conv = mod.learned.sites["let[c]__linear0"], mod.learned.sites["let[c]__shortconv1"]

    def manual(detach_second: bool):
        u = lin(x).view(2, 7, 2, 8).permute(0, 2, 3, 1).reshape(2, 16, 7)  # (B, H * chan, L)
        c = conv(u)[..., :7].view(2, 2, 8, 7).transpose(-1, -2)  # (B, H, L, chan)
        return F.normalize(c * torch.sigmoid(c.detach() if detach_second else c), dim=-1)

    w, _, _ = mod.householder_inputs(2, 7, x, None, None, F64)
    want = manual(False)
    torch.testing.assert_close(w, want, rtol=1e-13, atol=1e-14)
    r = torch.randn(w.shape, generator=torch.Generator().manual_seed(5), dtype=F64)
    params = [*lin.parameters(), *conv.parameters()]
    got_g = torch.autograd.grad((w * r).sum(), params)
    want_g = torch.autograd.grad((want * r).sum(), params)
    one_use = torch.autograd.grad((manual(True) * r).sum(), params)
    for a, b, c in zip(got_g, want_g, one_use):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)
        assert (a - c).abs().max() > 1e-6

    class W(torch.nn.Module):  # w as a function of the shared parameters, for a finite-difference check
        def __init__(self):
            super().__init__()
            self.mod = mod

        def forward(self):
            return mod.householder_inputs(1, 4, x[:1, :4], None, None, F64)[0]

    names = ["mod.learned.sites.let[c]__shortconv1.weight", "mod.learned.sites.let[c]__linear0.1.weight"]
    start = [conv.weight.detach().clone().requires_grad_(True), lin[1].weight.detach().clone().requires_grad_(True)]
    assert torch.autograd.gradcheck(lambda a, b: torch.func.functional_call(W(), dict(zip(names, (a, b))), ()), start)


@pytest.mark.parametrize("text", [SILU, TWO_SITES], ids=["silu", "two_sites"])
def test_every_backend_equals_the_reference_forward_and_backward(text):
    mod = _module(text)
    q, k, v, x = _inputs()
    out, grads = forward_and_grads(mod, q, k, v, x, None)
    ref = _module(text, backend="reference")
    ref.load_state_dict(mod.state_dict())
    rout, rgrads = forward_and_grads(ref, q, k, v, x, None)
    torch.testing.assert_close(out, rout, rtol=1e-10, atol=1e-12)
    for a, b in zip(grads, rgrads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(reference_forward(mod, q, k, v, x=x), out, rtol=1e-10, atol=1e-12)


def test_a_let_read_by_two_sites_is_one_site():
    mod = _module(TWO_SITES)
    sites = {ls.key: dict(ls.readers) for ls in learned_sites(mod.plan)}
    assert sites["let[g]__linear0"] == {"beta[all]": 1, "bias[0]": 1}
    assert not any(k.startswith(("beta[all]__", "bias[0]__")) for k in mod.learned.sites)


@pytest.mark.parametrize("text", [SILU, TWO_SITES], ids=["silu", "two_sites"])
def test_generated_module_equals_the_compiled_one(text, tmp_path):
    mod = _module(text)
    path = tmp_path / "gen_shared.py"
    path.write_text(generate(mod.scheme, mod.plan, d_model=DM))
    assert path.read_text().count("self.learned.sites['let[") >= 2  # declared once, read by every use
    spec = importlib.util.spec_from_file_location("gen_shared", path)
    gen_mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_mod)
    gen = gen_mod.Module().double()
    gen.load_state_dict(mod.state_dict())  # strict: the same parameter sets, by the same names
    assert sum(p.numel() for p in gen.parameters()) == sum(p.numel() for p in mod.parameters())
    q, k, v, x = _inputs()
    out, grads = forward_and_grads(mod, q, k, v, x, None)
    gout, ggrads = forward_and_grads(gen, q, k, v, x, None)
    torch.testing.assert_close(gout, out, rtol=1e-10, atol=1e-12)
    for a, b in zip(ggrads, grads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_the_numpy_sampler_draws_one_site_and_reproduces_the_module():
    s = _load(SILU)
    fresh = Sampler(s, d_model=DM)
    xs = np.random.default_rng(0).standard_normal((2, 7, DM))
    fresh.householder(s.transports[0], 7, xs)
    assert set(fresh.weights) == LET_KEYS | {"beta[all]__linear0"}
    mod = _module(SILU).float()
    x = torch.from_numpy(xs).float()
    weights = {site: {k: t.double().numpy() for k, t in m.state_dict().items()} for site, m in mod.learned.sites.items()}
    sm = Sampler(s, d_model=DM, weights=weights)
    gw, gb = sm.householder(s.transports[0], 7, xs)
    with torch.no_grad():
        w, beta, _ = mod.householder_inputs(2, 7, x, None, None, torch.float32)
    # float32 chains: w's input cast, two linears (DM and rank 16 terms), the 4-tap convolution, SiLU's 3 and
    # normalize's D + 2; beta's linear (DM), sigmoid's 2 and the doubling; a wrong tap or site errs ~0.1
    D = w.shape[-1]
    w_bound = float32_bound(1 + DM + 16 + 4 + 3 + D + 2, torch.from_numpy(gw))
    np.testing.assert_allclose(gw, w.double().numpy(), rtol=0, atol=w_bound)
    np.testing.assert_allclose(gb, beta.double().numpy(), rtol=0, atol=float32_bound(1 + DM + 3, torch.from_numpy(gb)))
    c = N.curves(s, lmax=12)  # what `pedsl diff --numeric` plots
    assert c.transport[0] == pytest.approx(1.0, abs=1e-6) and np.all(np.isfinite(c.transport))


def test_graph_and_explain_show_one_site(tmp_path):
    f = tmp_path / "path_silu.pe"
    f.write_text(SILU + "\n")
    for cmd in ("graph", "explain"):
        code, out, err = run_cli(cmd, f)
        assert code == 0, out + err
        assert out.count("let[c]__shortconv1") == 1 and "w[all]__shortconv" not in out
        assert any("let[c]__shortconv1" in line and "<- w[all] x2" in line for line in out.splitlines())
    code, out, _ = run_cli("graph", f, "--format", "json")
    assert code == 0 and '"let[c]__shortconv1"' in out


def test_one_per_pair_let_cannot_serve_groups_of_two_sizes():
    text = """scheme t {{
  channels {{ a = {a}; b = rest }}
  let g = linear(x, to = pair)
  qk on a: accumulate(rotation(0.1 * g))
  qk on b: accumulate(rotation(0.2 * g))
}}"""
    (diag,) = check(text.format(a="range(0, 2)"))  # 2 and 30 channels
    assert diag.code == "E204" and diag.line == 3 and diag.hint
    assert "'g'" in diag.message and "group 'a' (2 channels)" in diag.message and "one value" in diag.message
    code, out, err = run_cli("check", "-", input=text.format(a="range(0, 2)"))
    assert code == 1 and "error[E204]" in out + err
    mod = _module(text.format(a="range(0, 4)"))  # 4 and 4 channels: one value, read by both groups
    assert [k for k in mod.learned.sites] == ["let[g]__linear0"]
    q, k, v, x = _inputs()
    ref = _module(text.format(a="range(0, 4)"), backend="reference")
    ref.load_state_dict(mod.state_dict())
    torch.testing.assert_close(mod(q, k, v, x=x), ref(q, k, v, x=x), rtol=1e-10, atol=1e-12)


def test_diff_tells_one_shared_value_from_the_same_call_written_twice():
    """Inlined, the two read alike; `pedsl diff` says that one has one set of parameters and the other two."""
    from pedsl.diffing.edits import Update, diff

    twice = SILU.replace("let c = shortconv(linear(x, to = channel, rank = 16))\n", "").replace(
        "c * sigmoid(c)", "shortconv(linear(x, to = channel, rank = 16)) * sigmoid(shortconv(linear(x, to = channel, "
        "rank = 16)))")
    assert diff(_load(SILU), _load(twice)) == [Update("learned.shared", [
        "linear(x, to = channel, rank = 16) read 2 times", "shortconv(linear(x, to = channel, rank = 16)) read 2 times"],
        [])]
    once = "scheme a { let c = linear(x, to = pair)\n qk: accumulate(rotation(0.1 * c)) }"
    assert diff(_load(once), _load("scheme a { qk: accumulate(rotation(0.1 * linear(x, to = pair))) }")) == []

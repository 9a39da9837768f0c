"""Every fast path against the reference interpreter, on random valid schemes and every call mode.

A draw is a library scheme plus several statements at once (window or chunk, a sink, a soft cap, a bias,
a temperature, a normaliser, a mask; extreme but valid values among them: a soft cap of 1e4 or 0.5, biases 40 times ALiBi's).
Each is run in every call mode - fresh, grouped key/value heads, left padding, packed documents, a cached
prefill then one token at a time, a prefill in chunks - by the compiled module (which picks the kernel the
plan's declarations and the call allow: :mod:`pedsl.compiler.kernel_support`) and by the reference backend
(the naive float64 interpreter, :mod:`pedsl.compiler.reference`), forward and gradients in float64. A spy
records which kernel ran, so the slice is known to reach the kernels it claims to check. A declaration
wider than its kernel is caught: widening one on purpose makes the comparison fail.

The fast slice runs in the suite; the soak is ``PEDSL_KERNEL_SOAK=<draws> python -m pytest -p no:xdist
compiler_tests/compiler/test_kernel_paths.py`` (docs/DEVELOPING.md).
"""

from __future__ import annotations

import os
import random

import pytest
import torch

from compiler_helpers import D_MODEL, band_kernel_or_skip, fast_and_reference, output_and_grads
from torch.nn.attention.flex_attention import flex_attention

from pedsl.compiler import flex_lowering, kernel_support, module, stream
from pedsl.compiler.general import attention as general_attention
from pedsl.compiler.general import path as general_path
from pedsl.errors import PedslError

# float64 throughout: the fast paths and the interpreter differ by rounding only (the tolerance of
# test_compiler_differential.py, the same comparison over the library alone)
RTOL, ATOL = 1e-9, 1e-10
GRAD_RTOL, GRAD_ATOL = 1e-8, 1e-9
BASES = ("nope", "rope", "rope_id", "alibi", "t5_bias", "fire", "fox", "xpos", "acc_learned_qkv", "path",
         "path_fox", "stick_breaking", "cope", "mrope", "kerple_log")
SHAPES = ("", "window = 3", "window = 6", "chunk = 4")
SINKS = ("", "", "sink = logit", "sink = token")
CAPS = ("", "", "softcap = 0.5", "softcap = 3.0", "softcap = 1.0e4")
BIASES = ("", "", "", "bias = -40.0 * slopes(heads) * distance", "bias = -0.5 * slopes(heads) * distance",
          "bias = table(bucket(distance, buckets = 8, max_distance = 16), to = head)")
TEMPERATURES = ("", "", "temperature = 2.5", "temperature = log_length(4)")
NORMALIZERS = ("", "", "", "normalize = sigmoid(bias = -1.5)", "normalize = softmax1")
MASKS = ("", "", "", "mask = bidirectional", "mask = prefix(4)", "mask = spans")
# span ids inside the first four tokens, so that the cached modes' first call holds every span whole
SPAN_IDS = torch.tensor([[1, 1, 1, 0, 0, 0, 0, 0, 0], [0, 2, 2, 0, 0, 0, 0, 0, 0]])
MODES = ("fresh", "gqa", "padded", "documents", "decode", "chunked")
HEADS, HEAD_DIM, B, L = 2, 8, 2, 9


def draw(rng: random.Random) -> tuple[str, str]:
    """A library scheme and the statements added to it (one of each family at most)."""
    extra = [rng.choice(options) for options in (SHAPES, SINKS, CAPS, BIASES, TEMPERATURES, NORMALIZERS, MASKS)]
    return rng.choice(BASES), "\n".join(s for s in extra if s)


def compiled(base: str, extra: str, **kw):
    """(fast, reference) in float64 with the same perturbed parameters, or None for a draw the language
    refuses (a sink with stick-breaking, a soft cap with PaTH, ...); ``kw``: the fast module's options."""
    try:
        return fast_and_reference(base, extra, HEADS, HEAD_DIM, **kw)
    except PedslError:
        return None


def draws(n: int, seed: int) -> list[tuple[str, str]]:
    rng, out = random.Random(seed), []
    while len(out) < n:
        base, extra = draw(rng)
        if compiled(base, extra) is not None:
            out.append((base, extra))
    return out


def _inputs(mod, Hkv: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, HEADS, L, HEAD_DIM, generator=g, dtype=torch.float64).requires_grad_()
    k, v = (torch.randn(B, Hkv, L, HEAD_DIM, generator=g, dtype=torch.float64).requires_grad_() for _ in range(2))
    x = torch.randn(B, L, D_MODEL, generator=g, dtype=torch.float64) if mod.needs_x else None
    tokens = torch.randint(0, 256, (B, L), generator=g) if mod.needs_tokens else None
    return q, k, v, dict(x=x, tokens=tokens)


def _call_kwargs(mod, mode: str) -> dict:
    if mod.plan.mask == "spans":
        return dict(span_ids=SPAN_IDS, **_call_kwargs_of(mode))
    return _call_kwargs_of(mode)


def _call_kwargs_of(mode: str) -> dict:
    if mode == "padded":  # row 1 left-padded by three tokens
        mask = torch.ones(B, L, dtype=torch.bool)
        mask[1, :3] = False
        return dict(attn_mask=mask)
    if mode == "documents":
        return dict(document_ids=torch.tensor([[0] * 4 + [1] * 5, [0] * 6 + [1] * 3]))
    return {}


def _cached_run(mod, q, k, v, kw: dict, parts: tuple[int, ...]):
    """The call split into consecutive parts over one cache, no gradient."""
    cache, outs, s = mod.new_cache(B), [], 0
    with torch.no_grad():
        for n in parts:
            cut = {name: (None if t is None else t[:, s:s + n]) for name, t in kw.items()}
            outs.append(mod(q[:, :, s:s + n], k[:, :, s:s + n], v[:, :, s:s + n], cache=cache, **cut))
            s += n
    return torch.cat(outs, dim=2)


def run_mode(mod, mode: str, seed: int, grad: bool = True):
    """(output, gradients or None) of one call mode; the same inputs for every module; ``grad=False``: the
    output alone, without gradients."""
    q, k, v, kw = _inputs(mod, 1 if mode == "gqa" else HEADS, seed)
    kw.update(_call_kwargs(mod, mode) if mode not in ("decode", "chunked") else _call_kwargs(mod, "fresh"))
    if mode == "decode":  # a cached prefill, then one token at a time
        return _cached_run(mod, q, k, v, kw, (L - 3, 1, 1, 1)), None
    if mode == "chunked":
        return _cached_run(mod, q, k, v, kw, (4, 3, 2)), None
    if not grad:
        with torch.no_grad():
            return mod(q, k, v, **kw), None
    return output_and_grads(mod, q, k, v, **kw)


def check(fast, ref, mode: str, seed: int = 0, grad: bool = True) -> None:
    """The fast module's output (and gradients, unless ``grad=False``) in ``mode`` equal the reference
    interpreter's; a bidirectional scheme's cached modes are refused by both."""
    if fast.plan.mask == "bidirectional" and mode in ("decode", "chunked"):
        for mod in (fast, ref):
            with pytest.raises(PedslError, match="nothing to decode"):
                run_mode(mod, mode, seed)
        return
    out_f, g_f = run_mode(fast, mode, seed, grad)
    out_r, g_r = run_mode(ref, mode, seed, grad)
    torch.testing.assert_close(out_f, out_r, rtol=RTOL, atol=ATOL)
    for a, b in zip(g_f or (), g_r or ()):
        torch.testing.assert_close(a, b, rtol=GRAD_RTOL, atol=GRAD_ATOL)


@pytest.fixture
def ran(monkeypatch) -> list[str]:
    """The kernels that took a call (the call checks that said yes), in order."""
    seen: list[str] = []

    def spy(owner, name, label):
        real = getattr(owner, name)

        def wrapped(*args, **kwargs):
            got = real(*args, **kwargs)
            if got and label(args, got):
                seen.append(label(args, got))
            return got

        monkeypatch.setattr(owner, name, wrapped)

    spy(module, "fused_call", lambda a, got: "fused" if "fused" in a[0] else "fused-half")
    spy(module, "bias_call", lambda a, got: "bias")
    spy(general_attention, "bias_call", lambda a, got: "bias")
    spy(module, "bidirectional_call", lambda a, got: "bidirectional")
    spy(stream, "decode_call", lambda a, got: "decode")
    spy(general_attention, "causal_call", lambda a, got: a[1] if a[1] == "causal-sdpa" else None)
    spy(general_attention, "window_call", lambda a, got: "flash-window")
    spy(general_attention, "fresh_sequence_call", lambda a, got: a[1])
    spy(general_attention, "mlp_call", lambda a, got: "mlp")
    spy(general_path, "path_call", lambda a, got: got)
    spy(stream, "flex_call", lambda a, got: "flex")
    # FlexAttention eagerly (its scores materialised, milliseconds on CPU): the compiled kernel is
    # test_compiler_torch_compile.py's
    monkeypatch.setattr(flex_lowering, "flex_kernel", lambda device: flex_attention)
    return seen


FAST_SLICE = draws(int(os.environ.get("PEDSL_KERNEL_SOAK", "10")), seed=int(os.environ.get("PEDSL_KERNEL_SEED", "36")))


@pytest.mark.parametrize("base, extra", FAST_SLICE, ids=[f"{b}[{e.replace(chr(10), ';')}]" for b, e in FAST_SLICE])
def test_every_path_matches_the_reference(base, extra, ran):
    fast, ref = compiled(base, extra)
    for mode in MODES:
        check(fast, ref, mode)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("base, extra", FAST_SLICE, ids=[f"{b}[{e.replace(chr(10), ';')}]" for b, e in FAST_SLICE])
def test_the_flex_lowering_matches_the_reference(base, extra, ran):
    """The draws compiled for the flex backend (forward only: no CPU backward): the lowering takes the calls
    it declares, the general path the cached ones; a draw it cannot lower is refused with the feature named."""
    try:
        fast, ref = fast_and_reference(base, extra, HEADS, HEAD_DIM, backend="flex", requires_grad=False)
    except PedslError as exc:
        assert exc.code in ("E402", "E406"), str(exc)
        return
    for mode in MODES:
        check(fast, ref, mode, grad=False)
    assert "flex" in ran


# schemes that must reach each kernel in the slice below (the random draws add the combinations)
REACH = {
    "fused": ("rope", "temperature = 2.5"), "decode": ("rope", "window = 3"),
    "causal-sdpa": ("rope_id", ""), "flash-window": ("xpos", "chunk = 4"),
    "distance": ("t5_bias", "temperature = 2.5"), "mlp": ("fire", ""),
    "path-blockwise": ("path_fox", ""), "path-window": ("path", "window = 3\nsink = token"),
    "bias": ("fox", "bias = -0.5 * slopes(heads) * distance\ntemperature = 2.5"),
    "bidirectional": ("rope_2d", "mask = bidirectional\ntemperature = 2.5"),
    "flex": ("t5_bias", "window = 3\nsink = token\nmask = prefix(4)"),
}
# the kernels compiled with other options: FlexAttention has no backward on CPU, so its forward alone
OPTIONS = {"flex": dict(backend="flex", requires_grad=False)}


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("kernel", sorted(REACH))
def test_each_declared_kernel_runs_and_matches(kernel, ran):
    """Every kernel of the registry (but the C++ band kernel, built only where the kernels are, and the
    half-precision fused path: test_compiler_low_precision.py, and Hugging Face's rotary path: compiler_tests/hf)
    takes some call of some mode, and matches (the C++ bias kernel where the kernels are built)."""
    if kernel == "bias":
        band_kernel_or_skip()
    base, extra = REACH[kernel]
    fast, ref = compiled(base, extra, **OPTIONS.get(kernel, {}))
    assert kernel in fast.plan.kernels
    for mode in MODES:
        check(fast, ref, mode, grad=kernel not in OPTIONS)
    assert kernel in ran, (kernel, sorted(set(ran)))


def test_the_registry_names_every_kernel_this_test_reaches():
    names = {d.name for d in kernel_support.KERNELS}
    assert set(REACH) | {"band", "fused-half", "hf-rotary"} == names  # hf-rotary: compiler_tests/hf


# remapped positions (no kernel declares them) with windows small enough for L = 9 to reach the far regime
REMAPPED = (("rerope", "param reach: int = 3\nsink = logit"), ("leaky_rerope", "param reach: int = 2\nwindow = 6"),
            ("self_extend", "param neighbours: int = 3\nparam group: int = 2\nsoftcap = 3.0"),
            ("dca", "param chunk_size: int = 4\nparam local_window: int = 1\nwindow = 7"))


@pytest.mark.parametrize("base, extra", REMAPPED, ids=[b for b, _ in REMAPPED])
def test_remapped_positions_run_every_mode_on_the_general_path(base, extra, ran):
    fast, ref = compiled(base, extra)
    assert fast.plan.kernels == ()
    for mode in MODES:
        check(fast, ref, mode)


def _widened(monkeypatch, name: str, *features: str) -> None:
    decls = tuple(d._replace(takes=d.takes | set(features)) if d.name == name else d for d in kernel_support.KERNELS)
    monkeypatch.setattr(kernel_support, "KERNELS", decls)


@pytest.mark.parametrize("kernel, base, extra, mode", [
    ("distance", "t5_bias", "softcap = 0.5", "fresh"), ("decode", "alibi", "", "decode"),
    ("flash-window", "rope", "window = 3\nsink = logit", "fresh"),
    ("causal-sdpa", "rope_sigmoid", "", "fresh"), ("causal-sdpa", "rope_softmax1", "", "fresh"),
    ("causal-sdpa", "rerope", "param reach: int = 3", "fresh"), ("causal-sdpa", "rope_id", "mask = prefix(4)", "fresh"),
    ("flex", "stick_breaking", "", "fresh"), ("flex", "rope_sigmoid", "", "padded"),
], ids=["distance+softcap", "decode+bias", "window+sink", "sdpa+sigmoid", "sdpa+softmax1", "sdpa+remap", "causal+prefix",
        "flex+stick-breaking", "flex+sigmoid"])
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_a_widened_declaration_is_caught(kernel, base, extra, mode, monkeypatch, ran):
    """A declaration widened to claim every feature of a scheme whose soft cap (the Toeplitz kernel), bias
    (the decode step), sink (the banded kernel) or normaliser (SDPA: softmax only) the kernel does not compute: the kernel now runs the
    call, and the comparison with the reference fails."""
    options = OPTIONS.get(kernel, {})
    before = compiled(base, extra, **options)  # the flex backend asked for: refused (E406) before the widening
    assert (before is None) == (kernel in OPTIONS)
    plan = (before or compiled(base, extra))[0].plan
    assert kernel not in plan.kernels
    _widened(monkeypatch, kernel, *kernel_support.plan_features(plan), kernel_support.backend_feature("flex"),
             kernel_support.carrier_feature("score_mod"))
    fast, ref = compiled(base, extra, **options)
    assert kernel in fast.plan.kernels
    with pytest.raises(AssertionError):
        check(fast, ref, mode, grad=kernel not in OPTIONS)
    assert kernel in ran

"""The FlexAttention lowering (:mod:`pedsl.compiler.flex_lowering`) against the reference interpreter.

Every library scheme is either lowered - compiled with ``backend = "flex"``, its output equal to the naive
float64 interpreter's in every call mode the lowering declares (fresh, grouped key/value heads, left padding,
packed documents, given positions, a per-head attention mask, span ids) - or refused with a reason
(E406 for a feature no score_mod computes, E402 for PaTH's Householder steps, which keep their own kernel).

Forward only, and without a GPU: torch runs FlexAttention's forward on CPU, but has no CPU backward for it
(the lowering's call check sends a CPU call that needs gradients to the general forward, tested below). The
checks here call FlexAttention eagerly - the same semantics as the compiled kernel with the scores
materialised - so that each takes milliseconds; ``test_compiler_torch_compile.py`` runs the compiled kernel
once (a compile takes a minute or two on two cores). No CUDA run has happened: the GPU's kernels are
torch's, and what is tested here is what pedsl hands them (score_mod, mask_mod, block mask, sink column).
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention

from compiler_helpers import D_MODEL, axis_positions, fast_and_reference, float32_bound, library
from pedsl.compiler import compile_scheme, flex_lowering, stream
from pedsl.errors import CompileError

RTOL, ATOL = 1e-9, 1e-10  # float64 throughout: the lowering and the interpreter differ by rounding only
B, H, L = 2, 2, 9
# the library schemes the lowering refuses, and the feature (E406) or kernel (E402) its reason names
REFUSED = {"cope": "contextual positions", "rerope": "remapped positions", "leaky_rerope": "remapped positions",
           "self_extend": "remapped positions", "dca": "remapped positions", "rope_sigmoid": "sigmoid weights", "stick_breaking": "stick-breaking",
           "rope_differential": "differential heads", "shaw": "content-position terms",
           "transformer_xl": "content-position terms", "deberta_v2": "content-position terms",
           "liere": "transport dense-rotation", "comrope": "transport dense-rotation",
           "comrope_ap": "transport dense-rotation", "string": "transport dense-rotation",
           "path": "Householder", "path_fox": "Householder", "path_fox_fla": "Householder"}
# the eager call's warning that it materialises the scores: what these checks want
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
# the call modes the lowering declares, three calls: "rows" a plain sequence in row 0 and, in row 1, two packed
# documents after three tokens of left padding; "gqa_mask" one key/value head and a per-head mask of the
# caller's; "positions" given positions (rows starting apart, or a grid between texts for several axes). The
# library walk takes "rows" (and "positions" for a scheme with several axes), to stay fast.
MODES = ("rows", "gqa_mask", "positions")


@pytest.fixture
def eager_flex(monkeypatch) -> list[int]:
    """FlexAttention called eagerly; the list of the calls the lowering made."""
    calls: list[int] = []

    def kernel(device):
        def run(*args, **kwargs):
            calls.append(1)
            return flex_attention(*args, **kwargs)
        return run

    monkeypatch.setattr(flex_lowering, "flex_kernel", kernel)
    return calls


def _head_dim(name: str) -> int:
    return 32 if name == "longrope" else 16  # LongRoPE lists one factor per pair of a 32-wide head


def _pair(name: str, extra: str = ""):
    """(flex module, reference module) in float64 with the same perturbed parameters."""
    return fast_and_reference(name, extra, H, _head_dim(name), backend="flex", requires_grad=False)


def _call(mod, mode: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    D = mod.head_dim
    q = torch.randn(B, H, L, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, 1 if mode == "gqa_mask" else H, L, D, generator=g, dtype=torch.float64) for _ in range(2))
    kw: dict = dict(x=torch.randn(B, L, D_MODEL, generator=g, dtype=torch.float64) if mod.needs_x else None,
                    tokens=torch.randint(0, 256, (B, L), generator=g) if mod.needs_tokens else None)
    if mod.plan.mask == "spans":
        kw["span_ids"] = torch.tensor([[1, 1, 1, 0, 0, 2, 2, 0, 0], [0, 2, 2, 0, 0, 0, 3, 3, 3]])
    if mode == "rows":
        kw["attn_mask"] = torch.arange(L)[None].expand(B, L) >= torch.tensor([[0], [3]])
        kw["document_ids"] = torch.tensor([[0] * 9, [0] * 5 + [1] * 4])
    elif mode == "positions":  # the second row starting late; several axes: a grid between texts
        kw["positions"] = axis_positions(mod, B, L, seed)
        if kw["positions"] is None:
            kw["positions"] = torch.arange(L)[None] + torch.tensor([[0], [7]])
    elif mode == "gqa_mask":  # a caller's own mask per head, the diagonal kept
        m = torch.rand(B, H, L, L, generator=g) < 0.7
        kw["attn_mask"] = m | torch.eye(L, dtype=torch.bool)
    with torch.no_grad():
        return mod(q, k, v, **kw)


def _check(fast, ref, modes=MODES) -> None:
    for mode in modes:
        torch.testing.assert_close(_call(fast, mode), _call(ref, mode), rtol=RTOL, atol=ATOL, msg=lambda m: f"{mode}: {m}")


@pytest.mark.parametrize("path", library(), ids=lambda p: p.stem)
def test_every_library_scheme_is_lowered_and_equal_or_refused(path, eager_flex):
    name = path.stem
    try:
        fast, ref = _pair(name)
    except CompileError as exc:
        assert name in REFUSED, f"{name} refused: {exc}"
        assert exc.code in ("E402", "E406") and REFUSED[name] in str(exc), str(exc)
        return
    assert name not in REFUSED, f"{name} was expected to be refused ({REFUSED.get(name)})"
    assert fast.plan.backend == "flex" and "flex" in fast.plan.kernels
    modes = ("rows", "positions") if len(fast.scheme.axes) > 1 else ("rows",)
    _check(fast, ref, modes)
    assert len(eager_flex) == len(modes)  # every call ran on the lowering


@pytest.mark.parametrize("name, extra", [
    ("t5_bias", "window = 3\nsoftcap = 0.5\nsink = logit"),
    ("alibi", "chunk = 4\nsink = token\ntemperature = log_length(4)"),
    ("fox", "softcap = 3.0\nnormalize = softmax1\nwindow = 6"),
    ("rope", "mask = spans\nwindow = 3\nbias = -0.5 * slopes(heads) * distance"),
    ("rope_id", "mask = prefix(4)\nbias = table(bucket(distance, buckets = 8, max_distance = 16), to = head)"),
    ("fire", "mask = bidirectional\nsink = logit\nsoftcap = 1.0e4"),
    ("alibi_2d", "chunk = 4\nsoftcap = 0.5"), ("alibi", "bias = -40.0 * slopes(heads) * distance\nwindow = 6"),
], ids=["t5+window+cap+sink", "alibi+chunk+token", "fox+cap+softmax1", "spans+window+alibi", "prefix+t5",
        "fire+bidirectional", "2d+chunk+cap", "steep+window"])
def test_statements_combined_are_lowered_and_equal(name, extra, eager_flex):
    """Windows, chunks, soft caps, sinks, masks and biases stacked on library schemes (extreme values among
    them: biases 40 times ALiBi's, a soft cap of 0.5 and of 1e4)."""
    fast, ref = _pair(name, extra)
    assert "flex" in fast.plan.kernels
    _check(fast, ref)
    assert eager_flex


def test_calls_it_does_not_declare_take_the_general_path(eager_flex):
    """A cached prefill and decoding, and a CPU call that needs gradients (torch has no CPU backward for
    FlexAttention), run the general forward of the same plan: equal to the reference, forward and backward."""
    fast, ref = _pair("t5_bias", "window = 3\nsink = logit")
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, H, L, 16, generator=g, dtype=torch.float64) for _ in range(3))
    outs = {}
    for name, mod in (("flex", fast), ("ref", ref)):
        cache = mod.new_cache(1)
        with torch.no_grad():
            outs[name] = torch.cat([mod(q[:, :, :5], k[:, :, :5], v[:, :, :5], cache=cache)]
                                   + [mod(q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1], cache=cache)
                                      for i in range(5, L)], dim=2)
    assert not eager_flex
    torch.testing.assert_close(outs["flex"], outs["ref"], rtol=RTOL, atol=ATOL)
    grads = []
    for mod in (fast, ref):
        qg = q.clone().requires_grad_()
        mod(qg, k, v).square().sum().backward()
        grads.append(qg.grad)
    assert not eager_flex
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-8, atol=1e-9)


def test_float32_within_a_derived_bound(eager_flex):
    """float32 through the lowering against the float64 interpreter, within ``float32_bound`` (the keys of
    the softmax and of its weighted sum, plus the channels of a score), with a bias reaching -40 per token."""

    fast, ref = _pair("alibi", "bias = -40.0 * slopes(heads) * distance\nsoftcap = 3.0\nsink = logit")
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(B, H, 64, 16, generator=g, dtype=torch.float64) for _ in range(3))
    with torch.no_grad():
        want = ref(q, k, v)
        got = fast.float()(q.float(), k.float(), v.float())
    assert eager_flex
    assert (got.double() - want).abs().max().item() <= float32_bound(2 * 64 + 16, want)


def test_forced_flex_refusal_names_the_feature():
    with pytest.raises(CompileError, match="stick-breaking") as info:
        compile_scheme(library()[0].parent / "stick_breaking.pe", backend="flex", requires_grad=False)
    assert info.value.code == "E406" and info.value.hint


def test_cuda_chooses_flex_for_a_score_pipeline_and_sdpa_for_rotations_alone():
    """On CUDA the capability registry makes Flex the engine where the plan has more than causal SDPA computes
    (the plan only: nothing runs on a GPU here)."""
    from pedsl.compiler import compile_plan
    from pedsl.lang.api import load

    def backend(name: str, **kw) -> str:
        return compile_plan(load(library()[0].parent / f"{name}.pe"), device="cuda", **kw).backend

    assert backend("alibi") == backend("rope_local") == backend("rope_sink") == backend("prefix_lm") == "flex"
    assert backend("rope") == "sdpa" and backend("path") == "blockwise" and backend("stick_breaking") == "sdpa"
    assert stream.flex_call is flex_lowering.flex_call  # the call check the executor asks


def test_a_cpu_without_compiled_flex_takes_the_general_path(monkeypatch):
    """Compiled FlexAttention on CPU needs AVX2 (torch's own check): where it cannot run (here:
    ATEN_CPU_CAPABILITY=default, read per call) and in float64 on CPU, a fresh call of a flex plan runs the
    general forward, equal to the reference; the compiled kernel is never asked."""
    def compiled(*a, **kw):
        raise AssertionError("the compiled kernel was asked")

    monkeypatch.setattr(flex_lowering, "compiled_flex", lambda: compiled)
    monkeypatch.setattr(flex_lowering, "flex_kernel", lambda device: compiled)
    fast, ref = _pair("t5_bias", "window = 3")
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, H, L, 16, generator=g, dtype=torch.float64) for _ in range(3))
    with torch.no_grad():
        torch.testing.assert_close(fast(q, k, v), ref(q, k, v), rtol=RTOL, atol=ATOL)  # float64
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
        q32, k32, v32 = q.float(), k.float(), v.float()
        assert not flex_lowering.compiled_flex_runs_on(q.device)
        got = fast.float()(q32, k32, v32)
        want = ref(q, k, v)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=float32_bound(2 * L + 16, want))

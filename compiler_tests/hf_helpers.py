"""The native Hugging Face model with its positional encoding computed in float64: the reference that pedsl's
adapter is held to, and the measure of how far the native model itself is from it.

transformers computes rotary phases in float32 even in a float64 model (``inv_freq`` built with
``dtype=torch.float``, then ``position_ids.float() * inv_freq.float()``), and some models tune or rotate in
float32 inside attention (Llama 4). How far that moves the logits depends on the positions, the base and the
weights, so a fixed tolerance covering it (the 1e-5 these tests had) is a number one machine printed. Instead
:func:`float64_native` rebuilds those modules with every float32 they ask for made float64, and
:func:`assert_matches_native` holds pedsl to that model within float64 rounding, and to the native model
within the floor its float32 phases cost, measured in the same run. Everything else (HF's RMSNorm, which
computes in float32 too) is the same module on both sides."""

from __future__ import annotations

import copy
import math

import torch
from torch.overrides import TorchFunctionMode

from compiler_helpers import F32_EPS, F64_EPS

from tools.hf_sweep import depth  # noqa: F401 - the chain of roundings in a decoder's logits, shared


class Float64Casts(TorchFunctionMode):
    """Inside it every float32 a torch call asks for (``.float()``, ``dtype=torch.float``, ``.to(torch.float32)``)
    is float64, and so is the default dtype (an integer tensor times a Python float: dynamic NTK's length)."""

    def __enter__(self):
        self._default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        return super().__enter__()

    def __exit__(self, *exc):
        torch.set_default_dtype(self._default)
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.float:
            return args[0].to(torch.float64)
        if kwargs.get("dtype") is torch.float32:
            kwargs["dtype"] = torch.float64
        args = tuple(torch.float64 if a is torch.float32 else a for a in args)
        return func(*args, **kwargs)


# HF's float32 steps in a float64 model beyond its rotary tables, by the suffix of their modules' class names:
# Llama 4's attention casts q and k to float32 to rotate them and its NoPE temperature's positions, an eager
# attention takes its softmax in float32 (Gemma 2), and RMSNorms compute in float32 (Llama, Gemma).
FLOAT32_STEPS = ("Attention", "RMSNorm")


def _in_float64(module: torch.nn.Module) -> None:
    forward = module.forward

    def run(*args, **kwargs):
        with Float64Casts():
            return forward(*args, **kwargs)

    module.forward = run


def float64_native(native, also: tuple[str, ...] = ()):
    """A copy of ``native`` whose rotary embeddings (rebuilt from their config, so ``inv_freq`` is computed in
    float64) and the modules whose class name ends with one of ``also`` compute in float64 throughout."""
    exact = copy.deepcopy(native)
    for name, module in list(exact.named_modules()):
        kind = type(module).__name__
        # a rotary built from a size, not a config (a vision tower's), stays: the same module on every side
        if kind.endswith("RotaryEmbedding") and getattr(module, "config", None) is not None:
            with Float64Casts():
                fresh = type(module)(module.config)
            fresh = fresh.to(torch.float64)
            parent = exact.get_submodule(name.rpartition(".")[0])
            setattr(parent, name.rpartition(".")[2], fresh)
            _in_float64(fresh)
        elif also and kind.endswith(also):
            _in_float64(module)
    return exact


def inv_freq_rounding(base: float) -> float:
    """How far HF's float32 ``inv_freq = 1 / base ** (i / dim)`` (then scaled: linear, yarn, llama3, longrope)
    can be from the exact value, relative: the exponent's rounding u, amplified by ln(base) through the power,
    the power's own error (torch's float32 pow is within 1 ulp, 2u), the reciprocal's and up to four scaling
    operations' u each; u = eps32 / 2. Doubled for margin: (ln(base) + 8) eps32."""
    return (math.log(base) + 8) * F32_EPS


def float32_table_rounding(max_phase: float, base: float, scale: float = 1.0) -> float:
    """How far a cos/sin table HF builds from float32 phases can be from the exact one: each phase off by
    (inv_freq_rounding + eps32) |phase| (its frequency's rounding and the product's), cos/sin and the
    attention scale adding a rounding each; ``max_phase`` the largest |position * inv_freq|."""
    return scale * (max_phase * (inv_freq_rounding(base) + F32_EPS) + 2 * F32_EPS)


def rounding(n: int, ref: torch.Tensor, float32_output: bool = False) -> float:
    """n * eps64 * max|ref|, float64's rounding of a result whose longest chain of roundings is ``n`` deep (as
    compiler_helpers.float32_bound, for float64); plus eps32 * max|ref| when the outputs compared were cast to
    float32 (``generate`` hands its logits back in float32: one correctly rounded cast per side, u |x| each)."""
    m = float(ref.detach().abs().max())
    return n * F64_EPS * m + (F32_EPS * m if float32_output else 0.0)


def assert_matches_native(got, native, exact, n: int) -> float:
    """``got`` (through pedsl) against ``exact`` (:func:`float64_native`'s output) within float64's rounding of
    an ``n``-deep chain (:func:`rounding`), and so, by the triangle inequality, against ``native`` (HF's float32
    phases) within the floor ``max|native - exact|`` those phases cost here, plus that rounding. Returns the
    floor."""
    f32 = torch.float32 in (got.dtype, native.dtype, exact.dtype)
    got, native, exact = (t.detach().to(torch.float64) for t in (got, native, exact))
    bound = rounding(n, exact, f32)
    err = float((got - exact).abs().max())
    floor = float((native - exact).abs().max())
    assert err <= bound, f"pedsl vs the float64 native model: {err:.3g} > {bound:.3g}"
    assert float((got - native).abs().max()) <= floor + bound, (floor, bound)
    return floor


def scaled_float64(model):
    """A tiny random model in float64, eval mode, its matrices times 4: scores large enough that the positional
    encoding moves the outputs well past float64's rounding."""
    model = model.to(torch.float64).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4)
    return model

"""Helpers shared by the tests: the repository's paths and the scheme library, the CLI runners,
random inputs and the differential comparison of the compiler tests."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from pedsl.compiler import compile_scheme

ROOT = Path(__file__).resolve().parents[1]
SCHEMES = ROOT / "schemes"
D_MODEL = 24


def fast_and_reference(base: str, extra: str, heads: int, head_dim: int, **kw):
    """The library scheme ``base`` plus the statements ``extra``, compiled for the fast backends (``kw``) and
    for the reference, in float64, with the same parameters perturbed from their initial values (so that
    sinks, gates and learned values are not at their starting points)."""
    src = f'import "{SCHEMES / (base + ".pe")}"\nscheme s extends {base} {{\n{extra}\n}}'
    fast = compile_scheme(src, num_heads=heads, head_dim=head_dim, d_model=D_MODEL, **kw)
    ref = compile_scheme(src, num_heads=heads, head_dim=head_dim, d_model=D_MODEL, backend="reference")
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in fast.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    ref.load_state_dict(fast.state_dict())
    return fast.double(), ref.double()


def library() -> list[Path]:
    """The library's scheme files, sorted."""
    return sorted(SCHEMES.glob("*.pe"))


F32_EPS = torch.finfo(torch.float32).eps  # 2**-23, twice float32's unit roundoff


def float32_bound(n: int, ref: torch.Tensor) -> float:
    """The most float32 rounding can move a result whose longest chain of roundings is ``n`` deep (a reduction
    over n terms: for attention the L keys of the softmax and of its weighted sum, plus the D channels of a
    score), at the magnitude of its float64 value ``ref``: n * eps32 * max|ref|. A sum of n terms errs by at
    most gamma_n ~ n u times their magnitude for every summation order (blocked, pairwise, vectorised, with
    FMA or without: Higham, Accuracy and Stability of Numerical Algorithms, section 4.2), so the bound holds on
    every CPU, unlike a multiple of what one CPU printed; rounding errors add up like a random walk, so real
    kernels stay far below it (~sqrt(n) u), while a kernel's mistake (a wrong index, a dropped or doubled term)
    errs by a fraction of max|ref|."""
    return n * F32_EPS * float(ref.detach().abs().max())


F64_EPS = torch.finfo(torch.float64).eps


def float64_bound(n: int, ref: torch.Tensor) -> float:
    """float32_bound for float64: n * eps64 * max|ref|, for results that two computations reach in float64 by
    different orders (a cache against a full forward, a prefix against the whole sequence)."""
    return n * F64_EPS * float(ref.detach().abs().max())


def module_from_text(text: str, tmp: Path, backend: str = "auto", heads: int = 4, hd: int = 8):
    """A float64 module compiled from the scheme ``text`` (written to ``tmp / "s.pe"``)."""
    f = tmp / "s.pe"
    f.write_text(text)
    return compile_scheme(f, backend=backend, num_heads=heads, d_model=D_MODEL, head_dim=hd).double()


def rnd(*shape, seed=0, dtype=torch.float64):
    """A seeded standard-normal tensor (drawn in float64, then cast)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def run_cli(*args, input: str | bytes | None = None) -> tuple[int, str, str]:
    """Run `pedsl ARGS` in-process through the real entry point; (exit code, stdout, stderr).

    Asserts what every command promises: no traceback and no internal error, whatever the input.
    """
    from click.testing import CliRunner

    from pedsl.cli import main

    runner = CliRunner()
    with runner.isolation(input=input) as streams:
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out, err = streams[0].getvalue().decode(), streams[1].getvalue().decode()
    assert "Traceback" not in out + err
    assert "internal error" not in out + err
    return code, out, err


def inputs(mod, B=2, L=7, dtype=torch.float64, grad=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    H, D = mod.heads, mod.head_dim
    q, k, v = (torch.randn(B, H, L, D, generator=g, dtype=dtype).requires_grad_(grad) for _ in range(3))
    x = torch.randn(B, L, D_MODEL, generator=g, dtype=dtype) if mod.needs_x else None
    tokens = torch.randint(0, 256, (B, L), generator=g) if mod.needs_tokens else None
    return q, k, v, x, tokens


def axis_positions(mod, B: int, L: int, seed: int = 0):
    """Positions (A, B, L) for a scheme with A > 1 position axes, None for one axis: each row a text
    prefix, then a grid of ~sqrt(L) columns starting after it (per axis t = frame, h = row, w = column,
    as Qwen2-VL lays out an image; 2 axes: (row, column)), then text again continuing at the largest
    position + 1 - so positions go back along an axis, and the axes differ."""
    axes = mod.scheme.axes
    if len(axes) < 2:
        return None
    g = torch.Generator().manual_seed(seed)
    out = torch.zeros(len(axes), B, L, dtype=torch.long)
    for b in range(B):
        start = int(torch.randint(0, max(1, L // 3), (1,), generator=g))
        width = max(1, int(L ** 0.5))
        cells = int(torch.randint(1, L - start + 1, (1,), generator=g))
        pos = torch.zeros(len(axes), L, dtype=torch.long)
        pos[:, :start] = torch.arange(start)
        idx = torch.arange(cells)
        grid = [idx // width, idx % width] if len(axes) == 2 else [idx // (width * width), idx // width % width,
                                                                     idx % width]
        for a in range(len(axes)):
            pos[a, start:start + cells] = start + (grid[a] if a < len(grid) else 0)
        after = int(pos[:, :start + cells].max()) + 1
        pos[:, start + cells:] = after + torch.arange(L - start - cells)
        out[:, b] = pos
    return out


def as_axes(mod, pos):
    """One-axis positions (B, L) in the form the scheme takes: unchanged for one axis, else (A, B, L) with
    axis 0 = pos and the others moving differently (going back and forth), as an image's rows and columns."""
    A = len(mod.scheme.axes)
    if A < 2:
        return pos
    idx = torch.arange(pos.shape[-1])
    return torch.stack([pos] + [(pos + a * idx) % (3 + a) for a in range(1, A)])


def packed_padded_call():
    """q (3, 4, 9, 8) and k, v (3, 2, 9, 8) in float64 with gradients (grouped key/value heads), and a call's
    keywords: row 0 one document at positions 3.., row 1 three packed documents, row 2 left-padded by three
    tokens with repeated positions under the padding."""
    B, L = 3, 9
    docs = torch.tensor([[0] * 9, [0, 0, 0, 1, 1, 1, 1, 2, 2], [5] * 9])
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[2, :3] = False
    pos = torch.tensor([list(range(3, 12)), [0, 1, 2, 0, 1, 2, 3, 0, 1], [0, 0, 0] + list(range(6))])
    q = rnd(B, 4, L, 8, seed=1).requires_grad_()
    k, v = (rnd(B, 2, L, 8, seed=s).requires_grad_() for s in (2, 3))
    return q, k, v, dict(positions=pos, document_ids=docs, attn_mask=mask)


def assert_packed_padded_call_matches(m, ref):
    """``m`` and ``ref`` agree on :func:`packed_padded_call`, output and the gradients w.r.t. q, k and v (float64
    rounding apart); the padded queries give zeros (no key). Returns m's output."""
    q, k, v, kw = packed_padded_call()
    want, got = ref(q, k, v, **kw), m(q, k, v, **kw)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)
    wgt = rnd(*want.shape, seed=4)
    for a, b in zip(torch.autograd.grad((got * wgt).sum(), (q, k, v)),
                    torch.autograd.grad((want * wgt).sum(), (q, k, v))):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9)
    assert want[2, :, :3].abs().max() == 0
    return got.detach()


def forward_and_grads(mod, q, k, v, x, tokens, positions=None):
    """Output and gradients of a fixed random functional w.r.t. q, k, v and every learned parameter."""
    return output_and_grads(mod, q, k, v, x=x, tokens=tokens, positions=positions)


def output_and_grads(mod, q, k, v, seed: int = 1, **kw):
    """``mod(q, k, v, **kw)`` and the gradients of a fixed random functional of it (weights seeded ``seed``)
    w.r.t. q, k, v and every learned parameter (zeros where one does not enter)."""
    out = mod(q, k, v, **kw)
    # drawn in float64 and cast: a float32 run and its float64 reference are weighted by the same numbers
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    weight = weight.to(out.dtype)
    params = list(mod.parameters())
    grads = torch.autograd.grad((out * weight).sum(), [q, k, v, *params], allow_unused=True)
    return out.detach(), [g if g is not None else torch.zeros_like(t) for g, t in zip(grads, [q, k, v, *params])]


def run_capped(args: list[str], *, timeout: float = 60, mem_gb: float = 2.0, cwd=None,
               stdin: bytes | None = None) -> tuple[int, str]:
    """Run ``python ARGS`` in a subprocess with an address-space cap (RLIMIT_AS) and a timeout;
    (exit code, stdout + stderr). A hang raises subprocess.TimeoutExpired; memory over the cap
    shows as a MemoryError inside (exit 3 from the CLI, or a traceback)."""
    import os
    import resource
    import subprocess
    import sys

    def cap() -> None:
        limit = int(mem_gb * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    env.pop("PEDSL_DEBUG", None)
    proc = subprocess.run([sys.executable, *args], capture_output=True, timeout=timeout, preexec_fn=cap,
                          cwd=cwd, env=env, input=stdin)
    return proc.returncode, proc.stdout.decode(errors="replace") + proc.stderr.decode(errors="replace")


def first_error(text: str, params=None):
    """The first error diagnostic of checking ``text`` (it must have one)."""
    from pedsl.errors import PedslError
    from pedsl.lang.api import check

    try:
        diags = check(text, params)
    except PedslError as err:
        diags = err.diagnostics
    errors = [d for d in diags if d.severity == "error"]
    assert errors, [d.render() for d in diags]
    return errors[0]


def assert_generated_module_matches(mod, src: str, path: Path, lengths=(3, 40)) -> None:
    """The module generated as ``src`` (written to ``path`` and imported) equals the in-process ``mod``, with
    the same learned weights, in float64 at each length."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"gen_{path.stem}", path)
    path.write_text(src)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    gen = module.Module()
    gen.load_state_dict(mod.state_dict())  # same learned sub-module names
    mod.double()
    gen.double()
    for L in lengths:
        q, k, v, x, tok = inputs(mod, L=L, grad=False, seed=L)
        pos = axis_positions(mod, q.shape[0], L, seed=L)
        torch.testing.assert_close(gen(q, k, v, x=x, tokens=tok, positions=pos),
                                   mod(q, k, v, x=x, tokens=tok, positions=pos), rtol=1e-9, atol=1e-10)


def patch_save_figure(mp, fake) -> None:
    """Replace ``pedsl.study.plots.save_figure`` wherever a module bound it (``from ... import
    save_figure``). Every study module is imported first: a module imported for the first time while
    the patch is on would keep the fake for the rest of the process, and a later test in the same
    worker would then write no figures."""
    import importlib
    import pkgutil

    import pedsl.study
    from pedsl.study import plots

    for info in pkgutil.walk_packages(pedsl.study.__path__, "pedsl.study."):
        importlib.import_module(info.name)
    real = plots.save_figure
    for name, module in list(sys.modules.items()):
        if name.startswith("pedsl.") and getattr(module, "save_figure", None) is real:
            mp.setattr(module, "save_figure", fake)


def without_keys(tree, keys: set[str]):
    """``tree`` (JSON-like) with every dict entry named in ``keys`` removed, at every depth: results
    compared without their wall-clock times and paths."""
    if isinstance(tree, dict):
        return {k: without_keys(v, keys) for k, v in tree.items() if k not in keys}
    if isinstance(tree, list):
        return [without_keys(v, keys) for v in tree]
    return tree


def forbid_single_token_layout(monkeypatch) -> None:
    """Make the general path's layout fail for one-token calls: a decoding step that gets through took
    the fast path of ``pedsl.compiler.stream.decode_step``."""
    from pedsl.compiler import stream

    real = stream.layout

    def no_single_token_layout(heads, B, L, *a, **kw):
        assert L != 1, "a one-token decoding call went through the general layout"
        return real(heads, B, L, *a, **kw)

    monkeypatch.setattr(stream, "layout", no_single_token_layout)


def largest_allocation(fn) -> int:
    """The bytes of the largest storage any torch op allocates while ``fn()`` runs (forward and backward
    alike; views of an existing tensor count as its storage, which was allocated before)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    sizes = [0]

    class Storage(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    sizes.append(t.untyped_storage().nbytes())
            return out

    with Storage():
        fn()
    return max(sizes)


def naive_band(q, k, v, window=None, chunk=None):
    """Causal softmax attention over an explicit (L, L) band (``window``: query i sees keys i - window + 1
    .. i; ``chunk``: keys of its own chunk), float64, grouped key/value heads repeated, default scale."""
    L, group = q.shape[2], q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(group, dim=1) for t in (k, v))
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    ok = j <= i
    if window is not None:
        ok = ok & (i - j < window)
    if chunk is not None:
        ok = ok & (i // chunk == j // chunk)
    s = (q.double() @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    return torch.softmax(s.masked_fill(~ok, float("-inf")), -1) @ v


def band_kernel_or_skip():
    """The C++ sliding-window kernel's ops; a failure where a C++ compiler and ninja are present (the kernel
    should have built), a skip only where they are not (or ``PEDSL_CPU_KERNELS=0``)."""
    import os
    import shutil

    import pytest
    from torch.utils.cpp_extension import is_ninja_available

    from pedsl.envswitch import switch
    from pedsl.ops import band_kernel, cpu_kernels

    ops = band_kernel.band_ops()
    if ops is None:
        toolchain = shutil.which(os.environ.get("CXX", "c++")) and is_ninja_available()
        if toolchain and switch(cpu_kernels.SWITCH):
            pytest.fail("a C++ compiler and ninja are present but the sliding-window kernel did not build: "
                        f"{cpu_kernels.state().reason}")
        pytest.skip("no C++ compiler or ninja: the sliding-window kernel cannot be built here")
    return ops


def spy_band_ops(monkeypatch) -> list[str]:
    """Record the name of each call of the C++ sliding-window kernel's ops (``forward``, ``backward``)."""
    from pedsl.ops import band_kernel

    ops, seen = band_kernel_or_skip(), []

    class Spy:
        def __getattr__(self, name):
            def call(*args):
                seen.append(name)
                return getattr(ops, name)(*args)
            return call

    monkeypatch.setattr(band_kernel, "band_ops", Spy)
    return seen


def flash_path_only(monkeypatch) -> None:
    """Make the general forward's sliding windows take the flash-kernel path (the C++ kernel unavailable)."""
    from pedsl.ops import band_kernel

    monkeypatch.setattr(band_kernel, "band_ops", lambda: None)


def dense_mlp_bias(q, k, v, u, w, w1, b1, w2, b2, scale=None):
    """FIRE's MLP-bias attention evaluated at every pair (the independent reference of pedsl.ops.mlp_bias and the
    C++ kernel): softmax_j<=i(scale <q_i, k_j> + b2 + W2 relu(W1 u[i - j] w[i] + b1)) v_j, scale 1 / sqrt(D)
    unless given."""
    import math

    B, H, L, D = q.shape
    scale = 1 / math.sqrt(D) if scale is None else scale
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    x = u[(i - j).clamp(min=0)] * w[:, None]  # (L, L)
    bias = (torch.relu(x[..., None] * w1 + b1) @ w2.t() + b2).permute(2, 0, 1)
    s = (q @ k.transpose(-1, -2) * scale + bias).masked_fill(j > i, float("-inf"))
    return torch.softmax(s, -1) @ v

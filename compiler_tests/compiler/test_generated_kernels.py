"""Generated modules carry pedsl's C++ kernels (pedsl/compiler/embedded.py's NATIVE_EMBEDDED and
pedsl/compiler/native_template.py): a module ``pedsl compile`` writes for FIRE, a sliding window or ALiBi runs
the C++ MLP-bias, band and in-rows kernels on a fresh sequence (never the blocks of queries or the flash path)
and equals the in-process module, forward and backward; it loads the one build pedsl makes (the same key), also
where pedsl cannot be imported; where the kernels are off or cannot be built it says so in its log and takes
the torch paths, with the same results; a build it starts writes the C++ files it carries and runs its own
file's ``builder_main``."""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys

import pytest
import torch
from compiler_helpers import D_MODEL, SCHEMES, band_kernel_or_skip, float64_bound, inputs

from pedsl.compiler import compile_scheme
from pedsl.compiler.codegen import generate
from pedsl.ops.cpu_kernels import kernel_texts

L_CALL = 160  # several blocks of each kernel (MLP: 128 queries, band: 64, in rows: 64) and of the torch paths
#: scheme: its parameters, the kernel its plan allows, the autograd function of that kernel
CASES = {"fire": ({}, "mlp", "MlpAttention"), "rope_local": ({"width": 24}, "band", "BandAttention"),
         "alibi": ({}, "bias", "BiasAttention")}


def _modules(name: str, tmp_path, tag: str = ""):
    """The in-process float64 module of ``name`` and the generated one (imported from a file, same weights),
    with the imported Python module."""
    params = CASES[name][0]
    mod = compile_scheme(SCHEMES / f"{name}.pe", params=params, d_model=D_MODEL, num_heads=4, head_dim=16).double()
    file = tmp_path / f"{name}{tag}.py"
    file.write_text(generate(mod.scheme, mod.plan, d_model=D_MODEL if mod.needs_x else None), encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"gen_kernels_{name}{tag}", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    gen = module.Module()
    gen.load_state_dict(mod.state_dict())
    return mod, gen.double(), module


def _forward_backward(m, mod):
    q, k, v, x, tok = inputs(mod, B=1, L=L_CALL, seed=5)
    o = m(q, k, v, x=x, tokens=tok)
    wgt = torch.randn(o.shape, generator=torch.Generator().manual_seed(6), dtype=o.dtype)
    return o, torch.autograd.grad((o * wgt).sum(), [q, k, v, *m.parameters()])


def _assert_same(got, want) -> None:
    """Output within float64_bound of a chain over the keys and channels; gradients over twice that chain (the
    backward reduces over the keys for dq and over the queries for dk, dv and the bias's parameters). A learned
    parameter's gradient is a sum of the same score gradients dS as dq, dk, dv (times the bias's derivative, O(1)
    here) and may cancel to about zero (the MLP's output bias: a softmax row's dS sums to zero), so its bound is
    taken at dq's, dk's and dv's magnitude."""
    (o, grads), (o_ref, grads_ref) = got, want
    n = L_CALL + 16
    assert (o - o_ref).abs().max().item() <= float64_bound(n, o_ref)
    assert len(grads) == len(grads_ref)
    qkv_scale = torch.stack([g.abs().max() for g in grads_ref[:3]])
    for i, (a, b) in enumerate(zip(grads, grads_ref)):
        bound = float64_bound(2 * n, b if i < 3 else torch.cat([b.flatten(), qkv_scale]))
        assert (a - b).abs().max().item() <= bound, (i, (a - b).abs().max().item(), bound)


def _refuse(what: str):
    def refuse(*a, **kw):
        raise AssertionError(f"the generated module took {what}, not the C++ kernel")

    return refuse


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_generated_module_runs_the_cpp_kernel_and_equals_in_process(name, tmp_path, monkeypatch):
    band_kernel_or_skip()
    mod, gen, module = _modules(name, tmp_path)
    _, fast, function = CASES[name]
    assert fast in mod.plan.kernels
    if fast == "mlp":  # a window and the in-rows biases run inside attend_blocks (its band call, rows_attend)
        monkeypatch.setattr(module, "attend_blocks", _refuse("the blocks of queries"))
    monkeypatch.setattr(module, "scored_rows", _refuse("the explicit scores"))
    monkeypatch.setattr(module, "banded_attention", _refuse("the flash path"))
    calls = []
    kernel = getattr(module, function)
    real = kernel.apply
    monkeypatch.setattr(kernel, "apply", lambda *a: calls.append(1) or real(*a))
    _assert_same(_forward_backward(gen, mod), _forward_backward(mod, mod))
    assert calls
    st = module.state()
    assert st.loaded and st.folder.name == module.extension_name()
    from pedsl.ops import cpu_kernels

    assert module.build_key() == cpu_kernels.build_key()  # one build for pedsl and its generated modules


@pytest.mark.parametrize("case", ["off", "no compiler"])
def test_without_the_kernels_a_generated_module_logs_why_and_takes_the_torch_paths(case, tmp_path, monkeypatch,
                                                                                     caplog):
    if case == "off":
        monkeypatch.setenv("PEDSL_CPU_KERNELS", "0")
    else:
        monkeypatch.delenv("PEDSL_CPU_KERNELS", raising=False)
        monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
        monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    mod, gen, module = _modules("fire", tmp_path, tag="_" + case.replace(" ", "_"))
    monkeypatch.setattr(module, "run_build", _refuse("a build"))
    blocks = []
    real = module.attend_blocks
    monkeypatch.setattr(module, "attend_blocks", lambda *a, **kw: blocks.append(1) or real(*a, **kw))
    caplog.set_level(logging.DEBUG, logger=module.log.name)
    got = _forward_backward(gen, mod)
    st = module.state()
    why = "PEDSL_CPU_KERNELS is off" if case == "off" else "no C++ compiler"
    assert not st.loaded and st.reason == why and blocks
    lines = [r for r in caplog.records if r.name == module.log.name]
    assert [r.levelno for r in lines] == [logging.INFO if case == "off" else logging.WARNING]
    assert why in lines[0].getMessage() and "the torch paths run" in lines[0].getMessage()
    monkeypatch.undo()
    _assert_same(got, _forward_backward(mod, mod))


def test_a_build_started_by_a_generated_module_writes_its_sources_and_runs_its_own_builder(tmp_path, monkeypatch):
    """No compiler runs here (the build itself is the in-process build's, tested in test_kernel_cache.py): the
    spec names the carried C++ files, written into the build folder byte for byte as pedsl holds them, and the
    child process imports the module's own file and runs its ``builder_main``."""
    monkeypatch.delenv("PEDSL_CPU_KERNELS", raising=False)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    _, _, module = _modules("fire", tmp_path, tag="_build")
    monkeypatch.setattr(module.shutil, "which", lambda name: f"/usr/bin/{name}")  # a toolchain, never run
    seen = []
    monkeypatch.setattr(module, "run_build", lambda spec, fd, timeout, command, env: seen.append((spec, command))
                        or ("stopped by the test", False))
    st = module.prepare()
    assert not st.loaded and "stopped by the test" in st.reason and len(seen) == 1
    spec, command = seen[0]
    texts = kernel_texts()
    assert sorted(p.rsplit("/", 1)[1] for p in spec["sources"]) == sorted(n for n in texts if n.endswith(".cpp"))
    for name, text in texts.items():
        assert (st.folder / "src" / name).read_text(encoding="utf-8") == text
    assert command[:2] == [sys.executable, "-c"] and command[3] == str(tmp_path / "fire_build.py")
    assert "builder_main" in command[2] and callable(module.builder_main)


def test_a_generated_module_loads_the_kernels_without_pedsl(tmp_path):
    """In a fresh interpreter where importing pedsl fails, the generated FIRE module loads the shared build and
    runs the MLP-bias kernel: its output is the in-process module's."""
    band_kernel_or_skip()
    mod, _, _ = _modules("fire", tmp_path, tag="_alone")
    q, k, v, _, _ = inputs(mod, B=1, L=L_CALL, grad=False, seed=7)
    torch.save({"q": q, "k": k, "v": v, "o": mod(q, k, v), "state": mod.state_dict()}, tmp_path / "io.pt")
    script = f"""
import sys
sys.modules['pedsl'] = None  # any import of pedsl fails
import importlib.util, torch
spec = importlib.util.spec_from_file_location('fire_alone', {str(tmp_path / 'fire_alone.py')!r})
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
def refuse(*a, **kw):
    raise AssertionError('blocks of queries')
m.attend_blocks = refuse
io = torch.load({str(tmp_path / 'io.pt')!r}, weights_only=True)
gen = m.Module().double(); gen.load_state_dict(io['state'])
o = gen(io['q'], io['k'], io['v'])
print(m.state().loaded, float((o - io['o']).abs().max()), float(io['o'].abs().max()))
"""
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr
    loaded, err, scale = res.stdout.split()
    assert loaded == "True" and float(err) <= float64_bound(L_CALL + 16, torch.tensor(float(scale)))

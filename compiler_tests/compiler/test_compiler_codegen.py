"""`pedsl compile`: the standalone module equals the in-process one; configs are valid; output is deterministic."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

from compiler_helpers import D_MODEL, SCHEMES, as_axes, assert_generated_module_matches, inputs, library
from pedsl.cli import cli
from pedsl.compiler import compile_scheme
from pedsl.errors import PedslError
from pedsl.compiler.codegen import generate
from pedsl.errors import CompileError
from pedsl.config import EvalConfig, TrainConfig
from pedsl.lang.statements import CARRIED


# pedsl compile refuses remapped positions (their regimes' positions are evaluated by pedsl's walk at run
# time, not generated): test_remapped_schemes_are_refused checks that, the other tests take the rest
REMAPPED = ("rerope", "leaky_rerope", "self_extend", "dca")
GENERATED = [p for p in library() if p.stem not in REMAPPED]


def test_remapped_schemes_are_refused():
    assert {p.stem for p in library()} - {p.stem for p in GENERATED} == set(REMAPPED)
    for name in REMAPPED:
        mod = compile_scheme(SCHEMES / f"{name}.pe", d_model=D_MODEL)
        assert mod.plan.remap is not None
        with pytest.raises(CompileError, match="does not generate yet"):
            generate(mod.scheme, mod.plan)


def _import(path, name):
    spec = importlib.util.spec_from_file_location(f"gen_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("path", GENERATED, ids=lambda p: p.stem)
def test_generated_module_matches_in_process(path, tmp_path):
    mod = compile_scheme(path, d_model=D_MODEL)
    src = generate(mod.scheme, mod.plan, d_model=D_MODEL if mod.needs_x else None)
    assert src == generate(mod.scheme, mod.plan, d_model=D_MODEL if mod.needs_x else None)  # deterministic
    assert_generated_module_matches(mod, src, tmp_path / f"{path.stem}.py")


@pytest.mark.parametrize("name", ["longrope", "dynamic_ntk"])
def test_generated_grid_that_reads_the_length_matches_past_the_original(name, tmp_path):
    """A grid whose value reads the run-time length (its record's emit): the generated module picks
    the value of that length, as the in-process module does, below and past the original length."""
    mod = compile_scheme(SCHEMES / f"{name}.pe", head_dim=32)
    file = tmp_path / f"{name}.py"
    file.write_text(generate(mod.scheme, mod.plan))
    gen = _import(file, name + "_length").Module()
    mod.double()
    gen.double()
    original = int(mod.scheme.params["original"])
    for L in (original - 8, original + 8):
        q, k, v, x, tok = inputs(mod, L=L, grad=False, seed=L)
        torch.testing.assert_close(gen(q, k, v), mod(q, k, v), rtol=1e-9, atol=1e-10)


def test_compile_command_writes_module_and_configs(tmp_path):
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["compile", str(SCHEMES / "rope_id.pe"), "-o", str(out)])
    assert res.exit_code == 0, res.output
    files = sorted(p.name for p in out.iterdir())
    assert files == ["eval.yaml", "rope_id.py", "train.yaml"]
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    res = CliRunner().invoke(cli, ["compile", str(SCHEMES / "rope_id.pe"), "-o", str(out)])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == first  # re-running gives identical files
    train = TrainConfig.from_yaml(out / "train.yaml")
    ev = EvalConfig.from_yaml(out / "eval.yaml")
    assert train.context == 128 and train.model.head_dim == 32 and train.model.n_heads == 4
    assert ev.lengths == [128, 256, 512, 1024, 2048, 4096]
    assert "sha256" in (out / "rope_id.py").read_text()


def test_generated_module_imports_with_torch_only(tmp_path):
    """Run the generated file in a fresh interpreter where importing pedsl is impossible."""
    out = tmp_path / "out"
    assert CliRunner().invoke(cli, ["compile", str(SCHEMES / "rope_id.pe"), "-o", str(out)]).exit_code == 0
    ref = compile_scheme(SCHEMES / "rope_id.pe")
    q, k, v, _, _ = inputs(ref, L=50, dtype=torch.float32, grad=False)
    torch.save({"q": q, "k": k, "v": v, "o": ref(q, k, v)}, tmp_path / "io.pt")
    script = f"""
import sys
sys.modules['pedsl'] = None  # any import of pedsl fails
import importlib.util, torch
spec = importlib.util.spec_from_file_location('rope_id', {str(out / 'rope_id.py')!r})
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
io = torch.load({str(tmp_path / 'io.pt')!r}, weights_only=True)
o = m.RopeId()(io['q'], io['k'], io['v'])
print(float((o - io['o']).abs().max()))
"""
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    assert float(res.stdout.strip()) < 1e-5


def test_compile_for_data_dependent_scheme_uses_the_model_width(tmp_path):
    out = tmp_path / "o"
    res = CliRunner().invoke(cli, ["compile", str(SCHEMES / "path.pe"), "-o", str(out)])
    assert res.exit_code == 0, res.output
    text = (out / "path.py").read_text()
    assert "D_MODEL = 128" in text  # the tiny preset's width, the same as `pedsl train` builds


def _protocol_members(proto) -> tuple[set[str], set[str]]:
    """The members a Protocol and the Protocols it extends declare: (its data, its properties and methods)."""
    data, rest = set(), set()
    for cls in proto.__mro__:
        if getattr(cls, "_is_protocol", False) and cls.__module__.startswith("pedsl"):
            data |= set(cls.__dict__.get("__annotations__", {}))
            rest |= {n for n, v in cls.__dict__.items() if not n.startswith("_") and callable(v) or isinstance(
                v, property)}
    return data, rest


def assert_same_scheme_side(gen, mod) -> None:
    """The generated class supplies every member of the general forward's SchemeSide (no checker reads its
    text), and its plan decisions are the in-process adapter's."""
    from pedsl.compiler.general.protocols import SchemeSide
    from pedsl.compiler.module_values import ModuleScheme

    side = ModuleScheme.of(mod)
    data, rest = _protocol_members(SchemeSide)
    assert {"heads", "softcap", "remap_bounds"} <= data and {"mask", "window", "query_mlp", "token_values"} <= rest
    for name in sorted(data | rest):
        assert hasattr(gen, name) and hasattr(side, name), name
    for name in sorted(data - {"transforms"} | {"mask", "mask_prefix", "window", "chunk"} | {c.name for c in CARRIED}):
        assert getattr(gen, name) == getattr(side, name), name
    assert len(gen.transforms) == len(side.transforms)


@pytest.mark.parametrize("path", GENERATED, ids=lambda p: p.stem)
def test_generated_module_general_call_and_cache_match_in_process(path, tmp_path):
    """Positions, packed documents, left padding, GQA and a prefill + decoding cache: the generated
    module equals the in-process one."""
    hd = 32 if path.stem == "longrope" else 16
    params = {"prefix": 4} if path.stem == "prefix_lm" else {}  # the prefill below holds the whole prefix
    mod = compile_scheme(path, d_model=D_MODEL, num_heads=4, head_dim=hd, params=params)
    file = tmp_path / f"{path.stem}.py"
    file.write_text(generate(mod.scheme, mod.plan, d_model=D_MODEL if mod.needs_x else None))
    gen = _import(file, path.stem + "_general").Module()
    gen.load_state_dict(mod.state_dict())
    assert_same_scheme_side(gen, mod)
    mod.double()
    gen.double()
    g = torch.Generator().manual_seed(0)
    B, L = 2, 8
    q = torch.randn(B, 4, L, hd, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, 2, L, hd, generator=g, dtype=torch.float64) for _ in range(2))
    x = torch.randn(B, L, D_MODEL, generator=g, dtype=torch.float64) if mod.needs_x else None
    tok = torch.randint(0, 256, (B, L), generator=g) if mod.needs_tokens else None
    docs = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1], [0] * 8])
    pos = as_axes(mod, torch.tensor([[4, 5, 6, 0, 1, 2, 3, 4], [0, 0, 0, 1, 2, 3, 4, 5]]))
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[1, :2] = False
    kw = dict(x=x, tokens=tok, positions=pos, document_ids=docs, attn_mask=mask)
    torch.testing.assert_close(gen(q, k, v, **kw), mod(q, k, v, **kw), rtol=1e-9, atol=1e-10)
    sl = lambda t, a, b: None if t is None else t[:, a:b]  # noqa: E731
    if mod.plan.mask == "bidirectional":  # nothing to decode: both refuse a cache
        for m in (gen, mod):
            with pytest.raises((ValueError, PedslError), match="nothing to decode"):  # InputError, ShapeError
                m.new_cache(B)
        return
    caches = gen.new_cache(B), mod.new_cache(B)
    for a, b in ((0, 5), (5, 6), (6, 8)):  # prefill, one token, a chunk
        outs = [m(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], x=sl(x, a, b), tokens=sl(tok, a, b), cache=c)
                for m, c in zip((gen, mod), caches)]
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-9, atol=1e-10)
    assert len(caches[0]) == L


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_generated_module_applies_the_temperature_in_float32_in_half_precision(dtype, tmp_path):
    """The generated module multiplies q by the temperature in float32 and rounds once, as the
    in-process module does (docs/semantics.md §8.6), so in half precision its error against float64
    is the module's; rounding tau to the half dtype first (as the generated module used to) made it
    1.7x the module's in bfloat16 and 1.3x in float16 here."""
    mod = compile_scheme(SCHEMES / "rope_id.pe", head_dim=32)
    file = tmp_path / "rope_id_half.py"
    file.write_text(generate(mod.scheme, mod.plan))
    gen = _import(file, "rope_id_half").Module()
    gen.load_state_dict(mod.state_dict())
    L = 2048
    q, k, v, _, _ = inputs(mod, L=L, grad=False, seed=3)
    mask = torch.ones(q.shape[0], L, dtype=torch.bool)  # a padding mask: the general path of both
    with torch.no_grad():
        exact = mod.double()(q.double(), k.double(), v.double(), attn_mask=mask)
        mod.float()
        half = [t.to(dtype) for t in (q, k, v)]
        err_mod = (mod(*half, attn_mask=mask).double() - exact).abs().max().item()
        err_gen = (gen(*half, attn_mask=mask).double() - exact).abs().max().item()
    assert err_gen <= 1.1 * err_mod, (err_gen, err_mod)


@pytest.mark.parametrize("name", ["t5_bias", "kerple_log", "sandwich"])
def test_generated_distance_table_module_runs_the_toeplitz_kernel_with_the_same_gradients(name, tmp_path,
                                                                                         monkeypatch):
    """A scheme with distance tables compiles to a module carrying the Toeplitz kernel: a fresh causal call
    never takes the blocks of queries, and its output and gradients (q, k, v and every learned table or
    parameter) are the in-process module's, in float64, over several blocks of the kernel."""
    mod = compile_scheme(SCHEMES / f"{name}.pe", d_model=D_MODEL, num_heads=4, head_dim=16).double()
    file = tmp_path / f"{name}.py"
    file.write_text(generate(mod.scheme, mod.plan, d_model=D_MODEL), encoding="utf-8")
    module = _import(file, name + "_toeplitz")
    gen = module.Module()
    gen.load_state_dict(mod.state_dict())
    gen.double()
    monkeypatch.setattr(module, "BLOCK", 16)  # several blocks of queries at L = 70

    def refuse(*a, **kw):
        raise AssertionError("the generated module attended by blocks of queries, not the Toeplitz kernel")

    monkeypatch.setattr(module, "attend_blocks", refuse)
    outs = []
    for m in (gen, mod):
        q, k, v, x, tok = inputs(mod, B=2, L=70, seed=3)
        o = m(q, k, v, x=x, tokens=tok)
        wgt = torch.randn(o.shape, generator=torch.Generator().manual_seed(4), dtype=o.dtype)
        outs.append((o, torch.autograd.grad((o * wgt).sum(), [q, k, v, *m.parameters()])))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-9, atol=1e-10)
    assert len(outs[0][1]) == len(outs[1][1])
    for a, b in zip(outs[0][1], outs[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9)

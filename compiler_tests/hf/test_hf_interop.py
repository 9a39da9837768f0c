"""Hugging Face interop (pedsl.hf) against transformers itself, on tiny random models built from
configs (no downloads): hidden 64, 2 layers, vocabulary 128, 4 query heads over 2 key/value heads.

For every HF rope type - default, linear, dynamic below and above the original length, yarn with
truncate on and off and with the mscale knobs, longrope below and above the original, llama3 -
and for partial rotation:

- ``import-hf`` then compile gives HF's ``inv_freq`` (float32 in HF: within its float32 rounding,
  ``(ln base + 8) eps32`` relative), its ``attention_scaling`` and its cos/sin tables (HF's float32 phases:
  within that rounding times the largest phase), and equals a float64 transcription of HF's formulas;
- a model whose attention goes through pedsl (``use_pedsl_attention``) gives the logits of the native
  model with its rotary in float64 (hf_helpers.float64_native) within float64 rounding, hence the native
  model's within the floor its float32 phases cost (measured in the same run), on a left-padded batch, and
  the same 16 greedy tokens from ``generate``;
- ``export-hf`` returns the original parameters, and import -> export -> import is a fixed point.

And a pedsl ``arch: llama`` model exported with ``export --hf`` loads in ``LlamaForCausalLM`` with
its logits.
"""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch

import pedsl
from compiler_helpers import run_cli
from hf_helpers import (assert_matches_native, depth, float32_table_rounding, float64_native, inv_freq_rounding,
                        rounding)
from pedsl.errors import InteropError
from pedsl.hf import export_rope, import_config, use_pedsl_attention

transformers = pytest.importorskip("transformers")

HEADS, KV, HEAD_DIM = 4, 2, 16
ORIG, MAX_POS = 64, 256

SHORT = [1.0, 1.0, 1.05, 1.1, 1.2, 1.3, 1.5, 1.7]
LONG = [1.0, 1.2, 1.5, 2.0, 3.0, 4.0, 5.5, 8.0]

# id -> (model family, rope_parameters, config extras, prefill lengths, greedy generate of 16 tokens checked)
CASES = {
    "default": ("llama", {"rope_type": "default", "rope_theta": 10000.0}, {}, (40,), True),
    "default_mistral": ("mistral", {"rope_type": "default", "rope_theta": 1e6}, {"sliding_window": None}, (40,), True),
    "linear": ("qwen2", {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}, {}, (40,), True),
    "dynamic_below": ("llama", {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
                      {"max_position_embeddings": ORIG}, (40,), True),
    "dynamic_above": ("llama", {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
                      {"max_position_embeddings": ORIG}, (100,), True),
    # generate crosses the original length: keys keep the table they were rotated with, as in HF
    "dynamic_cross": ("llama", {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
                      {"max_position_embeddings": ORIG}, (56,), True),
    "yarn": ("qwen2", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIG,
                       "rope_theta": 1e6}, {}, (40, 100), True),
    "yarn_no_truncate": ("llama", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIG,
                                   "truncate": False, "beta_fast": 16.0, "beta_slow": 2.0, "rope_theta": 10000.0},
                         {}, (40,), True),
    "yarn_mscale": ("llama", {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": ORIG,
                              "mscale": 1.0, "mscale_all_dim": 0.5, "rope_theta": 10000.0}, {}, (40,), True),
    "yarn_attention_factor": ("mistral", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIG,
                                          "attention_factor": 1.3, "rope_theta": 10000.0}, {"sliding_window": None},
                              (40,), True),
    "longrope_below": ("phi3", {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
                                "rope_theta": 10000.0}, {"original_max_position_embeddings": ORIG}, (40,), True),
    "longrope_above": ("phi3", {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
                                "rope_theta": 10000.0}, {"original_max_position_embeddings": ORIG}, (80,), True),
    "longrope_cross": ("phi3", {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
                                "rope_theta": 10000.0}, {"original_max_position_embeddings": ORIG}, (56,), True),
    "llama3": ("llama", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": ORIG, "rope_theta": 500000.0}, {}, (40,), True),
    # Llama 4 Scout's: equal factors, no smooth band (pairs 0-1 kept, 2-7 divided)
    "llama3_equal": ("llama", {"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
                               "original_max_position_embeddings": ORIG, "rope_theta": 500000.0}, {}, (40,), True),
    "partial": ("phi3", {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}, {}, (40,), True),
    # the attention factor on the rotated half only (HF multiplies cos and sin)
    "partial_longrope": ("phi3", {"rope_type": "longrope", "short_factor": SHORT[:4], "long_factor": LONG[:4],
                                  "partial_rotary_factor": 0.5, "rope_theta": 10000.0},
                         {"original_max_position_embeddings": ORIG}, (40, 80), True),
}


def hf_config(case: str):
    family, rp, extra, _, _ = CASES[case]
    cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
           "qwen2": transformers.Qwen2Config, "phi3": transformers.Phi3Config}[family]
    kw = dict(vocab_size=128, hidden_size=HEADS * HEAD_DIM, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=HEADS, num_key_value_heads=KV, max_position_embeddings=MAX_POS,
              rope_parameters=copy.deepcopy(rp), bos_token_id=None, eos_token_id=None, pad_token_id=0,
              attn_implementation="sdpa")
    if family == "phi3":
        kw.pop("rope_parameters")
        kw["rope_scaling"] = copy.deepcopy(rp)
        kw["partial_rotary_factor"] = rp.get("partial_rotary_factor", 1.0)
    kw.update(extra)
    return cls(**kw)


def model_for(case: str):
    family = CASES[case][0]
    cls = {"llama": transformers.LlamaForCausalLM, "mistral": transformers.MistralForCausalLM,
           "qwen2": transformers.Qwen2ForCausalLM, "phi3": transformers.Phi3ForCausalLM}[family]
    torch.manual_seed(0)
    model = cls(hf_config(case)).double().eval()
    with torch.no_grad():  # larger weights than HF's init: logits that differ across tokens and positions
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4)
    return model


# ---------------------------------------------------------------------- an independent float64 reference


def reference_inv_freq(rp: dict, head_dim: int, max_pos: int, seq_len: int, orig_top: int | None) -> tuple:
    """HF's modeling_rope_utils formulas transcribed in float64 numpy: (inv_freq, attention factor)."""
    t = rp["rope_type"]
    base = rp["rope_theta"]
    dim = int(head_dim * rp.get("partial_rotary_factor", 1.0))
    idx = np.arange(0, dim, 2, dtype=np.float64) / dim
    inv = 1.0 / base ** idx
    orig = orig_top or rp.get("original_max_position_embeddings", max_pos)
    if t == "linear":
        return inv / rp["factor"], 1.0
    if t == "dynamic":
        n = max(seq_len, max_pos)
        b = base * ((rp["factor"] * n / max_pos) - (rp["factor"] - 1)) ** (dim / (dim - 2))
        return 1.0 / b ** idx, 1.0
    if t == "llama3":
        f, lo, hi = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
        out = []
        for w in inv:
            wl = 2 * math.pi / w
            if wl < orig / hi:
                out.append(w)
            elif wl > orig / lo:
                out.append(w / f)
            else:
                s = (orig / wl - lo) / (hi - lo)
                out.append((1 - s) * w / f + s * w)
        return np.array(out), 1.0
    if t == "yarn":
        f = rp.get("factor") or max_pos / orig
        ms, msa = rp.get("mscale"), rp.get("mscale_all_dim")
        g = lambda m: 1.0 if f <= 1 else 0.1 * m * math.log(f) + 1  # noqa: E731
        af = rp.get("attention_factor") or (g(ms) / g(msa) if ms and msa else g(1))
        cd = lambda r: dim * math.log(orig / (r * 2 * math.pi)) / (2 * math.log(base))  # noqa: E731
        lo, hi = cd(rp.get("beta_fast", 32)), cd(rp.get("beta_slow", 1))
        if rp.get("truncate", True):
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, dim - 1)
        ramp = np.clip((np.arange(dim // 2) - lo) / (hi - lo if hi != lo else 0.001), 0, 1)
        return inv / f * ramp + inv * (1 - ramp), af
    if t == "longrope":
        f = rp.get("factor") or max_pos / orig
        af = rp.get("attention_factor") or (1.0 if f <= 1 else math.sqrt(1 + math.log(f) / math.log(orig)))
        ext = np.array(rp["long_factor"] if seq_len > orig else rp["short_factor"])
        return inv / ext, af
    return inv, 1.0


F64_EPS = float(np.finfo(np.float64).eps)


def pedsl_tables(case: str, L: int):
    """(inv_freq, scale, cos, sin) of the imported scheme compiled by pedsl, float64, at length L."""
    from pedsl.compiler import compile_scheme

    s = pedsl.load(import_config(hf_config(case).to_dict()))
    mod = compile_scheme(s, num_heads=HEADS, head_dim=HEAD_DIM)
    (t,) = mod.transforms
    phase = mod.evaluator.run(t.expr, mod._ctx(L, group=t), t.site)
    w = phase.align(("pos", "pair")).expand(L, len(t.channels) // 2)[1].numpy()
    cos, sin = mod.rope_tables(t, L, torch.device("cpu"), torch.float64)
    return w, s.transports[0].scale, cos.numpy(), sin.numpy()


def hf_tables(case: str, L: int):
    model = model_for(case)
    rot = model.model.rotary_emb
    x = torch.zeros(1, L, HEAD_DIM, dtype=torch.float64)
    cos, sin = rot(x, torch.arange(L)[None])
    return rot.inv_freq.double().numpy(), float(rot.attention_scaling), cos[0].numpy(), sin[0].numpy()


@pytest.mark.parametrize("case", sorted(CASES))
def test_import_compiles_to_hf_tables(case):
    _, rp, extra, lengths, _ = CASES[case]
    for L in lengths:
        w, scale, cos, sin = pedsl_tables(case, L)
        hw, hscale, hcos, hsin = hf_tables(case, L)
        P = len(w)
        rel = inv_freq_rounding(rp["rope_theta"])
        np.testing.assert_allclose(w, hw, rtol=rel, atol=0)  # HF computes inv_freq in float32
        ref_w, ref_af = reference_inv_freq(rp, HEAD_DIM, extra.get("max_position_embeddings", MAX_POS), L,
                                           extra.get("original_max_position_embeddings"))
        # float64 on both sides, a handful of operations each (pow, the ramps): 64 eps64 is a wide margin
        np.testing.assert_allclose(w, ref_w, rtol=64 * F64_EPS, atol=0)
        assert scale == pytest.approx(hscale, rel=4 * F64_EPS) and scale == pytest.approx(ref_af, rel=4 * F64_EPS)
        # HF's table: cat(freqs, freqs) * attention_scaling over the rotated channels, from float32 phases
        atol = float32_table_rounding(float(np.max(np.arange(L)[:, None] * ref_w)), rp["rope_theta"], ref_af)
        np.testing.assert_allclose(cos, hcos[:, :P], atol=atol, rtol=0)
        np.testing.assert_allclose(sin, hsin[:, P:2 * P], atol=atol, rtol=0)
        phases = np.arange(L)[:, None] * ref_w[None, :]
        # float64 tables: cos/sin of phases under L * w (< 100 rad) err by eps64 times the phase
        np.testing.assert_allclose(cos, ref_af * np.cos(phases), atol=float(phases.max()) * 8 * F64_EPS, rtol=0)
        np.testing.assert_allclose(sin, ref_af * np.sin(phases), atol=float(phases.max()) * 8 * F64_EPS, rtol=0)


def _padded_batch(L: int):
    g = torch.Generator().manual_seed(L)
    tok = torch.randint(1, 128, (3, L), generator=g)
    mask = torch.ones_like(tok)
    mask[1, :5] = 0  # left padding, as generate() expects
    mask[2, : L // 3] = 0
    return tok.masked_fill(mask == 0, 0), mask


@pytest.mark.parametrize("case", sorted(CASES))
def test_pedsl_attention_gives_the_native_logits(case):
    _, _, _, lengths, check_generate = CASES[case]
    native = model_for(case)
    ours = use_pedsl_attention(copy.deepcopy(native))
    assert ours.config._attn_implementation == "pedsl"
    exact = float64_native(native)
    for L in lengths:
        tok, mask = _padded_batch(L)
        with torch.no_grad():
            a, b, e = (m(tok, attention_mask=mask).logits for m in (native, ours, exact))
        real = mask.bool()
        assert torch.isfinite(b[real]).all()
        assert_matches_native(b[real], a[real], e[real], depth(native.config, L))
        assert (a[real].std(0) > 0.1).any()  # the comparison is not between two constant outputs
        if check_generate:
            kw = dict(attention_mask=mask, max_new_tokens=16, do_sample=False, output_logits=True,
                      return_dict_in_generate=True)
            ga, gb, ge = (m.generate(tok, **kw) for m in (native, ours, exact))
            assert torch.equal(ga.sequences, gb.sequences) and torch.equal(ge.sequences, gb.sequences)
            assert_matches_native(torch.stack(gb.logits), torch.stack(ga.logits), torch.stack(ge.logits),
                                  depth(native.config, L + 16))


def _paths(model) -> set:
    """Which path each attention layer of a model using pedsl's attention takes ("hf" or "general")."""
    states = [getattr(m, "_pedsl_attention") for m in model.modules() if hasattr(m, "_pedsl_attention")]
    return {"general" if st.hf is None else "hf" for st in states}


def test_hf_rotary_path_is_a_declaration_and_an_undeclared_feature_goes_general(monkeypatch):
    """The rotary path runs a plan only where its KernelDecl (hf-rotary) covers every feature: the model's
    own RoPE takes it; the same scheme with one feature the declaration does not list (a made-up one, and
    the reference backend, which HF's SDPA is not) runs on the general path, with the native logits."""
    from pedsl.compiler import kernel_support

    native = model_for("default")
    tok, mask = _padded_batch(16)
    real = mask.bool()
    with torch.no_grad():
        want = native(tok, attention_mask=mask).logits
    assert _paths(use_pedsl_attention(copy.deepcopy(native))) == {"hf"}
    assert _paths(use_pedsl_attention(copy.deepcopy(native), backend="reference")) == {"general"}
    features = kernel_support.plan_features
    monkeypatch.setattr(kernel_support, "plan_features", lambda plan: features(plan) | {"a statement of tomorrow"})
    ours = use_pedsl_attention(copy.deepcopy(native))
    assert _paths(ours) == {"general"}
    with torch.no_grad():
        got, exact = ours(tok, attention_mask=mask).logits, float64_native(native)(tok, attention_mask=mask).logits
    # the float64 twin within float64's chain rounding; HF's float32 phases within their floor (triangle)
    assert_matches_native(got[real], want[real], exact[real], depth(native.config, 16))


def _normalised(rp: dict, max_pos: int, orig_top=None) -> dict:
    """HF's rope_parameters with HF's defaults filled in (what the model computes from)."""
    d = {k: v for k, v in rp.items() if v is not None and k != "type"}
    t = d.setdefault("rope_type", rp.get("type", "default"))
    d.setdefault("partial_rotary_factor", 1.0)
    if t in ("yarn", "longrope", "llama3"):
        d["original_max_position_embeddings"] = orig_top or d.get("original_max_position_embeddings", max_pos)
    if t in ("yarn", "longrope"):
        d.setdefault("factor", max_pos / d["original_max_position_embeddings"])
    if t == "yarn":
        d.setdefault("beta_fast", 32.0)
        d.setdefault("beta_slow", 1.0)
        d.setdefault("truncate", True)
    return {k: (float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v) for k, v in d.items()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_export_hf_returns_the_original_parameters(case):
    _, rp, extra, _, _ = CASES[case]
    cfg = hf_config(case).to_dict()
    text = import_config(cfg)
    out = export_rope(pedsl.load(text))
    max_pos = extra.get("max_position_embeddings", MAX_POS)
    assert out["head_dim"] == HEAD_DIM and out["num_attention_heads"] == HEADS
    assert _normalised(out["rope_parameters"], max_pos) == _normalised(
        rp, max_pos, extra.get("original_max_position_embeddings"))
    # import -> export -> import is a fixed point
    again = {"model_type": cfg["model_type"], "max_position_embeddings": max_pos, **out}
    assert import_config(again) == text


def test_import_refuses_what_it_cannot_express():
    cfg = hf_config("yarn").to_dict()
    cfg["rope_parameters"]["mrope_section"] = [2, 3, 3]
    with pytest.raises(InteropError) as err:
        import_config(cfg)
    assert "mrope_section" in str(err.value) and err.value.code == "E961"
    cfg = hf_config("default").to_dict()
    cfg["rope_parameters"] = {"rope_type": "proportional", "rope_theta": 1e4}
    with pytest.raises(InteropError, match="proportional"):
        import_config(cfg)
    cfg["rope_parameters"] = {"full_attention": {"rope_type": "default"}, "sliding_attention": {"rope_type": "default"}}
    with pytest.raises(InteropError, match="per layer type"):
        import_config(cfg)


@pytest.mark.parametrize("name, what", [("ntk", "ntk()"), ("alibi", "bias"), ("yarn_wavelength", "temperature"),
                                        ("rope_interleaved", "interleaved"), ("acc_random_qk", "accumulate"),
                                        ("rope_id", "temperature")])
def test_export_refuses_schemes_outside_hf(name, what):
    with pytest.raises(InteropError) as err:
        export_rope(pedsl.load(_lib(name)))
    assert what in str(err.value) and err.value.code == "E962"


def _lib(name):
    from compiler_helpers import SCHEMES

    return SCHEMES / f"{name}.pe"


def test_library_yarn_is_hf_yarn():
    """The library's yarn.pe (head_dim 32, base 1e4, factor 4, original 128) is HF's yarn."""
    out = export_rope(pedsl.load(_lib("yarn")))
    assert out["rope_parameters"] == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                                      "rope_theta": 10000.0}


# ---------------------------------------------------------------------- command line


def test_cli_import_and_export(tmp_path):
    cfg = hf_config("llama3").to_dict()
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    code, _, err = run_cli("import-hf", str(tmp_path), "-o", str(tmp_path / "m.pe"), "--name", "m")
    assert code == 0, err
    code, out, err = run_cli("export-hf", str(tmp_path / "m.pe"))
    assert code == 0, err
    assert json.loads(out) == {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": ORIG,
                               "low_freq_factor": 1.0, "high_freq_factor": 4.0, "rope_theta": 500000.0}
    code, out, err = run_cli("export-hf", str(_lib("alibi")))
    assert code == 1 and "no Hugging Face rope_parameters equivalent" in err and "Traceback" not in err
    cfg["rope_parameters"]["mrope_section"] = [1, 2, 3]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    code, out, err = run_cli("import-hf", str(tmp_path / "config.json"))
    assert code == 1 and "mrope_section" in err and out == ""
    code, _, err = run_cli("import-hf", str(tmp_path / "missing.json"))
    assert code == 1 and "no such file" in err


# ---------------------------------------------------------------------- pedsl models as HF Llama


@pytest.mark.parametrize("name, tie", [("yarn", True), ("rope_interleaved", False), ("llama3", True)])
def test_exported_pedsl_model_loads_in_transformers(tmp_path, name, tie):
    from pedsl.compiler import compile_scheme
    from pedsl.config import ModelConfig
    from pedsl.hf.export import export_model
    from pedsl.model import TransformerLM

    cfg = ModelConfig(vocab_size=128, n_layers=2, d_model=64, n_heads=4, arch="llama", tie_embeddings=tie,
                      mlp_ratio=1.5)
    s = pedsl.load(_lib(name), heads=4, head_dim=16, params={"train_length": 32})
    model = TransformerLM(cfg, lambda i: compile_scheme(s, num_heads=4, head_dim=16, d_model=64))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p)) if p.dim() == 1 else p.mul_(5)
    export_model(model, s, tmp_path, context=32)
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float64)
    tok = torch.randint(0, 128, (2, 70))
    with torch.no_grad():
        want = model.double()(tok)
        got = hf(tok).logits
    # HF's rotary and RMSNorm compute in float32: against HF with both in float64, pedsl's model is within
    # float64 rounding, so within that floor of HF's own
    assert_matches_native(want, got, float64_native(hf, also=("RMSNorm",))(tok).logits.detach(), depth(hf.config, 70))


def test_export_refuses_a_gpt_model_or_a_scheme_outside_hf(tmp_path):
    from pedsl.compiler import compile_scheme
    from pedsl.config import ModelConfig
    from pedsl.hf.export import export_model
    from pedsl.model import TransformerLM

    for arch, name, msg, conv in (("gpt", "rope", "arch 'gpt'", 0), ("llama", "alibi", "bias", 0),
                                  ("llama", "rope_partial", "rotates 0.25", 0), ("llama", "rope", "qk_conv = 4", 4)):
        s = pedsl.load(_lib(name), heads=4, head_dim=16)
        m = TransformerLM(ModelConfig(vocab_size=128, d_model=64, n_heads=4, arch=arch, qk_conv=conv),
                          lambda i: compile_scheme(s, num_heads=4, head_dim=16, d_model=64))
        with pytest.raises(InteropError, match=msg):
            export_model(m, s, tmp_path, context=32)


@pytest.mark.slow
def test_cli_export_of_a_trained_run(tmp_path):
    from pedsl.study.common import open_run

    run = tmp_path / "run"
    code, _, err = run_cli("train", str(_lib("yarn")), "--out", str(run), "--steps", "2", "--context", "16",
                        "--batch-size", "2", "--threads", "1", "--set", "arch=llama", "--set", "d_model=32",
                        "--set", "n_heads=2", "--set", "n_layers=1", "--set", "data.max_bytes=4096",
                        "--set", "eval_every=2", "--set", "checkpoint_every=2", "--set", "eval_batches=1", "-q")
    assert code == 0, err
    code, out, err = run_cli("export", str(run), "--hf", str(tmp_path / "hf"))
    assert code == 0, err
    model, _, _ = open_run(run)
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float64)
    tok = torch.randint(0, 256, (1, 40))
    with torch.no_grad():
        assert_matches_native(model.double()(tok), hf(tok).logits, float64_native(hf, also=("RMSNorm",))(tok).logits,
                              depth(hf.config, 40))


# ---------------------------------------------------------------------- other schemes through the adapter


@pytest.mark.parametrize("name", ["alibi", "rope_id"])
def test_any_position_scheme_runs_in_an_hf_model(name):
    """A scheme outside HF's family (a distance bias; a span grid on half the channels with a
    temperature) drives the model: generate's per-step logits equal one forward over the whole
    sequence (the cache and the positions of left-padded rows are consistent), and differ from RoPE's."""
    native = model_for("default")
    ours = use_pedsl_attention(copy.deepcopy(native), _lib(name))
    tok, mask = _padded_batch(24)
    out = ours.generate(tok, attention_mask=mask, max_new_tokens=6, do_sample=False, output_logits=True,
                        return_dict_in_generate=True)
    full_mask = torch.cat([mask, torch.ones(3, 6, dtype=mask.dtype)], dim=1)
    with torch.no_grad():
        full = ours(out.sequences, attention_mask=full_mask).logits
        rope = native(out.sequences, attention_mask=full_mask).logits
    steps = torch.stack(out.logits, dim=1)  # (B, 6, V): the logits that chose tokens 24..29
    # generate returns float32: the cast's rounding on top of float64's
    bound = rounding(depth(native.config, 30), full[:, 23:29], float32_output=True)
    torch.testing.assert_close(steps.double(), full[:, 23:29], atol=bound, rtol=0)
    assert (full[:, 23:29] - rope[:, 23:29]).abs().max() > 1e-3


@pytest.mark.parametrize("name", ["alibi", "rope_id"])
def test_an_unpadded_sequence_takes_the_fused_kernels_with_the_same_logits(name, monkeypatch):
    """A fresh unpadded call (HF passes no mask) runs the module's fused kernels (grouped key heads repeated
    as HF's SDPA path does), not the general path's blocks; its logits equal the same row inside a padded
    batch, which the general path computes from HF's mask and positions (float64)."""
    import pedsl.compiler.stream as stream

    ours = use_pedsl_attention(model_for("default"), _lib(name))
    assert ours.config.num_key_value_heads < ours.config.num_attention_heads  # grouped-query heads
    general = []
    real = stream.stream_forward
    monkeypatch.setattr(stream, "stream_forward", lambda *a, **k: general.append(1) or real(*a, **k))
    tok, mask = _padded_batch(24)
    with torch.no_grad():
        alone = ours(tok[:1]).logits
        assert general == [], "the unpadded call took the general path"
        batch = ours(tok, attention_mask=mask).logits
        assert general, "the padded batch should take the general path"
    torch.testing.assert_close(alone[0], batch[0], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", ["t5_bias", "dynamic_position_bias", "kerple_log", "alibi_learned"])
def test_learned_distance_schemes_run_in_an_hf_model(name):
    """A learned table, MLP or learned values run inside the attention (it passes q, k, v): generate's
    per-step logits equal one forward, and the scheme's parameters are the model's, so they train."""
    native = model_for("default")
    ours = use_pedsl_attention(copy.deepcopy(native), _lib(name))
    keys = [k for k in ours.state_dict() if k.startswith("pedsl_scheme.")]
    assert keys and all(".learned.sites." in k for k in keys)
    with torch.no_grad():  # move the learned values off their start (a zero table is NoPE)
        for p in ours.pedsl_scheme.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1), dtype=p.dtype))
    tok, mask = _padded_batch(24)
    out = ours.generate(tok, attention_mask=mask, max_new_tokens=4, do_sample=False, output_logits=True,
                        return_dict_in_generate=True)
    full_mask = torch.cat([mask, torch.ones(3, 4, dtype=mask.dtype)], dim=1)
    full = ours(out.sequences, attention_mask=full_mask).logits
    steps = torch.stack(out.logits, dim=1)
    bound = rounding(depth(native.config, 28), full[:, 23:27], float32_output=True)  # generate returns float32
    torch.testing.assert_close(steps.double(), full[:, 23:27].detach().double(), atol=bound, rtol=0)
    full[:, -1].logsumexp(-1).sum().backward()
    grads = [p.grad for p in ours.pedsl_scheme.parameters()]
    assert all(g is not None for g in grads) and any(float(g.abs().max()) > 0 for g in grads)


def test_learned_parts_of_a_layers_scheme_are_the_models_parameters(tmp_path):
    """A layers scheme whose part has learned values (T5's table on every other layer): the part's module
    is the model's submodule, so its table trains, moves and saves with the model."""
    src = tmp_path / "m.pe"
    src.write_text(f'import "{_lib("t5_bias")}"\n'
                   "scheme r { qk: rotate(geometric(10000.0) * position) }\n"
                   "scheme m { layers { default = r\n every(2) = t5_bias } }\n")
    ours = use_pedsl_attention(model_for("default"), src)
    keys = [k for k in ours.state_dict() if k.startswith("pedsl_scheme.")]
    assert keys and all(".learned.sites." in k for k in keys)
    params = list(ours.pedsl_scheme.parameters())
    assert params and all(p.requires_grad for p in params)
    with torch.no_grad():  # off the zero start, so the bias acts
        for p in params:
            p.add_(0.5 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1), dtype=p.dtype))
    tok, mask = _padded_batch(24)
    ours(tok, attention_mask=mask).logits[:, -1].logsumexp(-1).sum().backward()
    assert any(p.grad is not None and float(p.grad.abs().max()) > 0 for p in params)


def test_adapter_refuses_data_dependent_schemes():
    with pytest.raises(InteropError, match="hidden state or the tokens") as err:
        use_pedsl_attention(model_for("default"), _lib("acc_random_qk"))
    assert err.value.code == "E964"


def test_scale_acts_on_its_group_only(tmp_path):
    """rotate(..., scale = m) on half the channels: every backend and the general (positions) path give
    softmax((m^2 <R q_rot, R k_rot> + <q_plain, k_plain>) / sqrt(D)) v, computed here naively in float64;
    so does the standalone module of `pedsl compile`."""
    from pedsl.compiler import compile_scheme

    text = """scheme s { channels { rot = fraction(0.5); plain = rest }
                         qk on rot: rotate(geometric(100.0) * position, scale = 1.3) }"""
    D, H, L = 8, 2, 7
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, H, L, D, generator=g, dtype=torch.float64) for _ in range(3))
    w = [100.0 ** (-2 * j / 4) for j in range(2)]
    want = torch.zeros(1, H, L, D, dtype=torch.float64)
    for h in range(H):
        for i in range(L):
            s = []
            for j in range(i + 1):
                dot = 0.0
                for p in range(2):  # halves pairs inside the rotated group: (p, p + 2)
                    a = w[p] * (i - j)  # <R(w i) q, R(w j) k> = q^T R(w (j - i)) k
                    qi, qj, ki, kj = q[0, h, i, p], q[0, h, i, p + 2], k[0, h, j, p], k[0, h, j, p + 2]
                    dot += 1.69 * ((qi * ki + qj * kj) * math.cos(a) + (qi * kj - qj * ki) * math.sin(a))
                dot += float(q[0, h, i, 4:] @ k[0, h, j, 4:])
                s.append(dot / math.sqrt(D))
            p_ = torch.softmax(torch.tensor(s, dtype=torch.float64), 0)
            want[0, h, i] = p_ @ v[0, h, : i + 1]
    import importlib.util

    from pedsl.compiler.codegen import generate

    for backend in ("sdpa", "masked", "reference", "codegen"):
        mod = compile_scheme(text, num_heads=H, head_dim=D, backend="sdpa" if backend == "codegen" else backend)
        if backend == "codegen":  # the standalone module of `pedsl compile`
            file = tmp_path / "s.py"
            file.write_text(generate(mod.scheme, mod.plan))
            spec = importlib.util.spec_from_file_location("gen_scaled", file)
            gen = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(gen)
            mod = gen.Module()
        mod = mod.double()
        # float64 on both sides: a score sums D products, the softmax and its weighted sum L terms
        bound = rounding(2 * L + D, want)
        torch.testing.assert_close(mod(q, k, v), want, atol=bound, rtol=0)
        got = mod(q, k, v, positions=torch.arange(L)[None] + 5)  # the general path, shifted positions
        torch.testing.assert_close(got, want, atol=bound, rtol=0)


@pytest.mark.parametrize("name", ["rope", "pi", "dynamic_ntk", "yarn", "llama3", "longrope", "rope_partial"])
def test_library_schemes_in_hf_family_compute_what_hf_computes(name):
    """export-hf of each library scheme, given to transformers: HF's inv_freq and attention factor
    (at a length past the scheme's original, where dynamic and LongRoPE tables switch) are pedsl's."""
    from pedsl.compiler import compile_scheme

    s = pedsl.load(_lib(name))
    out = export_rope(s)
    rp = out["rope_parameters"]
    cls = transformers.Phi3Config if "partial_rotary_factor" in rp else transformers.LlamaConfig
    kw = dict(hidden_size=s.heads * s.head_dim, num_attention_heads=s.heads, head_dim=s.head_dim,
              max_position_embeddings=out.get("max_position_embeddings", 1024))
    if cls is transformers.Phi3Config:
        kw.update(rope_scaling=dict(rp), partial_rotary_factor=rp["partial_rotary_factor"])
    else:
        kw.update(rope_parameters=dict(rp))
    cfg = cls(**kw)
    rot_cls = (transformers.models.phi3.modeling_phi3.Phi3RotaryEmbedding if cls is transformers.Phi3Config
               else transformers.models.llama.modeling_llama.LlamaRotaryEmbedding)
    rot = rot_cls(cfg)
    L = 300  # past original = 128
    rot(torch.zeros(1, L, s.head_dim), torch.arange(L)[None])
    mod = compile_scheme(s, num_heads=s.heads, head_dim=s.head_dim)
    (t,) = mod.transforms
    ph = mod.evaluator.run(t.expr, mod._ctx(L, group=t), t.site)
    w = ph.align(("pos", "pair")).expand(L, len(t.channels) // 2)[1]
    torch.testing.assert_close(w, rot.inv_freq.double(), rtol=inv_freq_rounding(rp["rope_theta"]), atol=0)
    assert s.transports[0].scale == pytest.approx(rot.attention_scaling, rel=4 * F64_EPS)


def test_diff_and_explain_show_the_group_scale(tmp_path):
    (tmp_path / "y2.pe").write_text('import "yarn.pe"\nscheme y2 extends yarn {\n'
                                    '  param attention_factor: float (>= 0) = 1.5\n}\n')
    code, out, err = run_cli("diff", str(_lib("yarn")), str(tmp_path / "y2.pe"))
    assert code == 1 and err == ""  # like diff(1): 1 when the schemes differ
    assert "scaled by 1.139 (the group's logits x 1.296)" in out and "scaled by 1.5 (the group's logits x 2.25)" in out
    code, out, err = run_cli("diff", str(_lib("rope")), str(_lib("yarn")))
    assert "+ transport[all].scale = yarn_mscale(factor, mscale, mscale_all_dim, attention_factor)" in out


@pytest.mark.parametrize("key, value", [("qk_rope_head_dim", 64), ("rope_interleave", True), ("rotary_dim", 8),
                                        ("no_rope_layers", [1, 0])])
def test_import_refuses_other_rotary_layouts(key, value):
    """DeepSeek's MLA rope dimension and interleaving, GPT-J's rotary_dim, Llama 4's NoPE layers."""
    cfg = {**hf_config("yarn").to_dict(), key: value}
    with pytest.raises(InteropError, match=key):
        import_config(cfg)


def test_llama_arch_config():
    from pedsl.config import ModelConfig
    from pedsl.errors import ConfigError
    from pedsl.model import TransformerLM

    with pytest.raises((ValueError, ConfigError), match="RMSNorm"):
        ModelConfig(arch="llama", norm="layernorm")
    m = TransformerLM(ModelConfig(vocab_size=64, d_model=32, n_heads=2, arch="llama", mlp_ratio=2),
                      lambda i: torch.nn.Identity())
    mlp = m.blocks[0].mlp
    assert [n for n, _ in mlp.named_parameters()] == ["gate.weight", "fc.weight", "proj.weight"]
    x = torch.randn(2, 3, 32)
    torch.testing.assert_close(mlp(x), mlp.proj(torch.nn.functional.silu(mlp.gate(x)) * mlp.fc(x)))
    assert all(b is None for mod in m.modules() if isinstance(mod, torch.nn.Linear) for b in [mod.bias])


def test_parameter_estimate_counts_swiglu():
    from pedsl import limits
    from pedsl.compiler import compile_scheme
    from pedsl.config import ModelConfig
    from pedsl.model import TransformerLM

    for arch in ("gpt", "llama"):
        c = ModelConfig(vocab_size=64, d_model=32, n_heads=2, n_layers=2, arch=arch, tie_embeddings=False)
        m = TransformerLM(c, lambda i: compile_scheme(_lib("rope"), num_heads=2, head_dim=16))
        norms = sum(p.numel() for n, p in m.named_parameters() if "norm" in n)
        est = limits.model_parameters(vocab_size=64, n_layers=2, d_model=32, n_heads=2, head_dim=16, mlp_ratio=4.0,
                                      tie_embeddings=False, mlp_matrices=3 if arch == "llama" else 2)
        assert est == m.num_params() - norms


@pytest.mark.parametrize("statement", ["window = 8", "chunk = 8", "sink = logit", "softcap = 30.0"])
def test_export_refuses_every_statement_beyond_the_rotation(statement):
    src = f'import "{_lib("rope")}"\nscheme s extends rope {{\n  {statement}\n}}\n'
    with pytest.raises(InteropError, match=f"{statement}; rope_parameters hold the rotation only") as err:
        export_rope(pedsl.load(src))
    assert err.value.code == "E962"


def test_export_reads_the_statement_registry(monkeypatch):
    """A statement the registry gains is refused by export, not dropped: here the window's record renamed."""
    import dataclasses

    from pedsl.lang import statements

    renamed = tuple(dataclasses.replace(r, kind="tomorrow", completions=(("tomorrow", "", ""),))
                    if r.kind == "window" else r for r in statements.RECORDS)
    monkeypatch.setattr(statements, "RECORDS", renamed)
    src = f'import "{_lib("rope")}"\nscheme s extends rope {{\n  window = 8\n}}\n'
    with pytest.raises(InteropError, match="tomorrow = 8"):
        export_rope(pedsl.load(src))

"""`pedsl import-hf` / `export-hf` on the M-RoPE of Qwen2-VL, Qwen2.5-VL and Qwen3-VL configs.

The reading is checked against transformers itself: the spec read from a config gives, through an
independent float64 loop, the very cos/sin table that HF's own rotary class builds from that config at
3-axis positions; the written-back rope_parameters rebuild the same HF table and re-import to the same
spec. Every field the scheme would not carry is refused by name, with exit 1 and no traceback."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from compiler_helpers import run_cli
from hf_helpers import float32_table_rounding

from pedsl.errors import InteropError
from pedsl.hf import convert, multimodal
from pedsl.lang.api import check, load, parse
from pedsl.lang.library import scheme_file

transformers = pytest.importorskip("transformers")
HEADS, HEAD_DIM, HIDDEN = 2, 24, 48  # 12 rotary pairs: sections [4, 4, 4] fit both assignments
FAMILY_CLASSES = {
    "qwen2_vl": ("Qwen2VLConfig", "Qwen2VLTextConfig", "Qwen2VLTextModel"),
    "qwen2_5_vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLTextConfig", "Qwen2_5_VLTextModel"),
    "qwen3_vl": ("Qwen3VLConfig", "Qwen3VLTextConfig", "Qwen3VLTextModel"),
}


def legacy(family: str = "qwen2_vl", sections=(2, 5, 5), theta: float = 1000.0) -> dict:
    """A flat pre-v5 hub config: the text fields at the top, rope_scaling {type: mrope}."""
    return {"model_type": family, "architectures": ["Qwen2VLForConditionalGeneration"], "hidden_size": HIDDEN,
            "num_attention_heads": HEADS, "num_key_value_heads": 1, "max_position_embeddings": 4096,
            "rope_theta": theta, "rope_scaling": {"type": "mrope", "mrope_section": list(sections)},
            "vision_config": {"depth": 2, "embed_dim": 16, "num_heads": 2}, "vocab_size": 64}


def text_kwargs(family: str, rope: dict) -> dict:
    kw = {"vocab_size": 64, "hidden_size": HIDDEN, "intermediate_size": 64, "num_hidden_layers": 1,
          "num_attention_heads": HEADS, "num_key_value_heads": 1, "max_position_embeddings": 4096,
          "rope_parameters": rope}
    return {**kw, "head_dim": HEAD_DIM} if family == "qwen3_vl" else kw


def v5_config(family: str, rope: dict, *, composite: bool = True) -> dict:
    """The config.json transformers 5 writes for a tiny model of the family (nested text_config)."""
    outer, text_cls, _ = FAMILY_CLASSES[family]
    text = getattr(transformers, text_cls)(**text_kwargs(family, copy.deepcopy(rope)))
    if not composite:
        return json.loads(json.dumps(text.to_dict()))
    cfg = getattr(transformers, outer)(text_config=text.to_dict(), vision_config={"depth": 1, "num_heads": 2})
    return json.loads(json.dumps(cfg.to_dict()))


def naive_table(spec: dict, pos: torch.Tensor) -> torch.Tensor:
    """cos of pair k at token (b, l): base^(-2k/D) * position[axis(k)], in HF's cat(f, f) layout (float64 loops)."""
    P = spec["head_dim"] // 2
    axis = multimodal.assignment(spec["assignment"], spec["sections"], P)
    _, B, L = pos.shape
    out = torch.empty(B, L, 2 * P, dtype=torch.float64)
    for b in range(B):
        for i in range(L):
            for k in range(P):
                w = spec["theta"] ** (-2.0 * k / spec["head_dim"])
                out[b, i, k] = out[b, i, k + P] = torch.cos(torch.tensor(w * float(pos[axis[k], b, i]),
                                                                         dtype=torch.float64))
    return out


def hf_table(family: str, text_cfg: dict, pos: torch.Tensor) -> torch.Tensor:
    """The cos table of transformers' own text rotary class for a text config dict."""
    _, text_cls, model_cls = FAMILY_CLASSES[family]
    cfg = getattr(transformers, text_cls)(**{k: v for k, v in text_cfg.items() if k != "model_type"})
    module = __import__(getattr(transformers, model_cls).__module__, fromlist=["x"])
    rotary_cls = next(getattr(module, n) for n in dir(module) if n.endswith("RotaryEmbedding")
                      and "Vision" not in n)
    cos, _ = rotary_cls(cfg)(torch.zeros(1, dtype=torch.float64), pos)
    return cos


def assert_table(got: torch.Tensor, spec: dict, pos: torch.Tensor) -> None:
    """HF's table ``got`` is the naive float64 one within the rounding of its float32 phases (position_ids.float()
    * inv_freq.float(): hf_helpers.float32_table_rounding, at the largest phase, inv_freq <= 1); a wrong axis,
    base or section is off by O(1)."""
    torch.testing.assert_close(got, naive_table(spec, pos), rtol=0,
                               atol=float32_table_rounding(float(pos.max()), spec["theta"]))


def image_positions(B: int = 2) -> torch.Tensor:
    """(3, B, L): 3 text tokens, a 2 x 3 image block at t = 3, then text from max + 1."""
    text0 = [[i, i, i] for i in range(3)]
    image = [[3, 3 + h, 3 + w] for h in range(2) for w in range(3)]
    after = [[6 + i] * 3 for i in range(3)]
    rows = torch.tensor(text0 + image + after).T  # (3, L)
    return torch.stack([rows + 5 * b for b in range(B)], 1)


@pytest.mark.parametrize("family", list(FAMILY_CLASSES))
def test_the_spec_of_a_v5_config_is_the_table_transformers_builds(family):
    rope = {"rope_type": "default", "rope_theta": 777.0, "mrope_section": [4, 4, 4]}
    if family == "qwen3_vl":
        rope["mrope_interleaved"] = True
    for composite in (True, False):
        cfg = v5_config(family, rope, composite=composite)
        spec = multimodal.mrope_spec(cfg)
        assert (spec["heads"], spec["head_dim"], spec["theta"], spec["sections"]) == (HEADS, HEAD_DIM, 777.0,
                                                                                     [4, 4, 4])
        assert spec["assignment"] == ("interleave" if family == "qwen3_vl" else "sections")
        text_cfg = cfg["text_config"] if composite else cfg
        pos = image_positions()
        assert_table(hf_table(family, text_cfg, pos), spec, pos)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
def test_a_flat_legacy_config_reads_as_transformers_reads_it(family):
    cfg = legacy(family)
    spec = multimodal.mrope_spec(cfg)
    assert (spec["theta"], spec["sections"], spec["assignment"]) == (1000.0, [2, 5, 5], "sections")
    assert spec["fields"]["sections"] == "rope_scaling.mrope_section"
    hf = getattr(transformers, FAMILY_CLASSES[family][0])(**{k: v for k, v in cfg.items() if k != "model_type"})
    pos = image_positions()
    assert_table(hf_table(family, hf.text_config.to_dict(), pos), spec, pos)


def test_the_imported_text_is_the_multi_axis_scheme():
    assert multimodal.mrope_text(multimodal.mrope_spec(legacy())) == """\
# Imported by pedsl import-hf from a Hugging Face config (model_type qwen2_vl, M-RoPE, mrope_section [2, 5, 5]).
# Equal to the language model's positional encoding at HF's 3-axis position_ids (t, h, w): pedsl export-hf \
prints its rope_parameters back.
# The vision tower's own rotary embedding and how positions are given to image tokens are not part of it.
scheme qwen2_vl_mrope "M-RoPE of a Hugging Face qwen2_vl config" {
  axes t, h, w
  param heads: int = 2
  param head_dim: int = 24
  param base: float (> 1) = 1000.0
  param train_length: int (>= 2) = 4096
  layout halves
  qk: rotate(geometric(base) * sections(position, [2, 5, 5]))
  train {
    context = train_length
  }
  allow frayed_frequencies
}
"""
    q3 = v5_config("qwen3_vl", {"rope_type": "default", "rope_theta": 5e5, "mrope_section": [4, 4, 4],
                                "mrope_interleaved": True})
    text = multimodal.mrope_text(multimodal.mrope_spec(q3), name="q3")
    assert 'scheme q3 "interleaved M-RoPE of a Hugging Face qwen3_vl config" {' in text
    assert "  qk: rotate(geometric(base) * interleave(position, [4, 4, 4]))\n" in text


def test_a_fixed_scaled_table_is_read_with_its_knobs_and_written_over_the_sections():
    """YaRN, linear and Llama 3 tables split over the axes (Qwen2.5-VL's long-context recipe is YaRN with
    mrope_section): the knobs as one-axis import-hf reads them, the same grids, the attention factor as scale."""
    cfg = {**legacy("qwen2_5_vl"), "rope_scaling": {"type": "yarn", "mrope_section": [2, 5, 5], "factor": 4.0,
                                                    "original_max_position_embeddings": 1024}}
    spec = multimodal.mrope_spec(cfg)
    assert (spec["rope_type"], spec["factor"], spec["original"], spec["beta_fast"]) == ("yarn", 4.0, 1024, 32.0)
    text = multimodal.mrope_text(spec)
    assert 'scheme qwen2_5_vl_mrope_yarn "M-RoPE over rope_type yarn of a Hugging Face qwen2_5_vl config" {' in text
    assert "  let freq = yarn(base, factor, original, beta_fast, beta_slow, truncate)\n" in text
    assert "  qk: rotate(freq * sections(position, [2, 5, 5]), scale = m)\n" in text
    assert "  param original: int (>= 2) = 1024\n" in text and "  param train_length: int (>= 2) = 1024\n" in text
    linear = multimodal.mrope_text(multimodal.mrope_spec(_nested(rope_type="linear", factor=2.0,
                                                                  mrope_section=[4, 4, 4], mrope_interleaved=True)))
    assert "  qk: rotate(freq * interleave(position, [4, 4, 4]) / factor)\n" in linear


def test_defaults_are_transformers_defaults():
    cfg = {"model_type": "qwen2_5_vl_text", "hidden_size": 256, "num_attention_heads": 2}  # head_dim 128
    spec = multimodal.mrope_spec(cfg)
    assert (spec["theta"], spec["sections"]) == (1e6, [16, 24, 24])
    assert "default" in spec["fields"]["theta"] and "default" in spec["fields"]["sections"]
    q3 = multimodal.mrope_spec({"model_type": "qwen3_vl", "text_config": {"num_attention_heads": 4}})
    assert (q3["head_dim"], q3["theta"], q3["sections"]) == (128, 5e5, [24, 20, 20])


def test_matching_a_written_phase_reads_its_frequencies_and_sections():
    module = parse('scheme s { qk: rotate(geometric(base) * interleave(position, [24, 20, 20])) }\n')
    phase = module.schemes[0].body[0].value.args[0]
    grid, pick = multimodal.match_phase(phase)
    assert (grid.func, pick.func, [a.value for a in pick.args[1].items]) == ("geometric", "interleave", [24, 20, 20])
    other = parse("scheme s { qk: rotate(geometric(base) * position) }\n").schemes[0].body[0].value.args[0]
    assert multimodal.match_phase(other) is None


# ---------------------------------------------------------------------- refusals, each naming its field


def _nested(**rope) -> dict:
    return {"model_type": "qwen3_vl", "text_config": {"model_type": "qwen3_vl_text", "num_attention_heads": HEADS,
                                                      "head_dim": HEAD_DIM, "hidden_size": HIDDEN,
                                                      "rope_parameters": {"rope_type": "default", **rope}}}


BAD = [
    ("sum", legacy(sections=(4, 4, 5)), "rope_scaling.mrope_section [4, 4, 5] sums to 13 pairs"),
    ("two sections", legacy(sections=(6, 6)), "rope_scaling.mrope_section must be a list of three"),
    ("not ints", legacy(sections=(4, 4.5, 3.5)), "rope_scaling.mrope_section must be a list of three"),
    ("string", {**legacy(), "rope_scaling": {"type": "mrope", "mrope_section": "16,24,24"}}, "mrope_section"),
    ("unknown key", {**legacy(), "rope_scaling": {"type": "mrope", "mrope_section": [2, 5, 5], "foo": 1}},
     "rope_scaling.foo: not read"),
    ("dynamic", {**legacy(), "rope_scaling": {"type": "dynamic", "mrope_section": [2, 5, 5], "factor": 2.0}},
     "rope_scaling.type = 'dynamic'"),
    ("rope_type", _nested(rope_type="longrope", factor=2.0, mrope_section=[4, 4, 4]),
     "text_config.rope_parameters.rope_type = 'longrope'"),
    ("knob of another type", {**legacy(), "rope_scaling": {"type": "linear", "mrope_section": [2, 5, 5],
                                                           "factor": 2.0, "beta_fast": 3.0}},
     "rope_scaling.beta_fast: not read by M-RoPE with rope_type 'linear'"),
    ("no factor", {**legacy(), "rope_scaling": {"type": "linear", "mrope_section": [2, 5, 5]}},
     "needs a factor (rope_scaling.factor)"),
    ("bad factor", _nested(rope_type="yarn", factor=-2.0, original_max_position_embeddings=64, mrope_section=[4, 4, 4]),
     "text_config.rope_parameters.factor = -2.0"),
    ("contradicting type", {**legacy(), "rope_scaling": {"type": "yarn", "rope_type": "default"}},
     "rope_scaling.type = 'yarn' contradicts"),
    ("interleave sizes", _nested(mrope_section=[2, 5, 5], mrope_interleaved=True),
     "interleaved assignment gives the axes [4, 4, 4]"),
    ("qwen3 not interleaved", _nested(mrope_section=[4, 4, 4], mrope_interleaved=False),
     "text_config.rope_parameters.mrope_interleaved = false"),
    ("qwen2 interleaved", {**legacy(), "rope_scaling": {"type": "mrope", "mrope_section": [2, 5, 5],
                                                        "mrope_interleaved": True}},
     "rope_scaling.mrope_interleaved = true"),
    ("interleaved flag type", _nested(mrope_section=[4, 4, 4], mrope_interleaved="yes"), "true or false"),
    ("sliding", {**legacy(), "use_sliding_window": True}, "use_sliding_window = true"),
    ("layer types", {**legacy(), "layer_types": ["sliding_attention"]}, "layer_types"),
    ("partial", {**legacy(), "partial_rotary_factor": 0.5}, "partial_rotary_factor = 0.5"),
    ("head_dim", {**legacy(), "head_dim": 32}, "head_dim = 32 but hidden_size / num_attention_heads = 24"),
    ("theta", {**legacy(), "rope_theta": 1.0}, "rope_theta = 1.0"),
    ("no heads", {k: v for k, v in legacy().items() if k != "num_attention_heads"}, "num_attention_heads"),
    ("qwen3 flat", {**legacy(), "model_type": "qwen3_vl"}, "needs text_config"),
    ("top vs text", {**_nested(mrope_section=[4, 4, 4]), "rope_theta": 10.0}, "'rope_theta' = 10.0 at the top"),
    ("scaling vs params", {"model_type": "qwen2_vl_text", "hidden_size": HIDDEN, "num_attention_heads": HEADS,
                           "rope_scaling": {"type": "mrope", "mrope_section": [2, 5, 5]},
                           "rope_parameters": {"rope_type": "default", "mrope_section": [4, 4, 4]}},
     "rope_scaling and rope_parameters differ"),
    ("text model type", {**_nested(mrope_section=[4, 4, 4]), "text_config": {"model_type": "llama"}},
     "text_config.model_type 'llama'"),
    ("rope not a dict", {**legacy(), "rope_scaling": [1, 2]}, "rope_scaling must be an object"),
    ("rope type a list", {**legacy(), "rope_scaling": {"type": [1], "mrope_section": [2, 5, 5]}},
     "rope_scaling.type = [1]"),
]


@pytest.mark.parametrize("cfg, message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_config_the_scheme_would_not_carry_is_refused_naming_the_field(cfg, message):
    with pytest.raises(InteropError) as err:
        multimodal.mrope_spec(cfg)
    assert message in str(err.value), str(err.value)


@pytest.mark.parametrize("cfg, message", [b[1:] for b in BAD[:3] + BAD[4:6]], ids=[b[0] for b in BAD[:3] + BAD[4:6]])
def test_import_hf_refuses_with_exit_1_and_no_traceback(tmp_path, cfg, message):
    src = tmp_path / "config.json"
    src.write_text(json.dumps(cfg))
    code, out, err = run_cli("import-hf", src, "-o", tmp_path / "out.pe")
    assert code == 1 and message in err and "Traceback" not in err and not out, err
    assert not (tmp_path / "out.pe").exists()


HOSTILE = ["8", [1], 0, -8, True, 1e308, {"a": 1}]


@pytest.mark.parametrize("field, value", [(f, v) for f in ("hidden_size", "num_attention_heads", "rope_theta",
                                                            "max_position_embeddings") for v in HOSTILE]
                         + [("hidden_size", 2**62), ("num_attention_heads", 2**62)])
def test_hostile_values_are_refused_as_config_errors(field, value):
    with pytest.raises(InteropError) as err:
        multimodal.mrope_spec({**legacy(), field: value})
    assert err.value.code in ("E961", "E963")


def test_other_mrope_models_stay_refused():
    with pytest.raises(InteropError, match="M-RoPE"):
        convert.import_config({"model_type": "glm4v", "hidden_size": 64, "num_attention_heads": 2,
                               "rope_parameters": {"rope_type": "default", "mrope_section": [8, 12, 12]}})


@pytest.mark.parametrize("model_type", [{"a": 1}, [1, 2], 3])
def test_a_model_type_that_is_not_a_string_is_a_config_error(model_type):
    assert multimodal.family_of({"model_type": model_type}) is None
    with pytest.raises(InteropError):
        convert.import_config({**legacy(), "model_type": model_type, "rope_scaling": None, "rope_theta": 0.5})


# ---------------------------------------------------------------------- the written scheme, loaded and exported


def _configs():
    q3 = {"rope_type": "default", "rope_theta": 5e5, "mrope_section": [4, 4, 4], "mrope_interleaved": True}
    yarn = {"rope_type": "yarn", "rope_theta": 1e6, "mrope_section": [2, 5, 5], "factor": 4.0,
            "original_max_position_embeddings": 1024, "beta_fast": 16.0, "attention_factor": 1.25}
    llama3 = {"rope_type": "llama3", "rope_theta": 5e5, "mrope_section": [4, 4, 4], "mrope_interleaved": True,
              "factor": 8.0, "original_max_position_embeddings": 512, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    return {"legacy qwen2_vl": legacy(), "legacy qwen2_5_vl": legacy("qwen2_5_vl", (4, 4, 4), 1e6),
            "v5 qwen2_vl": v5_config("qwen2_vl", {"rope_type": "default", "rope_theta": 9.0e3,
                                                  "mrope_section": [6, 3, 3]}),
            "v5 qwen2_5_vl text": v5_config("qwen2_5_vl", {"rope_type": "default", "rope_theta": 1e6,
                                                           "mrope_section": [2, 5, 5]}, composite=False),
            "v5 qwen3_vl": v5_config("qwen3_vl", q3), "v5 qwen3_vl text": v5_config("qwen3_vl", q3, composite=False),
            "yarn qwen2_5_vl": v5_config("qwen2_5_vl", yarn),
            "linear qwen2_vl": {**legacy(), "rope_scaling": {"type": "linear", "mrope_section": [2, 5, 5],
                                                             "factor": 2.0}},
            "llama3 qwen3_vl": v5_config("qwen3_vl", llama3),
            "default qwen2_vl": transformers.Qwen2VLConfig().to_dict(),
            "default qwen3_vl": transformers.Qwen3VLConfig().to_dict()}


def _hf_rope_parameters(cfg: dict) -> dict:
    """The rope_parameters transformers standardises the config to (its own config class), as export writes them:
    without the legacy 'type' and the knobs at HF's defaults, with the family's default sections."""
    family, _ = multimodal.family_of(cfg)
    outer, text_cls, _ = FAMILY_CLASSES[family]
    if cfg["model_type"] == family:
        text = getattr(transformers, outer)(**{k: v for k, v in cfg.items() if k != "model_type"}).text_config
    else:
        text = getattr(transformers, text_cls)(**{k: v for k, v in cfg.items() if k != "model_type"})
    rp = {k: v for k, v in text.rope_parameters.items() if k != "type"}
    rp.setdefault("mrope_section", list(multimodal.FAMILIES[family].sections))
    if family == "qwen3_vl":
        rp.setdefault("mrope_interleaved", True)
    rp["rope_theta"] = float(rp["rope_theta"])
    if rp["rope_type"] == "yarn":
        defaults = (("beta_fast", 32.0), ("beta_slow", 1.0), ("truncate", True))
        rp = {k: v for k, v in rp.items() if (k, v) not in defaults}
    return rp


@pytest.mark.parametrize("key", list(_configs()))
def test_the_written_scheme_checks_and_exports_back_to_the_config(key):
    cfg = json.loads(json.dumps(_configs()[key]))
    text = convert.import_config(cfg)
    assert not [d for d in check(text) if d.severity == "error"]
    sch = load(text)
    spec = multimodal.mrope_spec(cfg)
    assert sch.axes == ("t", "h", "w") and (sch.heads, sch.head_dim) == (spec["heads"], spec["head_dim"])
    out = convert.export_rope(sch)
    assert (out["head_dim"], out["num_attention_heads"]) == (spec["head_dim"], spec["heads"])
    assert out["rope_parameters"] == _hf_rope_parameters(cfg)


def test_import_hf_then_export_hf_on_the_command_line(tmp_path):
    src, pe = tmp_path / "config.json", tmp_path / "qwen.pe"
    src.write_text(json.dumps(v5_config("qwen3_vl", {"rope_type": "default", "rope_theta": 5e5,
                                                     "mrope_section": [4, 4, 4], "mrope_interleaved": True})))
    code, _, err = run_cli("import-hf", src, "-o", pe)
    assert code == 0, err
    code, out, err = run_cli("export-hf", pe, "--config")
    assert code == 0, err
    assert json.loads(out) == {"head_dim": HEAD_DIM, "num_attention_heads": HEADS, "rope_parameters": {
        "rope_type": "default", "rope_theta": 5e5, "mrope_section": [4, 4, 4], "mrope_interleaved": True}}


@pytest.mark.parametrize("name", ["mrope", "mrope_interleaved"])
def test_the_library_m_rope_schemes_export_and_import_back(name):
    sch = load(scheme_file(name), heads=4, head_dim=32)
    out = convert.export_rope(sch)
    cfg = {"model_type": "qwen3_vl_text" if name.endswith("interleaved") else "qwen2_vl_text",
           "hidden_size": 128, "num_attention_heads": 4, "head_dim": 32, "rope_parameters": out["rope_parameters"]}
    assert convert.export_rope(load(convert.import_config(cfg))) == out


@pytest.mark.parametrize("old, new, part", [
    ("  allow frayed_frequencies\n", "  temperature = 2.0\n  allow frayed_frequencies\n",
     "temperature = 2.0 scales every channel"),
    ("[2, 5, 5]))", "[2, 5, 5]), scale = 2.0)", "a scale on the rotated channels"),
    ("geometric(base) * sections", "geometric(base) * 2 * sections", "a frequency table times sections"),
    ("layout halves", "layout interleaved", "the interleaved layout"),
])
def test_export_refuses_what_hf_m_rope_has_not(old, new, part):
    text = convert.import_config(legacy())
    assert old in text
    with pytest.raises(InteropError, match=part):
        convert.export_rope(load(text.replace(old, new)))


def test_export_refuses_an_axial_scheme():
    with pytest.raises(InteropError, match="E962|no Hugging Face"):
        convert.export_rope(load(scheme_file("rope_3d"), heads=2, head_dim=48))

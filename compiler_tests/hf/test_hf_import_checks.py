"""`pedsl import-hf` checks what it writes: a hostile or broken config.json is refused with the config field
named (exit 1, nothing written), never an internal error and never a scheme that `pedsl check` rejects.
No transformers needed: import-hf reads the JSON itself."""

from __future__ import annotations

import copy
import json

import pytest

from compiler_helpers import run_cli
from pedsl.errors import InteropError, PedslError
from pedsl.hf.rope import import_config
from pedsl.lang.api import check, load

HEAD_DIM, HEADS, MAX_POS = 32, 4, 2048


def config(rope_type: str) -> dict:
    """A valid Llama-family config of each rope type (transformers 5 layout)."""
    rp = {"rope_type": rope_type, "rope_theta": 10000.0}
    rp.update({
        "default": {},
        "linear": {"factor": 4.0},
        "dynamic": {"factor": 2.0},
        "llama3": {"factor": 8.0, "original_max_position_embeddings": 512, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0},
        "yarn": {"factor": 4.0, "original_max_position_embeddings": 512, "beta_fast": 32.0, "beta_slow": 1.0,
                 "mscale": 1.0, "mscale_all_dim": 1.0, "attention_factor": 1.2, "truncate": True},
        "longrope": {"factor": 4.0, "original_max_position_embeddings": 512, "short_factor": [1.0] * 16,
                     "long_factor": [2.0] * 16, "attention_factor": 1.1},
    }[rope_type])
    return {"model_type": "llama", "num_attention_heads": HEADS, "hidden_size": HEADS * HEAD_DIM,
            "head_dim": HEAD_DIM, "max_position_embeddings": MAX_POS, "rope_parameters": rp}


ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")
HOSTILE = ("8192", [1], float("inf"), float("nan"), 0, -8192, 1, 0.5, 2.0, 7, 2**62, True, None, 1e308)
TOP_FIELDS = ("num_attention_heads", "hidden_size", "head_dim", "max_position_embeddings", "rope_theta",
              "partial_rotary_factor", "original_max_position_embeddings")
ROPE_FIELDS = ("rope_theta", "partial_rotary_factor", "factor", "original_max_position_embeddings", "low_freq_factor",
               "high_freq_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor")


def _variants():
    for t in ROPE_TYPES:
        for field in TOP_FIELDS:
            for value in HOSTILE:
                yield t, field, value, False
        for field in ROPE_FIELDS:
            if field in config(t)["rope_parameters"] or field in ("rope_theta", "partial_rotary_factor"):
                for value in HOSTILE:
                    yield t, field, value, True


def _import_or_refuse(cfg: dict, field: str) -> str:
    """Either a scheme `pedsl check` accepts ('ok') or an InteropError naming ``field`` ('refused')."""
    try:
        text = import_config(cfg)
    except InteropError as err:
        assert field.split(".")[-1] in str(err), (field, cfg, str(err))
        assert len(err.render()) < 1500, err.render()
        return "refused"
    errors = [d.render() for d in check(text) if d.severity == "error"]
    assert not errors, (field, cfg, errors)
    return "ok"


@pytest.mark.parametrize("rope_type", ROPE_TYPES)
def test_hostile_values_are_refused_with_the_field_named_or_imported_valid(rope_type):
    seen = {"ok": 0, "refused": 0}
    for t, field, value, in_rope in _variants():
        if t != rope_type:
            continue
        cfg = copy.deepcopy(config(t))
        (cfg["rope_parameters"] if in_rope else cfg)[field] = value
        if field == "hidden_size":
            del cfg["head_dim"]  # head_dim = hidden_size // num_attention_heads
        seen[_import_or_refuse(cfg, field)] += 1
    assert seen["ok"] and seen["refused"], seen  # the grid holds both kinds


@pytest.mark.parametrize("field, value", [("original_max_position_embeddings", "8192"),
                                          ("original_max_position_embeddings", float("nan")),
                                          ("factor", -4), ("high_freq_factor", 0.5)])
def test_import_hf_refuses_through_the_cli_and_writes_nothing(field, value, tmp_path):
    cfg = config("llama3")
    cfg["rope_parameters"][field] = value
    src = tmp_path / "config.json"
    src.write_text(json.dumps(cfg))  # NaN as JSON's NaN, which Python's reader accepts
    code, out, err = run_cli("import-hf", src, "-o", tmp_path / "out.pe")
    assert code == 1 and field in err and "E963" in err, err
    assert not (tmp_path / "out.pe").exists()


@pytest.mark.parametrize("rope_type, field, value", [
    ("llama3", "original_max_position_embeddings", "8192"),
    ("yarn", "original_max_position_embeddings", [1]),
    ("yarn", "original_max_position_embeddings", float("inf")),
    ("longrope", "original_max_position_embeddings", float("nan")),
    ("yarn", "original_max_position_embeddings", 0),
    ("llama3", "original_max_position_embeddings", -8192),
    ("default", "rope_theta", 1.0),
    ("linear", "factor", 0),
    ("linear", "factor", -4),
    ("dynamic", "factor", -4),
    ("llama3", "high_freq_factor", 0.5),
    ("default", "partial_rotary_factor", 2.0),
])
def test_the_reported_configs_are_refused(rope_type, field, value):
    cfg = config(rope_type)
    cfg["rope_parameters"][field] = value
    if field == "original_max_position_embeddings" and value == 0:
        del cfg["rope_parameters"]["factor"]  # 0 without a factor: the factor would be max / 0
    with pytest.raises(InteropError) as err:
        import_config(cfg)
    assert field in str(err.value) and err.value.code == "E963", str(err.value)


@pytest.mark.parametrize("field, value", [("num_attention_heads", 10**18), ("head_dim", 2**62),
                                          ("max_position_embeddings", -5)])
def test_the_reported_shapes_are_refused(field, value):
    cfg = {**config("default"), field: value}
    with pytest.raises(InteropError, match=field):
        import_config(cfg)


@pytest.mark.parametrize("lst", [[float("nan")] * 16, [0.0] * 16, [-1.0] * 16, [1.0] * 15, ["1"] * 16])
def test_longrope_lists_must_be_positive_finite_numbers(lst):
    cfg = config("longrope")
    cfg["rope_parameters"]["short_factor"] = lst
    with pytest.raises(InteropError, match="short_factor"):
        import_config(cfg)


def test_a_negative_factor_is_refused_by_the_imported_scheme_too():
    """What import-hf writes carries the grids' constraints, so a -P override is checked where it is given."""
    for t in ("linear", "dynamic", "llama3", "yarn", "longrope"):
        text = import_config(config(t))
        assert not [d for d in check(text) if d.severity == "error"]
        for override in ({"factor": "-4"}, {"base": "1"}):
            with pytest.raises(PedslError) as err:
                load(text, override)
            assert err.value.code == "E303", err.value.render()


@pytest.mark.parametrize("model_type, name", [("llamé", "llam_default"), ("Qwen2.5", "qwen2_5_default"),
                                              ("2b", "m_2b_default"), ("scheme", "scheme_default"),
                                              ("a\nb\"c", "a_b_c_default"), ("", "model_default"),
                                              ("x" * 300, "x" * 92 + "_default")])
def test_the_name_from_model_type_is_a_valid_name(model_type, name, tmp_path):
    from pedsl.hf.rope import scheme_name

    text = import_config(config("default"), name=scheme_name({"model_type": model_type}, "default"))
    assert load(text).name == name[:100].rstrip("_")
    if model_type:  # a model type pedsl has not been taught is refused, never read as Llama's rope
        with pytest.raises(InteropError, match="does not know how model_type") as err:
            import_config({**config("default"), "model_type": model_type})
        assert err.value.code == "E961" and "field model_type" in str(err.value)


@pytest.mark.parametrize("name", ["café", "scheme", "qk", "a\nb", "", "1x", "a b", "x" * 101, "int"])
def test_a_name_that_cannot_be_written_is_a_usage_error(name, tmp_path):
    src = tmp_path / "config.json"
    src.write_text(json.dumps(config("default")))
    code, out, err = run_cli("import-hf", src, "--name", name, "-o", tmp_path / "out.pe")
    assert code == 2 and "--name" in err, err
    assert not (tmp_path / "out.pe").exists()
    with pytest.raises(InteropError, match="scheme name"):
        import_config(config("default"), name=name)


def test_a_valid_name_is_used():
    assert load(import_config(config("yarn"), name="my_yarn_8k")).name == "my_yarn_8k"


@pytest.mark.parametrize("rope_type, key, value, field", [
    ("linear", "factor", -4.0, "rope_parameters.factor"),
    ("llama3", "high_freq_factor", 0.5, "rope_parameters.high_freq_factor"),
    ("yarn", "beta_fast", -1.0, "rope_parameters.beta_fast"),
])
def test_the_written_text_is_checked_behind_the_value_checks(rope_type, key, value, field, monkeypatch):
    """With a value check switched off, the check of the written text still refuses, naming the field of the
    line at fault (and of the lets that line uses)."""
    from pedsl.hf import rope_knobs

    monkeypatch.setitem(rope_knobs._KNOBS, key, (lambda v, s: True, ""))
    cfg = config(rope_type)
    cfg["rope_parameters"][key] = value
    with pytest.raises(InteropError) as err:
        import_config(cfg)
    assert "would not check" in str(err.value) and field in str(err.value), str(err.value)

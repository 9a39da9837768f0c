"""Config models: presets, the resolution order, flat keys, YAML round trips, clear errors."""

from __future__ import annotations


import pytest

from pedsl.config import (PRESETS, DataConfig, EvalConfig, ModelConfig, TrainConfig, eval_block_keys,
                          resolve_eval_config, resolve_train_config, train_block_keys)
from pedsl.errors import ConfigError
from compiler_helpers import SCHEMES



def test_presets_are_valid_and_head_dim_derives():
    for name in PRESETS:
        cfg = resolve_train_config(overrides={"preset": name})
        assert cfg.preset == name and cfg.model.d_model % cfg.model.n_heads == 0
    tiny = resolve_train_config()
    assert (tiny.model.n_layers, tiny.model.d_model, tiny.model.n_heads, tiny.model.head_dim) == (2, 128, 4, 32)
    base = resolve_train_config(overrides={"preset": "base"}).model
    assert (base.n_layers, base.d_model, base.n_heads) == (16, 768, 12)
    assert ModelConfig(d_model=64, n_heads=2).head_dim == 32


def test_order_defaults_preset_block_overrides():
    cfg = resolve_train_config(block={"steps": 100, "d_model": 64, "data": "passkey", "model.n_layers": 3},
                               overrides={"steps": 7, "lr": 1e-3, "data.seed": 5})
    assert cfg.steps == 7 and cfg.lr == 1e-3  # override beats block
    assert cfg.model.d_model == 64 and cfg.model.n_heads == 4 and cfg.model.head_dim == 16  # head_dim re-derived
    assert cfg.model.n_layers == 3 and cfg.data.source == "passkey" and cfg.data.seed == 5
    assert cfg.context == PRESETS["tiny"]["context"]
    # an override that resizes re-derives head_dim even when the block (a full train.yaml) gave one
    full = resolve_train_config().model_dump(mode="json")
    assert resolve_train_config(block=full, overrides={"d_model": 64}).model.head_dim == 16
    assert resolve_train_config(block=full, overrides={"d_model": 64, "head_dim": 32}).model.head_dim == 32


@pytest.mark.parametrize("key,hint", [("setps", "steps"), ("d_modle", "d_model"), ("model.n_layer", "n_layers")])
def test_unknown_keys_get_did_you_mean(key, hint):
    with pytest.raises(ConfigError) as exc:
        resolve_train_config(overrides={key: 1})
    assert f"'{hint}'" in exc.value.hint


def test_lr_override_brings_its_floor():
    assert resolve_train_config(overrides={"lr": 1e-4}).min_lr == pytest.approx(1e-5)
    assert resolve_train_config(overrides={"lr": 1e-4, "min_lr": 0}).min_lr == 0
    with pytest.raises(ConfigError, match="min_lr"):
        resolve_train_config(overrides={"lr": 1e-4, "min_lr": 1e-3})


def test_unknown_preset_and_bad_value():
    with pytest.raises(ConfigError, match="unknown preset 'tinny'") as exc:
        resolve_train_config(overrides={"preset": "tinny"})
    assert "'tiny'" in exc.value.hint
    with pytest.raises(ConfigError, match="invalid value for 'steps'"):
        resolve_train_config(overrides={"steps": 0})
    with pytest.raises(ConfigError, match="not divisible"):
        resolve_train_config(overrides={"d_model": 30, "n_heads": 4})


def test_yaml_round_trip_and_bad_yaml(tmp_path):
    cfg = resolve_train_config(scheme="schemes/rope.pe", params={"base": 500.0}, overrides={"steps": 3})
    f = tmp_path / "train.yaml"
    f.write_text(cfg.to_yaml())
    assert TrainConfig.from_yaml(f) == cfg
    f.write_text(cfg.to_yaml().replace("steps:", "setps:"))
    with pytest.raises(ConfigError, match="unknown setting 'setps'") as exc:
        TrainConfig.from_yaml(f)
    assert "'steps'" in exc.value.hint
    f.write_text(cfg.to_yaml().replace("  d_model:", "  d_modle:"))
    with pytest.raises(ConfigError, match="unknown setting 'model.d_modle'") as exc:
        TrainConfig.from_yaml(f)
    assert "'d_model'" in exc.value.hint
    f.write_text("steps: [")
    with pytest.raises(ConfigError, match="not valid YAML"):
        TrainConfig.from_yaml(f)
    with pytest.raises(ConfigError, match="does not exist"):
        TrainConfig.from_yaml(tmp_path / "nope.yaml")


def test_eval_config_defaults_scale_with_context(tmp_path):
    ev = resolve_eval_config(context=64)
    assert ev.lengths == [64, 128, 256, 512, 1024, 2048] and ev.analyze_lengths == [64, 256, 1024]
    assert ev.tasks == ["ppl", "passkey", "blocks"]
    with pytest.raises(ConfigError, match="unknown evaluation setting 'lenghts'"):
        resolve_eval_config(block={"lenghts": [1]})
    f = tmp_path / "eval.yaml"
    f.write_text(ev.to_yaml())
    assert EvalConfig.from_yaml(f) == ev


def test_block_keys_cover_flat_and_dotted_names():
    keys = train_block_keys()
    assert {"steps", "context", "d_model", "n_layers", "source", "data.seed", "model.d_model", "preset"} <= keys
    assert "lengths" in eval_block_keys()


def test_digest_ignores_resumable_fields():
    a = resolve_train_config(overrides={"steps": 10})
    assert a.digest() == resolve_train_config(overrides={"steps": 20, "log_every": 3}).digest()
    assert a.digest() != resolve_train_config(overrides={"lr": 1e-4}).digest()


def test_data_config_checks_block_offset():
    with pytest.raises(ValueError):
        DataConfig(block_len=4, block_offset=3)


def test_from_real_scheme_train_and_eval_blocks():
    from pedsl.scheme_config import eval_config_from_scheme, train_config_from_scheme

    cfg = train_config_from_scheme(SCHEMES / "rope.pe", params={"train_length": 64}, overrides={"steps": 5})
    assert cfg.context == 64 and cfg.steps == 5 and cfg.params == {"train_length": 64}
    ev = eval_config_from_scheme(SCHEMES / "rope.pe", params={"train_length": 64})
    assert ev.lengths == [64 * m for m in (1, 2, 4, 8, 16, 32)] and ev.context == 64

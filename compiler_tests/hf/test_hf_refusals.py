"""The refused Hugging Face model types (pedsl/hf/refusals.py): each refused by import-hf with its own reason,
naming the model type and what pedsl cannot carry, one test per reason group."""

from __future__ import annotations

import json

import pytest

from pedsl.errors import InteropError
from pedsl.hf import import_config
from pedsl.hf.refusals import GROUPS, REFUSED
from pedsl.hf.registry import REGISTRY
from compiler_tests.compiler_helpers import run_cli

SMALL = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "head_dim": 16}
# What each group's reasons must say (a phrase of the cause), in the refusal of every type of the group.
PHRASES = {
    "encoder": r"bidirectional",
    "M-RoPE": r"M-RoPE .* mrope_section",
    "own attention code": r"own attention code",
    "sparse or compressed keys": r"(indexer|compress_rate)",
    "content-dependent bias": r"hidden-state-conditioned relative position bias .* rel_extent",
    "per-layer shapes": r"(head_dim|heads|rope parameters)",
    "scale pedsl cannot undo": r"(scale|mscale)",
    "untaught rope type": r"rope_type 'proportional'",
}


def test_every_refused_type_is_in_one_group_and_refused_by_the_registry():
    grouped = [mt for types in GROUPS.values() for mt in types]
    assert sorted(grouped) == sorted(REFUSED) and len(set(grouped)) == len(grouped)
    assert set(PHRASES) == set(GROUPS)
    for mt, why in REFUSED.items():
        assert REGISTRY[mt].refused == why
        assert "does not know how" not in why, mt


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_each_refusal_names_its_model_type_and_its_cause(group):
    for mt in GROUPS[group]:
        with pytest.raises(InteropError, match=rf"model_type '{mt}' .*{PHRASES[group]}") as err:
            import_config({**SMALL, "model_type": mt})
        assert err.value.diagnostics[0].code == "E961"


def test_the_cli_refuses_with_the_reason(tmp_path):
    f = tmp_path / "config.json"
    f.write_text(json.dumps({**SMALL, "model_type": "dory"}))
    code, out, err = run_cli("import-hf", f)
    assert code not in (0, 3) and not out and "model_type 'dory'" in err and "sqk" in err


def test_a_vision_language_config_is_refused_by_its_text_models_reason():
    cfg = {"model_type": "gemma4", "text_config": {**SMALL, "model_type": "gemma4_text"}}
    with pytest.raises(InteropError, match="global_head_dim"):
        import_config(cfg)

"""Every output path option refuses a path the system cannot hold (a name past 255 bytes, a path past
4095) with one clear error naming the limit, before anything runs: never exit 3 (`OSError: [Errno 36]
File name too long`), nothing created."""

from __future__ import annotations

import json

import pytest

from compiler_helpers import ROOT, run_cli
from pedsl.errors import OutputError
from pedsl.fsio import check_path

LONG = "a" * 300


def _commands(out, cfg=None):
    return {
        "compile": ["compile", "rope", "-o", out],
        "compile-child": ["compile", "rope", "-o", out / "x"],
        "train": ["train", "rope", "--preset", "tiny", "--steps", "1", "-q", "--out", out / "r"],
        "compare": ["compare", "rope", "--steps", "1", "-q", "--out", out],
        "profile": ["profile", "--out", out, ROOT / "README.md"],
        "eval": ["eval", out.parent, "--out", out / "e.json"],
        "analyze": ["analyze", out.parent, "--out", out / "a.json"],
        "import-hf": ["import-hf", cfg, "-o", out / "s.pe"],
    }


@pytest.mark.parametrize("which", list(_commands(ROOT)))
def test_an_output_name_past_255_bytes_is_a_clear_error(tmp_path, which):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "rope_theta": 10000.0, "hidden_size": 64,
                               "num_attention_heads": 4, "max_position_embeddings": 128}))
    out = tmp_path / "o" / LONG
    code, _, err = run_cli(*_commands(out, cfg)[which])
    assert code == 1, (code, err)
    assert "is 300 bytes, and a file or folder name has at most 255" in err
    assert not (tmp_path / "o").exists()


def test_check_path_limits():
    check_path("a" * 255)
    with pytest.raises(OutputError, match="has at most 255"):
        check_path("x/" + "é" * 128)  # 256 bytes in UTF-8
    with pytest.raises(OutputError, match="a path has at most 4095"):
        check_path("/".join(["b" * 200] * 21))

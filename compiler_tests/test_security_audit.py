"""Adversarial inputs found while verifying issue 11 (security and integrity), one test each.

Each failed before its fix: an internal error (exit 3), a silent wrong result or a hang.
"""

from __future__ import annotations

import json

import pytest
import torch

from pedsl.train import checkpoint as ck


def _saved_and_fresh():
    """A saved AdamW state (one step taken) and a fresh optimizer built with the same settings."""
    def build(model):
        return torch.optim.AdamW([{"params": [model.weight], "weight_decay": 0.1},
                                  {"params": [model.bias], "weight_decay": 0.0}], lr=1e-3, betas=(0.9, 0.99),
                                 foreach=False)

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optim = build(model)
    model(torch.randn(4, 3)).sum().backward()
    optim.step()
    flat, groups = ck.flatten_optimizer(optim)
    model_t = {k: v.detach().clone() for k, v in model.state_dict().items()}
    state = {"param_groups": json.loads(json.dumps(groups))}  # as state.json holds it
    fresh = torch.nn.Linear(3, 2)
    return model_t, flat, state, fresh, build(fresh)


@pytest.mark.parametrize("key, value", [("maximize", True), ("eps", -1.0), ("amsgrad", True), ("capturable", True),
                                        ("betas", [2.0, -1.0]), ("weight_decay", float("nan")), ("foreach", True)])
def test_a_hand_edited_optimizer_setting_in_state_json_is_refused(key, value):
    """`maximize: true` in state.json resumed into gradient ascent (the loss rose, exit 0); `amsgrad` or
    `capturable` crashed the first step with exit 3. The run's config decides them: a difference is refused."""
    model_t, flat, state, fresh, optim = _saved_and_fresh()
    state["param_groups"][0][key] = value
    with pytest.raises(ValueError, match=f"optimizer group 0 has {key} = "):
        ck.load_into(fresh, optim, model_t, flat, state)


def test_the_saved_learning_rate_may_differ_and_the_state_is_restored():
    """The schedule sets lr every step, so the saved one is not a setting; the moments load unchanged."""
    model_t, flat, state, fresh, optim = _saved_and_fresh()
    for g in state["param_groups"]:
        g["lr"] = 123.0
    ck.load_into(fresh, optim, model_t, flat, state)
    assert torch.equal(optim.state[fresh.weight]["exp_avg"], flat["state.0.exp_avg"])
    assert all(g["lr"] == 123.0 for g in optim.param_groups)
    assert torch.equal(fresh.weight, model_t["weight"])


def test_running_out_of_memory_within_the_caps_is_a_diagnostic(schemes_dir):
    """The caps bound single tensors (2 GiB), not a whole command: `diff --numeric` of two data-dependent
    schemes at 32 samples x 8192 positions needs more than 1 GB. Out of memory was exit 3 ('a bug in pedsl')."""
    from compiler_helpers import run_capped

    code, out = run_capped(["-m", "pedsl", "diff", str(schemes_dir / "path.pe"), str(schemes_dir / "fox.pe"),
                            "--numeric", "--lmax", "8192", "--samples", "32"], mem_gb=1.0, timeout=120)
    assert code == 1, out[-2000:]
    assert "error[E970]: out of memory" in out and "lower them" in out
    assert "internal error" not in out and "Traceback" not in out


@pytest.mark.parametrize("key, value", [("lr", float("inf")), ("lr", float("nan")), ("weight_decay", float("inf")),
                                        ("grad_clip", float("inf")), ("model.init_std", float("inf")),
                                        ("data.val_fraction", float("nan"))])
def test_config_floats_must_be_finite(key, value):
    """`lr: .inf` in train.yaml (or --lr inf, --set) passed `lr > 0`, trained one step and ended
    'done: val loss nan' with exit 0."""
    from pedsl.config import resolve_train_config
    from pedsl.errors import ConfigError

    with pytest.raises(ConfigError, match="finite number"):
        resolve_train_config(scheme="rope", overrides={key: value})


@pytest.mark.parametrize("link", [False, True])
def test_a_train_yaml_naming_a_file_that_is_not_a_scheme_never_quotes_it(tmp_path, link):
    """`scheme: /proc/self/environ` in a train.yaml printed the start of the environment in the
    parse error, as `import` once did; a .pe link to such a file too."""
    from compiler_helpers import run_cli

    secret = tmp_path / "secret.txt"
    secret.write_text("TOKEN=hunter2 do not print\n")
    target = secret
    if link:
        target = tmp_path / "innocent.pe"
        target.symlink_to(secret)
    cfg = tmp_path / "train.yaml"
    cfg.write_text(f"scheme: {target}\n")
    code, out, err = run_cli("train", cfg, "--out", tmp_path / "run", "--steps", "1")
    assert code == 1 and "is not a .pe file" in err
    assert "hunter2" not in out + err and not (tmp_path / "run").exists()


def test_a_huge_planted_checkpoint_file_is_hashed_streamed_never_loaded(tmp_path):
    """A 6 GB sparse model.safetensors was read whole before its hash was compared (eval or
    --resume: MemoryError under a 4 GB cap, all of it otherwise). Now it is refused in 1 MiB reads."""
    import os
    import tracemalloc

    from pedsl.errors import CheckpointError

    model = torch.nn.Linear(3, 2)
    optim = torch.optim.AdamW(model.parameters())
    path = ck.save_checkpoint(tmp_path / "checkpoints", 1, model, optim, {}, keep=1)
    with open(path / "model.safetensors", "r+b") as f:
        f.truncate(320 << 20)  # sparse: costs no disk
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match=r"corrupt or truncated \(335544320 bytes"):
            ck.read_checkpoint(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 128 << 20, peak  # state.json is read with a 64 MiB limit; the 320 MiB file never whole
    os.truncate(path / "model.safetensors", 0)
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        ck.read_checkpoint(path)
    path2 = ck.save_checkpoint(tmp_path / "ok", 2, model, optim, {}, keep=1)
    model_t, _, state = ck.read_checkpoint(path2)  # an intact one still loads
    assert state["step"] == 2 and torch.equal(model_t["weight"], model.weight.detach())


def test_resume_streams_a_planted_metrics_file_and_skips_lines_that_are_not_records(tmp_path):
    """--resume read metrics.jsonl whole (a 6 GB sparse file: out of memory), and a line that was JSON
    but no record (`[1]`, `{"step": "x"}`) was an internal error (exit 3)."""
    import tracemalloc

    from pedsl.train.loop import _truncate_metrics

    f = tmp_path / "metrics.jsonl"
    good = [{"step": 1, "loss": 2.0}, {"step": 3, "loss": 1.0}]
    f.write_text("[1]\n5\n" + json.dumps(good[0]) + '\n{"step": "x"}\n' + json.dumps(good[1]) + "\n"
                 + json.dumps({"step": 9}) + "\n")
    _truncate_metrics(f, 3)
    assert [json.loads(line) for line in f.read_text().splitlines()] == good
    with open(f, "ab") as fh:
        fh.truncate(f.stat().st_size + (200 << 20))  # 200 MiB of zeros, no newline: no record
    tracemalloc.start()
    try:
        _truncate_metrics(f, 3)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, peak
    assert [json.loads(line) for line in f.read_text().splitlines()] == good


def test_study_and_run_json_files_are_read_with_a_limit(tmp_path):
    """DONE.json / eval.json / analysis.json were read whole (eval: 'run cannot be opened: MemoryError')."""
    from pedsl.study.common import read_json

    f = tmp_path / "DONE.json"
    f.write_text('{"val_loss": 1.5}')
    assert read_json(f) == {"val_loss": 1.5}
    with open(f, "ab") as fh:
        fh.truncate(200 << 20)
    import tracemalloc

    tracemalloc.start()
    try:
        assert read_json(f) is None  # over the limit: treated as damaged, never loaded whole
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak


def test_the_scheme_cannot_be_replaced_through_set_or_a_train_block(tmp_path):
    """`--set scheme=/proc/self/environ` (or `train { scheme = "..." }`) trained the scheme given and recorded
    the other path in the run's config.yaml, which later commands then read."""
    from compiler_helpers import run_cli

    from pedsl.config import resolve_train_config
    from pedsl.errors import ConfigError

    with pytest.raises(ConfigError, match="override: 'scheme' cannot be set here"):
        resolve_train_config(scheme="rope", overrides={"scheme": "/proc/self/environ"})
    assert resolve_train_config(scheme="rope", block={"scheme": "rope"}).scheme == "rope"  # a full dump is fine
    pe = tmp_path / "s.pe"
    pe.write_text('scheme s {\n  qk: rotate(geometric(100.0) * position)\n  train { scheme = "/proc/self/environ" }\n}\n')
    code, out, err = run_cli("check", pe)
    assert code == 1 and "s.pe:3:11: error[E213]: train block: 'scheme' cannot be set here" in out + err


@pytest.mark.parametrize("config, needle", [
    ("[" * 100000 + "]" * 100000, "JSON nested too deeply"),  # RecursionError: exit 3
    ('{"rope_theta": "abc", "head_dim": 64, "num_attention_heads": 8}', "'rope_theta' must be a number"),  # exit 3
    ('{"rope_theta": [1], "head_dim": 64, "num_attention_heads": 8}', "'rope_theta' must be a number"),  # exit 3
    ('{"rope_theta": 1e400, "head_dim": 64, "num_attention_heads": 8}', "'rope_theta' must be a finite"),  # base = inf
    ('{"head_dim": 1' + "0" * 400 + ', "num_attention_heads": 8}', "'head_dim' must be a finite number"),  # exit 3
])
def test_import_hf_refuses_malformed_configs(tmp_path, config, needle):
    from compiler_helpers import run_cli

    f = tmp_path / "config.json"
    f.write_text(config)
    code, out, err = run_cli("import-hf", f)
    assert code == 1 and "error[E963]" in err and needle in err, err


def test_import_hf_config_text_cannot_inject_pe_source(tmp_path):
    """model_type went unescaped into the written .pe's comment and description: a newline or a quote
    in it added lines of scheme source (here a second scheme) to the imported file. An untaught
    model_type is now refused before anything is written, and the refusal quotes it on one line."""
    from compiler_helpers import run_cli

    f = tmp_path / "config.json"
    hostile = 'x config" {\n}\nscheme evil "'
    f.write_text(json.dumps({"model_type": hostile, "head_dim": 64, "num_attention_heads": 8,
                             "rope_theta": 10000.0}))
    code, out, err = run_cli("import-hf", f, "-o", tmp_path / "m.pe")
    assert code == 1 and "error[E961]" in err, err
    assert not (tmp_path / "m.pe").exists()
    assert repr(hostile) in err and "\nscheme evil" not in err, err

"""Resource caps (pedsl/limits.py) and values the checker can prove will fail later.

Each case here used to exhaust memory, end in an internal error (exit 3) or pass `pedsl check`
and fail (or train to NaN) later; now each is a positioned diagnostic or a one-paragraph error.
"""

from __future__ import annotations

import math

import pytest

from compiler_helpers import first_error, run_cli
from pedsl import limits
from pedsl.config import resolve_eval_config, resolve_train_config
from pedsl.errors import ConfigError, PedslError
from pedsl.lang.api import check, load


ROPE = "qk: rotate(geometric(10000) * position)"

# (source, code, line, col, a fragment of the message)
CHECKER_CASES = {
    "head_dim_huge": ("scheme hd { param head_dim: int = 2000000000 }\n", "E212", 1, 13, "head_dim"),
    "heads_zero_param": ("scheme s { param heads: int = 0\n bias = -slopes(heads) * distance }\n", "E212", 1, 12,
                         "heads"),
    "slopes_huge": ("scheme s { bias = -slopes(1000000000) * distance }\n", "E217", 1, 20, "slopes"),
    "slopes_zero": ("scheme s { bias = -slopes(0) * distance }\n", "E217", 1, 20, "slopes"),
    "slopes_in_let": ("scheme s {\n let m = slopes(0)\n bias = -m * distance }\n", "E217", 2, 10, "slopes"),
    "sqrt_neg_temperature": ("scheme s { temperature = sqrt(-1) }\n", "E217", 1, 26, "sqrt"),
    "temperature_overflow": ("scheme s { temperature = 1e30 * 1e30 }\n", "E217", 1, 26, "temperature"),
    "temperature_literal_beyond_float32": ("scheme s { temperature = 1e300 }\n", "E217", 1, 26, "float32"),
    "temperature_above_cap": ("scheme s { temperature = 1e5 }\n", "E217", 1, 26, "temperature"),
    "temperature_far": ("scheme s { temperature = log_length(2) * 1000 }\n", "E217", 1, 26, "temperature"),
    "log_length_one": ("scheme s { temperature = log_length(1) }\n", "E217", 1, 37, "log_length"),
    "log_length_zero": ("scheme s { temperature = log_length(0) }\n", "E217", 1, 37, "log_length"),
    "dynamic_ntk_original_zero": ("scheme s { qk: rotate(dynamic_ntk(10000, 2, original = 0) * position) }\n",
                                  "E217", 1, 23, "original"),
    "ntk_factor_negative": ("scheme s { qk: rotate(ntk(10000, -2) * position) }\n", "E217", 1, 23, "factor"),
    "yarn_original_zero": ("scheme s { qk: rotate(yarn(10000, 4, original = 0) * position) }\n", "E217", 1, 23,
                           "original"),
    "llama3_base_one": ("scheme s { qk: rotate(llama3(1, 4, original = 64) * position) }\n", "E217", 1, 23, "base"),
    "linear_rank_negative": ("scheme s { qk: accumulate(rotation(linear(x, rank = -5))) }\n", "E217", 1, 53, "rank"),
    "linear_rank_huge": ("scheme s { qk: accumulate(rotation(linear(x, rank = 100000000))) }\n", "E217", 1, 53,
                         "rank"),
    "shortconv_width_zero": ("scheme s { qk: accumulate(householder(w = normalize(shortconv(linear(x, to = channel),"
                             " width = 0)), beta = 2)) }\n", "E217", 1, 96, "width"),
    "frozen_random_seed_huge": ("scheme s { qk: accumulate(rotation(frozen_random(token, seed = 100000000000000000000000)"
                                ")) }\n", "E217", 1, 64, "seed"),
    "gate_rank_negative": ("scheme s { bias = accumulate(log_sigmoid(linear(x, to = head, rank = -1))) }\n", "E217",
                           1, 70, "rank"),
    "overflow_in_phase": ("scheme s { qk: rotate(geometric(10000) * position * 1e308 * 10) }\n", "E217", 1, 23,
                          "finite"),
    "overflow_in_bias": ("scheme s { bias = -1e30 * 1e30 * distance }\n", "E217", 1, 19, "finite"),
    "overflow_in_param_default": ("scheme s { param a: float = 1e308 * 10\n " + ROPE + " }\n", "E217", 1, 29,
                                  "finite"),
    "eval_lengths_negative": ("scheme s { " + ROPE + "\n eval { lengths = [-5, 0] } }\n", "E213", 2, 9, "lengths"),
    "eval_windows_huge": ("scheme s { " + ROPE + "\n eval { windows = 100000000 } }\n", "E213", 2, 9, "windows"),
    "train_layers_huge": ("scheme s { " + ROPE + "\n train { n_layers = 100000 } }\n", "E213", 2, 10, "n_layers"),
    "train_context_huge": ("scheme s { param train_length: int = 100000000\n " + ROPE
                           + "\n train { context = train_length } }\n", "E213", 3, 10, "context"),
    "train_seed_huge": ("scheme s { " + ROPE + "\n train { seed = 100000000000000000000000 } }\n", "E213", 2, 10,
                        "seed"),
}


@pytest.mark.parametrize("name", sorted(CHECKER_CASES))
def test_checker_refuses_with_a_position(name):
    text, code, line, col, fragment = CHECKER_CASES[name]
    d = first_error(text)
    assert (d.code, d.line, d.col) == (code, line, col), d.render()
    assert fragment in d.message, d.render()


@pytest.mark.parametrize("param,value", [("heads", 2_000_000_000), ("head_dim", 10**9), ("heads", 0)])
def test_structural_override_is_capped(param, value):
    text = "scheme s { bias = -slopes(heads) * distance }\n"
    with pytest.raises(PedslError) as info:
        load(text, {param: str(value)})
    assert info.value.code in ("E303",) and info.value.line == 1, info.value.render()


def test_structural_shape_from_the_api_is_capped():
    with pytest.raises(PedslError) as info:
        load("scheme s { " + ROPE + " }\n", heads=4, head_dim=1 << 20)
    assert "head_dim" in str(info.value)


def test_library_is_within_the_caps(schemes_dir):
    for path in sorted(schemes_dir.glob("*.pe")):
        errors = [d for d in check(path) if d.severity == "error"]
        assert not errors, [d.render() for d in errors]


def test_valid_values_next_to_the_caps_pass():
    ok = (f"scheme s {{ param heads: int = {limits.MAX_HEADS}\n"
          f" bias = -slopes(heads) * distance\n temperature = log_length(2) * 2 }}\n")
    assert not [d for d in check(ok) if d.severity == "error"]


# ------------------------------------------------------------------ configuration models

@pytest.mark.parametrize("overrides,fragment", [
    ({"n_layers": 100000}, "n_layers"),
    ({"d_model": 10**7}, "d_model"),
    ({"n_layers": 1000, "d_model": 8192}, "parameters"),
    ({"vocab_size": 10**9}, "vocab_size"),
    ({"batch_size": 10**6}, "batch_size"),
    ({"batch_size": 65536, "context": 65536}, "GiB"),
    ({"batch_size": 4096, "context": 4096}, "training step"),
    ({"context": 10**8}, "context"),
    ({"steps": 10**12}, "steps"),
    ({"seed": 10**23}, "seed"),
    ({"seed": -1}, "seed"),
    ({"threads": 100000}, "threads"),
    ({"data.max_bytes": 10**12}, "max_bytes"),
])
def test_train_config_caps(overrides, fragment):
    with pytest.raises(ConfigError) as info:
        resolve_train_config(overrides=overrides)
    assert fragment in str(info.value)


@pytest.mark.parametrize("block,fragment", [
    ({"lengths": [-5, 0]}, "lengths"),
    ({"lengths": [10**9]}, "lengths"),
    ({"lengths": list(range(1, 5000))}, "lengths"),
    ({"windows": 10**9}, "windows"),
    ({"windows": 60000, "lengths": [1 << 20]}, "GiB"),
    ({"seed": 10**23}, "seed"),
])
def test_eval_config_caps(block, fragment):
    with pytest.raises(ConfigError) as info:
        resolve_eval_config(block=block)
    assert fragment in str(info.value)


def test_model_parameter_estimate_matches_the_model():
    from torch import nn

    from pedsl.config import ModelConfig
    from pedsl.model import TransformerLM

    for cfg in (ModelConfig(), ModelConfig(n_layers=3, d_model=96, n_heads=3, head_dim=16, mlp_ratio=2.5,
                                           tie_embeddings=False)):
        model = TransformerLM(cfg, lambda i: nn.Identity())
        real = sum(p.numel() for p in model.parameters() if p.dim() > 1)
        est = limits.model_parameters(vocab_size=cfg.vocab_size, n_layers=cfg.n_layers, d_model=cfg.d_model,
                                      n_heads=cfg.n_heads, head_dim=cfg.head_dim, mlp_ratio=cfg.mlp_ratio,
                                      tie_embeddings=cfg.tie_embeddings)
        assert est == real


# ------------------------------------------------------------------ command-line options

def test_check_head_dim_through_the_cli(tmp_path):
    f = tmp_path / "hd.pe"
    f.write_text("scheme hd { param head_dim: int = 2000000000 }\n")
    code, out, err = run_cli("check", f)
    assert code == 1 and "E212" in out + err


def test_check_heads_override_through_the_cli(tmp_path):
    f = tmp_path / "s.pe"
    f.write_text("scheme s { bias = -slopes(heads) * distance }\n")
    code, out, err = run_cli("check", "-P", "heads=2000000000", f)
    assert code == 1 and "E303" in out + err


@pytest.mark.parametrize("flag,value", [("--heads", "0"), ("--heads", "100000"), ("--head-dim", "0"),
                                        ("--head-dim", "1000000"), ("--d-model", "0")])
def test_compile_shape_options_are_checked(tmp_path, flag, value):
    code, _, err = run_cli("compile", "schemes/rope.pe", "-o", tmp_path / "out", flag, value)
    assert code == 2, err
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("limits") / "run"
    code, _, err = run_cli("train", "schemes/rope.pe", "--out", out, "--steps", "2", "--threads", "1",
                           "--context", "32", "--batch-size", "2", "--set", "n_layers=1", "--set", "d_model=32",
                           "--set", "n_heads=2", "--set", "head_dim=16", "--set", "data.max_bytes=20000", "-q")
    assert code == 0, err
    return out


@pytest.mark.parametrize("args,code,fragment", [
    (("eval", "{run}", "--windows", "1000000000"), 2, "--windows"),
    (("eval", "{run}", "--windows", "60000", "--lengths", "1048576"), 1, "GiB"),
    (("eval", "{run}", "--lengths", "2000000000"), 1, "limit"),
    (("eval", "{run}", "--threads", "100000"), 2, "--threads"),
    (("analyze", "{run}", "--samples", "1000000000"), 2, "--samples"),
    (("analyze", "{run}", "--samples", "1000", "--lengths", "4096"), 1, "GiB"),
    (("analyze", "{run}", "--threads", "5000"), 2, "--threads"),
])
def test_eval_and_analyze_sizes_are_capped(tiny_run, args, code, fragment):
    got, out, err = run_cli(*[a.format(run=tiny_run) for a in args])
    assert got == code, out + err
    assert fragment in out + err


@pytest.mark.parametrize("args,fragment", [
    (("--seed", str(10**23)), "seed"),
    (("--threads", "5000"), "threads"),
    (("--threads", "100000"), "threads"),
    (("--batch-size", str(10**8)), "batch_size"),
    (("--set", "n_layers=100000"), "n_layers"),
    (("--device", "cuda:9"), "cuda:9"),
    (("--device", "meta"), "meta"),
])
def test_train_options_are_capped(tmp_path, args, fragment):
    code, out, err = run_cli("train", "schemes/rope.pe", "--out", tmp_path / "run", "--steps", "1", *args, "-q")
    assert code == 1, out + err
    assert fragment in out + err


def test_compare_seed_is_capped(tmp_path):
    code, _, err = run_cli("compare", "rope", "--out", tmp_path / "c", "--seed", str(10**23))
    assert code == 2 and "--seed" in err


def test_diff_numeric_size_is_capped():
    code, out, err = run_cli("diff", "schemes/rope.pe", "schemes/path.pe", "--numeric", "--lmax", "8192",
                             "--samples", "1024")
    assert code == 2 and "GiB" in out + err
    code, out, err = run_cli("diff", "schemes/rope.pe", "schemes/path.pe", "--numeric", "--seed", str(10**23))
    assert code == 2 and "--seed" in out + err


def test_setup_torch_refuses_thousands_of_threads():
    from pedsl.torchenv import setup_torch

    with pytest.raises(PedslError):
        setup_torch(5000)


# ------------------------------------------------------------------ files: import chains, loops, names

def test_a_long_import_chain_is_a_diagnostic(tmp_path):
    for i in range(500):
        imp = f'import "f{i + 1}.pe"\n' if i < 499 else ""
        (tmp_path / f"f{i}.pe").write_text(imp + f"scheme s{i} {{}}\n")
    code, out, err = run_cli("check", tmp_path / "f0.pe")
    assert code == 1
    assert "E208" in out + err and f"more than {limits.MAX_IMPORT_DEPTH}" in out + err


def test_too_many_imported_files_is_a_diagnostic(tmp_path):
    n = limits.MAX_IMPORTS + 5
    for i in range(n):
        (tmp_path / f"f{i}.pe").write_text(f"scheme s{i} {{}}\n")
    (tmp_path / "main.pe").write_text("".join(f'import "f{i}.pe"\n' for i in range(n)) + "scheme main {}\n")
    code, out, err = run_cli("check", tmp_path / "main.pe")
    assert code == 1 and "E208" in out + err and str(limits.MAX_IMPORTS) in out + err


@pytest.mark.parametrize("cmd", ["check", "show", "explain", "graph"])
def test_a_symlink_loop_is_a_diagnostic(tmp_path, cmd):
    (tmp_path / "a.pe").symlink_to(tmp_path / "b.pe")
    (tmp_path / "b.pe").symlink_to(tmp_path / "a.pe")
    (tmp_path / "main.pe").write_text('import "a.pe"\nscheme s {}\n')
    for target in ("a.pe", "main.pe"):
        code, out, err = run_cli(cmd, tmp_path / target)
        assert code == 1, out + err
        assert "symlink loop" in out + err or "symbolic links" in out + err


def test_a_file_name_that_is_not_utf8_is_never_an_internal_error(tmp_path):
    import os

    name = os.fsdecode(b"bad\xff.pe")
    src = tmp_path / name
    src.write_text("scheme alibi { bias = -slopes(heads) * distance }\n")
    for args in (("check", src), ("show", src), ("compile", src, "-o", tmp_path / "out")):
        code, out, err = run_cli(*args)  # asserts no traceback and no internal error
        assert code in (0, 1), out + err


def test_explain_context_and_bench_lengths_are_capped():
    code, _, err = run_cli("explain", "schemes/rope.pe", "--context", str(10**23))
    assert code == 2 and "--context" in err
    import click

    from benchmarks.cli import _ints

    with pytest.raises(click.UsageError, match="at most"):
        _ints("512,1000000000", "--lengths")


def test_a_list_literal_is_capped():
    items = ", ".join(["1"] * (limits.MAX_LIST + 1))
    d = first_error(f"scheme s {{ {ROPE}\n eval {{ lengths = [{items}] }} }}\n")
    assert d.code == "E217" and "limit" in d.message


@pytest.mark.parametrize("key", ["lr", "grad_clip", "weight_decay", "mlp_ratio", "init_std"])
def test_config_floats_must_be_finite(key):
    with pytest.raises(ConfigError, match=key):
        resolve_train_config(overrides={key: math.inf})


def test_train_yaml_with_huge_sizes_is_a_config_error(tmp_path):
    from pedsl.config import TrainConfig

    path = tmp_path / "train.yaml"
    path.write_text("model:\n  n_layers: 100000\n")
    with pytest.raises(ConfigError, match="n_layers"):
        TrainConfig.from_yaml(path)
    path.write_bytes(b"x" * (2 << 20))
    with pytest.raises(ConfigError, match="larger than"):
        TrainConfig.from_yaml(path)


def test_compare_set_value_that_is_not_yaml():
    from pedsl.cli.study import _sets

    values = _sets(("context=[",))  # was: a yaml ParserError, exit 3
    assert values == {"context": "["}
    with pytest.raises(ConfigError, match="context"):
        resolve_train_config(overrides=values)


def test_dynamic_ntk_is_checked_at_the_longest_length():
    # fine up to its original length, an overflow past it: the checker probes the longest sequence too
    d = first_error("scheme s { qk: rotate(dynamic_ntk(10000, 1e300, original = 128) * position) }\n")
    assert d.code == "E217" and "dynamic_ntk" in d.message and (d.line, d.col) == (1, 23)


def test_a_number_beyond_float32_next_to_a_runtime_value():
    d = first_error("scheme s { qk: accumulate(householder(w = normalize(linear(x, to = channel)),"
                    " beta = 1e300 * sigmoid(linear(x, to = head)))) }\n")
    assert d.code == "E217" and "float32" in d.message and (d.line, d.col) == (1, 86)


def test_analyze_past_the_dense_length_is_sized_by_its_streamed_blocks(tiny_run, monkeypatch):
    """Far and sink mass stream over key blocks past DENSE_MAX, so the size cap counts one block of
    key columns there, not an L x L matrix (16384 tokens at 1 sample x 4 heads used to be refused
    as 4 GiB); a size that is too big even streamed is still refused."""
    from pedsl.study import analyze

    assert analyze._matrix_elements(1, 4, 16384, 32) * 8 < (1 << 30)
    assert analyze._matrix_elements(1, 4, 2048, 32) == 4 * 2048 * 2048
    monkeypatch.setattr(analyze, "DENSE_MAX", 32)
    res = analyze.analyze_run(tiny_run, lengths=[32, 256], samples=1)
    assert set(res["layers"][0]["far_mass"]) == {"32", "256"} and "256" not in res["layers"][0]["decoherence"]
    code, out, err = run_cli("analyze", str(tiny_run), "--samples", "1000", "--lengths", "4096")
    assert code == 1 and "streamed scores" in out + err

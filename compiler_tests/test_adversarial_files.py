"""Hostile files, folders and config text: a folder that only looks like a run, outputs through
links, YAML alias bombs and deep nesting, duplicate keys, one reading of ``-P``, paths with ``{``,
run folders that lie about their scheme, non-finite results and deterministic JSON."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from compiler_helpers import run_cli
from pedsl.errors import ConfigError, OutputError
from pedsl.train import rundir
from pedsl.train.loop import train
from train_helpers import helper, small_cfg

ROOT = Path(__file__).parent.parent
# nine levels of x9 (about 400 bytes, 9**9 items expanded): a YAML file, and the same on one line
BOMB = "".join(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}" if i else "x"] * 9) + "]\n" for i in range(9))
BOMB_FLOW = "[" + ", ".join(f"&l{i} [" + ", ".join([f"*l{i - 1}" if i else "x"] * 9) + "]" for i in range(9)) + "]"


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    monkeypatch.delenv("PEDSL_DEBUG", raising=False)


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): (b"<dir>" if p.is_dir() else p.read_bytes())
            for p in sorted(folder.rglob("*"))}


# ---------------------------------------------------------------------------------------------
# 1. a folder is a run only when pedsl proves it


def test_a_folder_that_looks_like_a_run_is_never_modified(tmp_path):
    user = tmp_path / "user"
    (user / "scheme").mkdir(parents=True)
    (user / "scheme.sha256").write_text("ab" * 32 + "\n")
    (user / "scheme" / "notes.txt").write_text("my notes\n")
    (user / "config.yaml").write_text("steps: 5\n")
    before = _tree(user)
    for resume in (False, True):
        with pytest.raises(OutputError, match="is not empty and is not a pedsl run folder"):
            train(small_cfg(steps=5), user, attention=helper.spec(), quiet=True, resume=resume)
        assert _tree(user) == before
    code, _, err = run_cli("train", "rope", "--out", user, "--steps", "1")
    assert code == 1 and "not a pedsl run folder" in err and _tree(user) == before


def test_a_run_carries_a_versioned_marker_and_resumes(tmp_path):
    run = tmp_path / "run"
    train(small_cfg(steps=5, checkpoint_every=5), run, attention=helper.spec(), quiet=True)
    assert json.loads((run / rundir.MARKER).read_text()) == {"pedsl": "run folder", "format": rundir.RUN_FORMAT}
    train(small_cfg(steps=10, checkpoint_every=5), run, attention=helper.spec(), quiet=True, resume=True)
    (run / rundir.MARKER).write_text(json.dumps({"pedsl": "run folder", "format": rundir.RUN_FORMAT + 1}))
    with pytest.raises(OutputError, match="run folder of a newer pedsl"):
        train(small_cfg(steps=15, checkpoint_every=5), run, attention=helper.spec(), quiet=True, resume=True)


def test_a_complete_run_from_before_the_marker_still_resumes_and_gets_the_marker(tmp_path):
    run = tmp_path / "run"
    train(small_cfg(steps=5, checkpoint_every=5), run, attention=helper.spec(), quiet=True)
    (run / rundir.MARKER).unlink()  # as the pedsl before the marker left it
    assert rundir.is_unmarked_run(run)
    train(small_cfg(steps=10, checkpoint_every=5), run, attention=helper.spec(), quiet=True, resume=True)
    assert rundir.marker_format(run) == rundir.RUN_FORMAT
    # the same folder with one more file under scheme/ is no longer provably a run: refused, untouched
    (run / rundir.MARKER).unlink()
    (run / "scheme" / "notes.txt").write_text("mine\n")
    before = _tree(run)
    with pytest.raises(OutputError, match="not a pedsl run folder"):
        train(small_cfg(steps=15, checkpoint_every=5), run, attention=helper.spec(), quiet=True, resume=True)
    assert _tree(run) == before


# ---------------------------------------------------------------------------------------------
# 2. nothing is written through a link


def test_diff_plot_goes_through_the_safe_writer(tmp_path):
    user = tmp_path / "user.png"
    user.write_text("precious\n")
    (tmp_path / "link.png").symlink_to(user)
    code, _, err = run_cli("diff", "rope", "alibi", "--plot", tmp_path / "link.png")
    assert code != 0 and "symbolic link" in err and user.read_text() == "precious\n"
    for bad, words in (("/dev/null", "without an extension"), (tmp_path / "x.txt", "'.txt' is not a figure format")):
        code, _, err = run_cli("diff", "rope", "alibi", "--plot", bad)
        assert code != 0 and words in err, err
    assert not (tmp_path / "x.txt").exists()
    code, _, err = run_cli("diff", "rope", "alibi", "--plot", tmp_path / "ok.svg")
    assert (tmp_path / "ok.svg").read_text().lstrip().startswith("<?xml"), err


@pytest.mark.parametrize("command", ["compile", "train"])
def test_an_output_folder_that_is_a_link_is_refused(tmp_path, command):
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    args = ("compile", "rope", "-o") if command == "compile" else ("train", "rope", "--steps", "1", "--out")
    code, _, err = run_cli(*args, tmp_path / "link")
    assert code == 1 and "symbolic link" in err, err
    assert list(target.iterdir()) == []


def test_no_module_writes_files_except_through_fsio():
    import re

    writers = re.compile(r"\.savefig\((?!buf)|open\([^)]*['\"][wa]b?['\"]|\.write_(text|bytes)\(|torch\.save\("
                         r"|save_file\(|json\.dump\(")
    # native_template.py is fsio's stand-in inside generated modules (which cannot import pedsl): the same atomic write
    found = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "pedsl").rglob("*.py"))
             if p.name not in ("fsio.py", "native_template.py")
             for i, line in enumerate(p.read_text().splitlines(), 1) if writers.search(line)]
    assert found == []


# ---------------------------------------------------------------------------------------------
# 3. YAML: no aliases, no deep nesting, short diagnostics


def _timed_cli(*args, limit: float = 20.0):
    import time

    t0 = time.perf_counter()
    code, out, err = run_cli(*args)
    assert time.perf_counter() - t0 < limit, "took too long: an alias was expanded?"
    assert len(out + err) < 5000, f"{len(out + err)} characters of diagnostics"
    return code, out + err


def test_alias_bombs_are_refused_by_every_yaml_reader(tmp_path):
    out = tmp_path / "out"
    for option in (f"context={BOMB_FLOW}", f"params={BOMB_FLOW}"):
        code, err = _timed_cli("train", "rope", "--out", out, "--set", option)
        assert code == 2 and "YAML aliases (*l0) are not accepted" in err, err
    code, err = _timed_cli("train", "rope", "--out", out, "-P", f"base={BOMB_FLOW}")  # -P is not YAML
    assert code == 1 and "E302" in err and "characters)" in err, err
    assert not out.exists()
    cfg = tmp_path / "train.yaml"
    cfg.write_text(BOMB + "scheme: rope\nparams: {base: *l8}\n")
    code, err = _timed_cli("train", cfg, "--out", out)
    assert code == 1 and "YAML aliases" in err and "train.yaml:2" in err, err
    assert not out.exists()
    run = tmp_path / "run"  # a run's own config.yaml
    train(small_cfg(steps=5, checkpoint_every=5), run, attention=helper.spec(), quiet=True)
    (run / "config.yaml").write_text(BOMB + (run / "config.yaml").read_text())
    code, err = _timed_cli("eval", run)
    assert code == 1 and "YAML aliases" in err, err


def test_deep_nesting_is_a_clear_error_in_every_yaml_reader(tmp_path):
    deep = "[" * 1000 + "]" * 1000
    code, err = _timed_cli("train", "rope", "--out", tmp_path / "out", "--set", f"context={deep}")
    assert code == 2 and "nested more than 64 levels deep" in err, err
    cfg = tmp_path / "train.yaml"
    cfg.write_text(f"scheme: rope\nparams: {{base: {deep}}}\n")
    code, err = _timed_cli("train", cfg)
    assert code == 1 and "nested more than 64 levels deep" in err, err
    run = tmp_path / "run"
    train(small_cfg(steps=5, checkpoint_every=5), run, attention=helper.spec(), quiet=True)
    (run / "config.yaml").write_text((run / "config.yaml").read_text() + f"extra: {deep}\n")
    code, err = _timed_cli("eval", run)
    assert code == 1 and "nested more than 64 levels deep" in err, err


def test_a_huge_value_is_quoted_short():
    from pedsl.errors import quoted

    assert len(quoted("x" * 10**6)) < 300 and quoted("x" * 10**6).endswith("(1,000,002 characters)")
    code, err = _timed_cli("train", "rope", "--set", "preset=" + "p" * 10**6)
    assert code == 1 and "unknown preset 'ppp" in err, err
    assert len(ConfigError("m" * 10**6).render()) < 5000  # the last guard: no diagnostic prints megabytes


# ---------------------------------------------------------------------------------------------
# 4. one reader per kind of input


@pytest.mark.parametrize("value", ["0x10", "10000 # c"])
def test_minus_p_reads_the_same_in_train_as_in_check(tmp_path, value):
    code_check, out, err = run_cli("check", "rope", "-P", f"base={value}")
    assert code_check == 1 and "E302" in out + err
    code, _, err = run_cli("train", "rope", "-P", f"base={value}", "--out", tmp_path / "out", "--steps", "1")
    assert code == 1 and "E302" in err, err
    assert not (tmp_path / "out").exists()


def test_duplicate_keys_are_errors(tmp_path):
    cfg = tmp_path / "train.yaml"
    cfg.write_text("scheme: rope\nsteps: 5\nsteps: 7\n")
    code, _, err = run_cli("train", cfg)
    assert code == 1 and "the key 'steps' appears twice" in err and "train.yaml:3" in err, err
    code, _, err = run_cli("train", "rope", "--set", "model={n_layers: 1, n_layers: 2}")
    assert code == 2 and "appears twice" in err, err
    hf = tmp_path / "config.json"
    hf.write_text('{"rope_theta": 10000.0, "head_dim": 64, "num_attention_heads": 8, "rope_theta": 500000.0}')
    code, _, err = run_cli("import-hf", hf)
    assert code == 1 and "E963" in err and "'rope_theta' appears twice" in err, err


@pytest.fixture
def two_checkpoints(tmp_path):
    run = tmp_path / "run"
    train(small_cfg(steps=20, checkpoint_every=10), run, attention=helper.spec(), quiet=True)
    return run


def _edit(run: Path, step: int, edit) -> None:
    f = run / "checkpoints" / f"step_{step:07d}" / "state.json"
    state = json.loads(f.read_text())
    edit(state)
    f.write_text(json.dumps(state))


def _bad_rng(state):
    state["rng"]["torch"] = "AAAA"


def _bad_eps(state):
    state["param_groups"][0]["eps"] = "x"


def _bad_python_rng(state):
    state["rng"]["python"] = [3, [1, 2], None]


def _wrong_shape_optimizer(run: Path):
    from safetensors.torch import load, save

    ckpt = run / "checkpoints" / "step_0000020"
    flat = load((ckpt / "optim.safetensors").read_bytes())
    key = next(k for k in sorted(flat) if k.endswith("exp_avg"))
    flat[key] = flat[key].reshape(-1)[:3].clone()
    data = save(flat)
    (ckpt / "optim.safetensors").write_bytes(data)
    _edit(run, 20, lambda s: s["files"].__setitem__("optim.safetensors", hashlib.sha256(data).hexdigest()))


@pytest.mark.parametrize("damage", ["eps", "torch_rng", "python_rng", "optimizer_shape"])
def test_a_checkpoint_that_reads_but_cannot_be_restored_is_moved_aside(two_checkpoints, damage, capfd):
    run = two_checkpoints
    if damage == "optimizer_shape":
        _wrong_shape_optimizer(run)
    else:
        _edit(run, 20, {"eps": _bad_eps, "torch_rng": _bad_rng, "python_rng": _bad_python_rng}[damage])
    train(small_cfg(steps=30, checkpoint_every=10), run, attention=helper.spec(), quiet=True, resume=True)
    err = capfd.readouterr().err
    assert "checkpoint step_0000020 cannot be used" in err and "resuming from step_0000010" in err, err
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["step_0000020", "step_0000020.bad", "step_0000030"]


def test_a_bad_folder_that_is_a_link_is_never_followed_nor_deleted(two_checkpoints, tmp_path, capfd):
    run = two_checkpoints
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("mine\n")
    (run / "checkpoints" / "step_0000020.bad").symlink_to(mine)
    _edit(run, 20, _bad_eps)
    train(small_cfg(steps=30, checkpoint_every=10), run, attention=helper.spec(), quiet=True, resume=True)
    assert "moved it to step_0000020.bad.2" in capfd.readouterr().err
    assert (run / "checkpoints" / "step_0000020.bad").is_symlink() and sorted(os.listdir(mine)) == ["keep.txt"]
    assert (run / "checkpoints" / "step_0000020.bad.2" / "state.json").is_file()


# ---------------------------------------------------------------------------------------------
# 5. a path that exists is a path


@pytest.mark.parametrize("command", ["compile", "graph", "train", "check", "show", "explain", "diff"])
def test_a_path_with_a_brace_is_read_as_a_path(tmp_path, command, monkeypatch):
    from pedsl.lang.library import scheme_file

    folder = tmp_path / "d{1}"
    folder.mkdir()
    (folder / "rope.pe").write_bytes(scheme_file("rope").read_bytes())
    monkeypatch.chdir(tmp_path)
    extra = {"compile": ("-o", "out"), "train": ("--steps", "1", "--out", "run", "-q"), "diff": ("rope",)}
    code, out, err = run_cli(command, "d{1}/rope.pe", *extra.get(command, ()))
    assert code == 0, out + err


# ---------------------------------------------------------------------------------------------
# 6. a run is read only through what it recorded; a non-finite result is an error


TINY = ("--steps", "2", "--set", "n_layers=1", "--set", "d_model=32", "--set", "n_heads=2", "--context", "32",
        "--batch-size", "2", "--set", "max_bytes=100000", "--set", "eval_batches=1", "-q")


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("runs") / "rope"
    code, out, err = run_cli("train", "rope", "--out", run, *TINY)
    assert code == 0, out + err
    return run


def _copy_run(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst, symlinks=True)
    (dst / ".pedsl.lock").unlink(missing_ok=True)
    return dst


def test_a_run_without_its_scheme_is_not_evaluated_under_an_outside_one(rope_run, tmp_path):
    import shutil

    run = _copy_run(rope_run, tmp_path / "run")
    outside = tmp_path / "other.pe"
    outside.write_text("scheme other {\n  qk: rotate(geometric(500000.0) * position)\n}\n")
    shutil.rmtree(run / "scheme")
    for name in ("scheme.pe", "scheme.json", "scheme.sha256"):
        (run / name).unlink()
    cfg = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(cfg.replace(next(ln for ln in cfg.splitlines() if ln.startswith("scheme:")),
                                                 f"scheme: {outside}"))
    code, _, err = run_cli("eval", run, "--lengths", "32", "--tasks", "ppl")
    assert code == 1 and "records no scheme hash" in err, err
    assert not (run / "eval.json").exists()


@pytest.mark.parametrize("command", ["eval", "analyze"])
def test_results_are_not_written_into_a_run_reached_through_a_link(rope_run, tmp_path, command):
    run = _copy_run(rope_run, tmp_path / "run")
    (tmp_path / "link").symlink_to(run)
    before = sorted(os.listdir(run))
    code, _, err = run_cli(command, tmp_path / "link", "--lengths", "32", "-q")
    assert code == 1 and "symbolic link" in err and "ppl @" not in err, err
    assert sorted(os.listdir(run)) == before
    code, _, err = run_cli(command, run, "--lengths", "32", "-q", "--out", tmp_path / "link" / "x.json")
    assert code == 1 and "symbolic link" in err and sorted(os.listdir(run)) == before, err


def test_a_manifest_pointing_out_of_the_copy_is_refused(rope_run, tmp_path):
    run = _copy_run(rope_run, tmp_path / "deep" / "run")
    (tmp_path / "other.pe").write_text((run / "scheme.pe").read_text())
    manifest = json.loads((run / "scheme.json").read_text())
    manifest["main"] = "../../other.pe"
    (run / "scheme.json").write_text(json.dumps(manifest))
    code, _, err = run_cli("eval", run, "--lengths", "32", "--tasks", "ppl")
    assert code == 1 and "which is outside its copy of the scheme" in err, err


@pytest.mark.parametrize("command", ["eval", "analyze"])
def test_non_finite_weights_are_an_error_not_nan_results(rope_run, tmp_path, command):
    from safetensors.torch import load, save

    run = _copy_run(rope_run, tmp_path / "run")
    ckpt = sorted((run / "checkpoints").iterdir())[-1]
    tensors = {k: v.clone().fill_(float("nan")) if v.is_floating_point() else v
               for k, v in load((ckpt / "model.safetensors").read_bytes()).items()}
    data = save(tensors)
    (ckpt / "model.safetensors").write_bytes(data)
    state = json.loads((ckpt / "state.json").read_text())
    state["files"]["model.safetensors"] = hashlib.sha256(data).hexdigest()
    (ckpt / "state.json").write_text(json.dumps(state))
    code, _, err = run_cli(command, run, "--lengths", "32", *(("--tasks", "ppl") if command == "eval" else ()))
    assert code == 1 and "holds non-finite weights" in err, err


def test_a_non_finite_perplexity_is_an_error():
    import torch

    from pedsl.errors import EvalError
    from pedsl.study.perplexity import perplexity

    def nan_model(tokens):
        return torch.full((*tokens.shape, 256), float("nan"))

    data = torch.randint(0, 256, (4096,))
    with pytest.raises(EvalError, match="perplexity at length 32 is not finite"):
        perplexity(nan_model, data, [32, 64], 32, windows=2)


# ---------------------------------------------------------------------------------------------
# 7. deterministic JSON; capped profile sizes

_JSON_OUTPUTS = r'''
import sys
sys.path.insert(0, sys.argv[1])
from compiler_helpers import run_cli
from pedsl.lang.library import library_dir

names = sorted(p.stem for p in library_dir().glob("*.pe"))
for args in ([["show", n, "--json"] for n in names] + [["check", n, "--json"] for n in names]
             + [["diff", a, b, "--json"] for a, b in zip(names, names[1:])] + [["schema"]]):
    code, out, err = run_cli(*args)
    sys.stdout.write(" ".join(args) + f" -> {code}\n" + out)
'''


def test_every_json_output_is_the_same_under_any_hash_seed():
    outs = []
    for seed in ("0", "1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(ROOT))
        res = subprocess.run([sys.executable, "-c", _JSON_OUTPUTS, str(Path(__file__).parent)], capture_output=True, text=True, env=env,
                             timeout=300)
        assert res.returncode == 0, res.stderr[-2000:]
        outs.append(res.stdout)
    assert '"axes": [' in outs[0] and outs[0] == outs[1] == outs[2]


@pytest.mark.parametrize("option", [("--max-bytes", "1000000000000"), ("--vocab", "100000000")])
def test_profile_sizes_are_capped_before_anything_is_allocated(tmp_path, option):
    code, _, err = run_cli("profile", "iid", "--out", tmp_path / "p", *option)
    assert code == 2 and "E994" in err and "the limit is 2.0 GiB" in err, err
    assert not (tmp_path / "p").exists()

"""Run folders that cannot be corrupted: one process at a time (a lock, tested with two real
processes), only new/empty folders or pedsl runs, never written through symbolic links, and a
hash over the whole resolved scheme (every imported file, copied into the run)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pedsl.errors import OutputError
from pedsl.train import rundir, runlock, schemefiles
from pedsl.train.loop import train
from train_helpers import helper, read_metrics, small_cfg
from compiler_helpers import ROOT

HELPER = Path(__file__).parent / "fixtures" / "train_helper.py"


def _spawn(cfg, run: Path, *extra: str) -> subprocess.Popen:
    cfg_file = run.parent / f"{run.name}-{len(list(run.parent.glob('*.json')))}.json"
    cfg_file.write_text(cfg.model_dump_json())
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, str(HELPER), str(cfg_file), str(run), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _owner(run: Path) -> dict | None:
    try:
        text = (run / runlock.LOCK_NAME).read_text()
        return json.loads(text) if text.strip() else None
    except (OSError, ValueError):
        return None


@pytest.mark.slow
def test_two_concurrent_trains_into_one_out_cannot_both_succeed(tmp_path):
    # process 1: a real `train` in a subprocess; process 2: this one, with another config
    run = tmp_path / "run"
    first = _spawn(small_cfg(steps=30), run, "--sleep", "0.1")  # holds the lock for 3 s or more
    deadline = time.time() + 60
    while time.time() < deadline and (_owner(run) or {}).get("pid") != first.pid and first.poll() is None:
        time.sleep(0.02)
    assert (_owner(run) or {}).get("pid") == first.pid, first.stderr.read() if first.poll() is not None else "no lock"
    with pytest.raises(OutputError, match=f"is in use by another pedsl process \\(pid {first.pid} on host "
                                          f"{socket.gethostname()}") as exc:
        train(small_cfg(steps=30, seed=1), run, attention=helper.spec(), quiet=True)
    assert "choose another --out" in exc.value.hint
    assert first.wait(120) == 0, first.stderr.read()
    # the folder is one run: its config is the one its checkpoints were trained with
    from pedsl.config import TrainConfig
    from pedsl.train import checkpoint as ck

    cfg = TrainConfig.from_yaml(run / "config.yaml")
    state = json.loads((ck.latest_checkpoint(run / "checkpoints") / "state.json").read_text())
    assert cfg.seed == 0 and state["config_hash"] == cfg.digest() == small_cfg(steps=30).digest()
    assert _owner(run) is None  # released
    train(small_cfg(steps=35), run, attention=helper.spec(), quiet=True, resume=True)  # and free again


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path, capfd):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run = tmp_path / "run"
    run.mkdir()
    (run / runlock.LOCK_NAME).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "since": "x"}))
    train(small_cfg(steps=5, checkpoint_every=5), run, attention=helper.spec(), quiet=False)
    assert f"took over the lock of a run that ended without releasing it (pid {dead.pid}" in capfd.readouterr().err
    assert (run / "DONE.json").is_file()


def test_the_lock_is_exclusive_within_one_process_too(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with runlock.RunLock(run):
        with pytest.raises(OutputError, match=f"in use by another pedsl process \\(pid {os.getpid()}"):
            runlock.RunLock(run).acquire()
    with runlock.RunLock(run):  # released, so free again
        pass
    assert not (run / runlock.LOCK_NAME).exists()  # released: removed
    os.mkfifo(run / runlock.LOCK_NAME)  # a planted FIFO: refused, never blocks
    with pytest.raises(OutputError, match="is not a regular file"):
        runlock.RunLock(run).acquire()


def test_a_folder_that_is_not_a_run_is_never_written(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "config.yaml").write_text("my: settings\n")
    (out / "metrics.jsonl").write_text("precious\n")
    with pytest.raises(OutputError, match="is not empty and is not a pedsl run folder") as exc:
        train(small_cfg(steps=5), out, attention=helper.spec(), quiet=True)
    assert "new or empty --out" in exc.value.hint
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "metrics.jsonl"]
    assert (out / "config.yaml").read_text() == "my: settings\n" and (out / "metrics.jsonl").read_text() == "precious\n"
    with pytest.raises(OutputError, match="not a pedsl run folder"):  # --resume neither
        train(small_cfg(steps=5), out, attention=helper.spec(), quiet=True, resume=True)
    # an empty folder and an existing run are fine
    (tmp_path / "empty").mkdir()
    train(small_cfg(steps=5, checkpoint_every=5), tmp_path / "empty", attention=helper.spec(), quiet=True)
    train(small_cfg(steps=10, checkpoint_every=5), tmp_path / "empty", attention=helper.spec(), quiet=True,
          resume=True)


def test_compare_never_writes_into_a_folder_that_is_not_a_study(tmp_path, monkeypatch):
    from compiler_helpers import run_cli

    monkeypatch.delenv("PEDSL_DEBUG", raising=False)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "report.md").write_text("my report\n")
    code, _, err = run_cli("compare", "rope", "--out", str(out), "--steps", "1")
    assert code == 1 and "is not empty and is not a pedsl compare study" in err, err
    assert [p.name for p in out.iterdir()] == ["report.md"] and (out / "report.md").read_text() == "my report\n"


@pytest.mark.parametrize("name", ["metrics.jsonl", "config.yaml", "DONE.json", "checkpoints"])
def test_planted_symlinks_are_not_written_through(tmp_path, name):
    run = tmp_path / "run"
    train(small_cfg(steps=5, checkpoint_every=5), run, attention=helper.spec(), quiet=True)
    elsewhere = tmp_path / "elsewhere"
    if name == "checkpoints":
        (run / name).rename(elsewhere)
        before = sorted(p.name for p in elsewhere.iterdir())
    else:
        elsewhere.write_text("not yours\n")
        (run / name).unlink()
    (run / name).symlink_to(elsewhere)
    with pytest.raises(OutputError, match="symbolic link"):
        train(small_cfg(steps=10, checkpoint_every=5), run, attention=helper.spec(), quiet=True, resume=True)
    if name == "checkpoints":
        assert sorted(p.name for p in elsewhere.iterdir()) == before
    else:
        assert elsewhere.read_text() == "not yours\n"


def test_metrics_are_appended_without_following_a_link(tmp_path):
    from pedsl.fsio import open_append as _open_append

    target = tmp_path / "elsewhere"
    target.write_text("x\n")
    (tmp_path / "metrics.jsonl").symlink_to(target)
    with pytest.raises(OutputError, match="symbolic link"):
        _open_append(tmp_path / "metrics.jsonl")
    assert target.read_text() == "x\n"


def test_force_new_discards_only_the_runs_own_files(tmp_path):
    run = tmp_path / "run"
    train(small_cfg(steps=10, checkpoint_every=5), run, attention=helper.spec(), quiet=True)
    (run / "notes.txt").write_text("mine\n")
    with pytest.raises(OutputError, match="already holds checkpoints") as exc:
        train(small_cfg(steps=5, checkpoint_every=5), run, attention=helper.spec(), quiet=True)
    assert "--force-new" in exc.value.hint
    train(small_cfg(steps=5, checkpoint_every=5), run, attention=helper.spec(), quiet=True, force_new=True)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_0000005"]
    assert [r["step"] for r in read_metrics(run)] == [5]
    assert (run / "notes.txt").read_text() == "mine\n"


# ---------------------------------------------------------------------------------------------
# The resolved scheme: every imported file is hashed and copied


def _project(tmp_path: Path) -> Path:
    proj = tmp_path / "proj"
    (proj / "sub").mkdir(parents=True)
    (proj / "sub" / "base.pe").write_text('import "rope.pe"\nscheme base extends rope {\n'
                                          '  param base: float = 10000.0\n}\n')
    (proj / "child.pe").write_text('import "sub/base.pe"\nscheme child extends base {}\n')
    return proj


def test_scheme_files_cover_the_import_closure_and_the_copy_resolves_alone(tmp_path):
    from pedsl.lang.api import load

    proj = _project(tmp_path)
    files = schemefiles.scheme_files(load(proj / "child.pe"))
    rope = (ROOT / "schemes" / "rope.pe").read_bytes()
    # the library file imported by name from sub/base.pe sits next to it in the copy
    assert files.main == "child.pe" and set(files.files) == {"child.pe", "sub/base.pe", "sub/rope.pe"}
    assert files.files["sub/rope.pe"] == rope
    assert files.digest == schemefiles.closure_digest(files.files) != schemefiles.closure_digest({"child.pe": b""})
    run = tmp_path / "run"
    run.mkdir()
    rundir.write_scheme(run, files, (proj / "child.pe").read_text())
    again = schemefiles.scheme_files(load(run / "scheme" / "child.pe"))
    assert again.files == files.files and again.digest == files.digest  # independent of where it lies
    # a single file hashes to the sha256 of its bytes (what Scheme.source_hash was)
    import hashlib

    single = schemefiles.scheme_files(load(ROOT / "schemes" / "rope.pe"))
    assert single.digest == hashlib.sha256(rope).hexdigest() == load(ROOT / "schemes" / "rope.pe").source_hash


def test_the_hash_changes_with_any_imported_file(tmp_path):
    from pedsl.lang.api import load

    proj = _project(tmp_path)
    before = schemefiles.scheme_files(load(proj / "child.pe"))
    (proj / "sub" / "base.pe").write_text((proj / "sub" / "base.pe").read_text().replace("10000.0", "500.0"))
    after = schemefiles.scheme_files(load(proj / "child.pe"))
    assert after.digest != before.digest
    assert schemefiles.describe_change(before.manifest(), after) == "changed: sub/base.pe"


TINY = ["--context", "32", "--batch-size", "8", "--threads", "1", "--set", "n_layers=1", "--set", "d_model=32",
        "--set", "n_heads=2", "--set", "eval_every=2", "--set", "eval_batches=1", "--set", "log_every=1",
        "--set", "checkpoint_every=2", "--set", "data.max_bytes=100000", "--set", "warmup=1", "-q"]


def test_resume_refuses_a_changed_import_and_eval_uses_the_runs_copy(tmp_path, monkeypatch):
    from compiler_helpers import run_cli

    monkeypatch.delenv("PEDSL_DEBUG", raising=False)
    proj = _project(tmp_path)
    run = tmp_path / "run"
    code, _, err = run_cli("train", str(proj / "child.pe"), "--out", str(run), "--steps", "2", *TINY)
    assert code == 0, err
    manifest = json.loads((run / "scheme.json").read_text())
    assert manifest["main"] == "child.pe" and set(manifest["files"]) == {"child.pe", "sub/base.pe", "sub/rope.pe"}
    assert (run / "scheme" / "sub" / "base.pe").read_text() == (proj / "sub" / "base.pe").read_text()
    assert (run / "scheme.sha256").read_text().strip() == manifest["sha256"]
    # the imported base changes: resume refuses, naming the file and the ways on
    (proj / "sub" / "base.pe").write_text((proj / "sub" / "base.pe").read_text().replace("10000.0", "500.0"))
    code, _, err = run_cli("train", str(proj / "child.pe"), "--out", str(run), "--steps", "4", "--resume", *TINY)
    assert code == 1 and "cannot resume" in err and "changed: sub/base.pe" in err, err
    assert "new --out" in err and "--force-new" in err and str(run / "scheme" / "child.pe") in err
    # eval reads the run's own copy, so it works with the original files changed or gone
    import shutil

    shutil.rmtree(proj)
    code, out, err = run_cli("eval", str(run), "--lengths", "32", "-q")
    assert code == 0, err
    # and an edited copy is refused, naming the file
    (run / "scheme" / "sub" / "base.pe").write_text("import \"rope.pe\"\nscheme base extends rope {}\n")
    code, _, err = run_cli("eval", str(run), "--lengths", "32", "-q")
    assert code == 1 and "changed: sub/base.pe" in err, err


def test_a_copy_with_imports_from_an_allowed_root_loads_alone(tmp_path, monkeypatch):
    from compiler_helpers import run_cli

    monkeypatch.delenv("PEDSL_DEBUG", raising=False)
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "base.pe").write_text('import "rope.pe"\nscheme base extends rope {}\n')
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "child.pe").write_text('import "../lib/base.pe"\nscheme child extends base {}\n')
    run = tmp_path / "run"
    code, _, err = run_cli("train", str(tmp_path / "x" / "child.pe"), "--out", str(run), "--steps", "2", *TINY)
    assert code == 1 and "outside the folders imports may come from" in err  # not allowed by default
    code, _, err = run_cli("--allow-import-root", str(tmp_path / "lib"), "train", str(tmp_path / "x" / "child.pe"),
                           "--out", str(run), "--steps", "2", *TINY)
    assert code == 0, err
    assert json.loads((run / "scheme.json").read_text())["main"] == "x/child.pe"
    assert {p.relative_to(run / "scheme").as_posix() for p in (run / "scheme").rglob("*.pe")} == {
        "x/child.pe", "lib/base.pe", "lib/rope.pe"}
    code, _, err = run_cli("eval", str(run), "--lengths", "32", "-q")  # no root allowed: the run's copy loads
    assert code == 0, err


@pytest.mark.slow
def test_compare_does_not_reuse_a_run_whose_import_changed(tmp_path, monkeypatch):
    from compiler_helpers import run_cli

    monkeypatch.delenv("PEDSL_DEBUG", raising=False)
    proj = _project(tmp_path)
    args = ["compare", str(proj / "child.pe"), "--out", str(tmp_path / "study"), "--steps", "2", "--lengths", "32",
            "--windows", "1", "--analyze-max", "32", "--threads", "1", "--set", "context=32", "--set",
            "batch_size=4", "--set", "n_layers=1", "--set", "d_model=32", "--set", "n_heads=2", "--set",
            "data.max_bytes=100000", "--set", "eval_every=2", "--set", "eval_batches=1", "--set", "warmup=1"]
    code, _, err = run_cli(*args)
    assert code == 0, err
    code, _, err = run_cli(*args)
    assert code == 0 and "reusing the finished run" in err, err
    (proj / "sub" / "base.pe").write_text((proj / "sub" / "base.pe").read_text().replace("10000.0", "500.0"))
    code, _, err = run_cli(*args)
    assert code == 1 and "cannot reuse" in err and "changed: sub/base.pe" in err, err
    assert "another --out" in err

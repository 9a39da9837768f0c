"""`pedsl train` end to end on real schemes (position-indexed RoPE, accumulated random
rotations, biased ALiBi), under torchrun, and its user-facing errors (exit code 1, a
diagnostic, never a traceback). Tests that need the compiler skip until it exists."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from train_helpers import TINY
from compiler_helpers import ROOT

SCHEMES = ROOT / "schemes"


class Result:
    def __init__(self, returncode: int, stderr: str) -> None:
        self.returncode, self.stderr = returncode, stderr


def pedsl(*args: str, launcher: list[str] | None = None) -> Result:
    """Run `pedsl train ARGS`: in this process (fast), or as a subprocess under ``launcher``."""
    if launcher is None:
        import contextlib
        import io

        from pedsl.cli import main

        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                main(["train", *args])
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 0
        return Result(code, err.getvalue())
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    env.pop("PEDSL_DEBUG", None)
    env.pop("WORLD_SIZE", None)
    res = subprocess.run(launcher + ["-m", "pedsl", "train", *args], capture_output=True, text=True, cwd=ROOT,
                         env=env, timeout=300)
    return Result(res.returncode, res.stderr)


def assert_user_error(res: Result, *needles: str) -> None:
    assert res.returncode == 1, (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr, res.stderr
    for n in needles:
        assert n in res.stderr, res.stderr


def test_user_errors_in_a_subprocess_have_no_traceback(tmp_path):
    res = pedsl(str(tmp_path / "missing.pe"), "--out", str(tmp_path / "r"), launcher=[sys.executable])
    assert_user_error(res, "does not exist")


def test_missing_scheme_file(tmp_path):
    assert_user_error(pedsl(str(tmp_path / "nope.pe"), "--out", str(tmp_path / "r")), "does not exist")


def test_bad_yaml_setting_has_a_hint(tmp_path):
    f = tmp_path / "train.yaml"
    f.write_text("scheme: schemes/rope.pe\nsetps: 3\n")
    assert_user_error(pedsl(str(f), "--out", str(tmp_path / "r")), "unknown setting 'setps'", "did you mean 'steps'")


def test_bad_override_is_a_usage_error(tmp_path):
    res = pedsl(str(SCHEMES / "rope.pe"), "--out", str(tmp_path / "r"), "--set", "d_modle=3")
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert "training setting 'd_modle'" in res.stderr and "did you mean 'd_model'" in res.stderr
    assert not (tmp_path / "r").exists()


def test_empty_data_folder_and_context_longer_than_data(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    res = pedsl(str(SCHEMES / "rope.pe"), "--out", str(tmp_path / "r"), "--data", str(empty), *TINY)
    assert_user_error(res, "no files found in folder")
    small = tmp_path / "small"
    small.mkdir()
    (small / "a.txt").write_text("x = 1\n" * 30)
    res = pedsl(str(SCHEMES / "rope.pe"), "--out", str(tmp_path / "r"), "--data", str(small), *TINY[2:],
                "--context", "4096")
    assert_user_error(res, "fewer than one window of context + 1 = 4097", "lower --context")
    assert not (tmp_path / "r" / "config.yaml").exists()


def _metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["rope", "acc_random_qk", "alibi"])
def test_tiny_run_on_a_real_scheme(tmp_path, scheme):
    run = tmp_path / scheme
    res = pedsl(str(SCHEMES / f"{scheme}.pe"), "--out", str(run), "--steps", "30", *TINY)
    assert res.returncode == 0, res.stderr
    m = _metrics(run)
    assert m[-1]["loss"] < m[0]["loss"] - 0.5
    assert (run / "scheme.pe").read_text() == (SCHEMES / f"{scheme}.pe").read_text()
    from pedsl.config import TrainConfig
    from pedsl.lang.api import load

    from pedsl.train.schemefiles import scheme_files

    # the hash covers the resolved scheme: the file and its imports (alibi imports nope.pe)
    files = scheme_files(load(str(SCHEMES / f"{scheme}.pe")))
    assert (run / "scheme.sha256").read_text().strip() == files.digest
    for rel, data in files.files.items():
        assert (run / "scheme" / rel).read_bytes() == data
    cfg = TrainConfig.from_yaml(run / "config.yaml")
    assert cfg.steps == 30 and cfg.context == 32 and cfg.scheme.endswith(f"{scheme}.pe")
    done = json.loads((run / "DONE.json").read_text())
    assert done["val_loss"] < done["unigram_baseline"] + 0.5
    from pedsl.train import load_run

    model, cfg2, meta = load_run(run)
    assert meta["step"] == 30 and cfg2 == cfg


@pytest.mark.slow
def test_corrupt_and_mismatched_checkpoints_via_the_cli(tmp_path):
    run = tmp_path / "run"
    assert pedsl(str(SCHEMES / "rope.pe"), "--out", str(run), "--steps", "15", *TINY).returncode == 0
    res = pedsl(str(SCHEMES / "alibi.pe"), "--out", str(run), "--steps", "30", "--resume", *TINY)
    assert_user_error(res, "trained with another scheme")
    f = run / "checkpoints" / "step_0000015" / "model.safetensors"
    f.write_bytes(f.read_bytes()[:64])
    res = pedsl(str(SCHEMES / "rope.pe"), "--out", str(run), "--steps", "30", "--resume", *TINY)
    assert_user_error(res, "model.safetensors' is corrupt or truncated")
    res = pedsl(str(SCHEMES / "rope.pe"), "--out", str(run), "--steps", "30", *TINY)
    assert_user_error(res, "already holds checkpoints", "--resume")


@pytest.mark.slow
def test_torchrun_module_entry_point(tmp_path):
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    res = pedsl(str(SCHEMES / "rope.pe"), "--out", str(tmp_path / "ddp"), "--steps", "6", *TINY, launcher=launcher)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((tmp_path / "ddp" / "DONE.json").read_text())["world_size"] == 2


@pytest.mark.slow
def test_sigkill_then_resume_via_the_cli_reproduces_the_losses(tmp_path):
    import signal
    import time

    args = ["--steps", "100", *TINY, "--context", "64", "--set", "d_model=64", "--set", "checkpoint_every=10",
            "--set", "eval_every=25"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("WORLD_SIZE", None)

    def start(out: Path) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "pedsl", "train", str(SCHEMES / "rope.pe"), "--out", str(out),
                                 *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    victim = start(tmp_path / "victim")
    log = tmp_path / "victim" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and victim.poll() is None:
        lines = log.read_text().splitlines() if log.exists() else []
        if lines and lines[-1].endswith("}") and json.loads(lines[-1])["step"] >= 25:
            break
        time.sleep(0.005)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL, "the run finished before it was killed"
    ref = pedsl(str(SCHEMES / "rope.pe"), "--out", str(tmp_path / "ref"), *args)  # uninterrupted, in process
    assert ref.returncode == 0, ref.stderr
    resumed = subprocess.run([sys.executable, "-m", "pedsl", "train", str(SCHEMES / "rope.pe"), "--out",
                              str(tmp_path / "victim"), *args, "--resume"], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    strip = lambda run: [(r["step"], r["loss"], r["lr"], r.get("val_loss")) for r in _metrics(run)]  # noqa: E731
    assert strip(tmp_path / "victim") == strip(tmp_path / "ref")

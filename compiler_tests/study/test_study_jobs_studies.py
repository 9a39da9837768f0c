"""`--jobs` for the studies whose runs are not one per scheme: `--study frequency` (a unit per width and
seed), `--study extension` (its base models, then a unit per task and method) and `pedsl profile
--compare` (RoPE and the suggested scheme). With --threads pinned, every number, metric and weight
equals a serial run's bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compiler_helpers import run_cli, without_keys

TIMING = {"wall_time_s", "cpu_time_s", "tokens_per_s", "run", "time_s", "elapsed_s", "date", "command",
          "compute_cpu_s", "dir", "report"}


def _strip(tree):
    return without_keys(tree, TIMING)


def _metrics(run: Path) -> list[dict]:
    return [_strip(json.loads(line)) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _same_runs(a: Path, b: Path) -> int:
    """Every run folder under ``a`` has the same metrics and final weights under ``b``; how many."""
    runs = sorted(p.parent.relative_to(a) for p in a.rglob("DONE.json"))
    assert runs == sorted(p.parent.relative_to(b) for p in b.rglob("DONE.json"))
    for run in runs:
        assert _metrics(a / run) == _metrics(b / run), run
        last = sorted((a / run / "checkpoints").iterdir())[-1].name
        for f in ("model.safetensors", "optim.safetensors"):
            assert (a / run / "checkpoints" / last / f).read_bytes() == (b / run / "checkpoints" / last / f).read_bytes()
    return len(runs)


def _serial_and_jobs_2(tmp_path: Path, *args: str) -> tuple[Path, Path]:
    """The study of ``compare ARGS`` run serially and with --jobs 2: its two folders."""
    serial, par = tmp_path / "serial", tmp_path / "par"
    for out, extra in ((serial, ()), (par, ("--jobs", "2"))):
        code, _, err = run_cli("compare", "--out", str(out), *args, *extra)
        assert code == 0, err
    return serial, par


def _sets(*items: str) -> list[str]:
    return [a for kv in items for a in ("--set", kv)]


FREQ = ["--study", "frequency", "--steps", "3", "--threads", "1", "-q",
        *_sets("widths=[4, 6]", "seeds=[0, 1]", "d_model=32", "n_heads=1", "head_dim=16", "context=16",
               "batch_size=2", "probe_samples=2", "eval_batches=1")]


@pytest.mark.slow
def test_frequency_study_with_jobs_2_equals_a_serial_one(tmp_path):
    serial, par = _serial_and_jobs_2(tmp_path, *FREQ)
    a = json.loads((serial / "frequency.json").read_text())
    b = json.loads((par / "frequency.json").read_text())
    assert _strip(a) == _strip(b) and len(a["runs"]) == 4
    assert _same_runs(serial / "runs", par / "runs") == 4


EXT = ["--study", "extension", "pi", "--steps", "10", "--lengths", "32,64", "--windows", "1", "--threads", "1", "-q",
       *_sets("context=32", "batch_size=4", "n_layers=1", "d_model=32", "n_heads=1", "data.max_bytes=100000",
              "eval_every=10", "eval_batches=1", "warmup=2")]


@pytest.mark.slow
def test_extension_study_with_jobs_2_equals_a_serial_one(tmp_path):
    serial, par = _serial_and_jobs_2(tmp_path, *EXT)
    a = json.loads((serial / "extension" / "results.json").read_text())["results"]
    b = json.loads((par / "extension" / "results.json").read_text())["results"]
    assert _strip(a) == _strip(b) and set(a) == {"text", "blocks"} and a["text"]["fine_tuned"]["pi"]
    # base text model, blocks base model, and a fine-tune per task, method (rope, pi) and target (4x, 16x)
    assert _same_runs(serial, par) == 2 + 2 * 2 * 2
    evals = sorted(p.name for p in (serial / "extension" / "evals").iterdir())
    assert evals == sorted(p.name for p in (par / "extension" / "evals").iterdir())
    for name in evals:
        assert _strip(json.loads((serial / "extension" / "evals" / name).read_text())) == \
            _strip(json.loads((par / "extension" / "evals" / name).read_text()))


PROFILE = ["profile", "blocks", "--max-bytes", "20000", "--max-distance", "16", "--granularities", "1",
           "--steps", "3", "--threads", "1", "-q"]


@pytest.mark.slow
def test_profile_compare_with_jobs_2_equals_a_serial_one(tmp_path):
    for name, extra in (("serial", ()), ("par", ("--jobs", "2"))):
        code, _, err = run_cli(*PROFILE, "--out", str(tmp_path / name / "prof"), "--suggest",
                               str(tmp_path / name / "s.pe"), "--compare", str(tmp_path / name / "cmp"), *extra)
        assert code == 0, err
    a = json.loads((tmp_path / "serial" / "prof" / "profile.json").read_text())["loop"]
    b = json.loads((tmp_path / "par" / "prof" / "profile.json").read_text())["loop"]
    assert _strip(a) == _strip(b) and set(a["schemes"]) == {"rope", "s"}
    assert _same_runs(tmp_path / "serial" / "cmp", tmp_path / "par" / "cmp") == 2


def test_executor_options_of_profile_need_compare(tmp_path):
    code, _, err = run_cli("profile", "stdlib", "--out", str(tmp_path / "p"), "--jobs", "2")
    assert code == 2 and "--jobs: not used without --compare" in err
    code, _, err = run_cli("profile", "stdlib", "--out", str(tmp_path / "p"), "--address", "auto",
                           "--suggest", str(tmp_path / "s.pe"), "--compare", str(tmp_path / "c"))
    assert code == 2 and "--address applies to --executor ray only" in err
    assert not (tmp_path / "p").exists() and not (tmp_path / "c").exists()

"""`pedsl compare --jobs N`: a study's runs in spawned worker processes (pedsl.study.executor).

With --threads pinned the study's numbers and weights equal a serial study's bit for bit; a worker
killed with SIGKILL is started again and its run resumes from its last checkpoint; a unit that fails
stops the study with one error naming it, after the others finished; the progress line counts runs
done, running and left; bad --jobs values are usage errors; SIGTERM stops the study and its workers."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from compiler_helpers import F32_EPS
from compiler_helpers import run_cli as _cli
from compiler_helpers import without_keys
from pedsl.errors import ConfigError, TrainError
from pedsl.study import executor as ex
from pedsl.study import parallel

SETS = {"context": 32, "batch_size": 4, "n_layers": 1, "d_model": 32, "n_heads": 2, "data.max_bytes": 100000,
        "eval_every": 12, "eval_batches": 1, "warmup": 2}
TINY = ["--steps", "12", "--lengths", "32,64", "--windows", "2", "--analyze-max", "64", "--threads", "1", "-q",
        *[a for k, v in SETS.items() for a in ("--set", f"{k}={v}")]]
TIMING = {"wall_time_s", "cpu_time_s", "tokens_per_s", "run", "time_s", "elapsed_s"}


# Units for the executor's own tests: module-level, so that a spawned worker imports them by name.

def _write(path: str, text: str, say) -> None:
    say(f"writing {Path(path).name}")
    Path(path).write_text(text + f" {os.getpid()}")


def _die_once(marker: str, say) -> None:
    if not Path(marker).exists():
        Path(marker).write_text("first attempt")
        os.kill(os.getpid(), signal.SIGKILL)
    Path(marker).write_text("second attempt")


def _refuse(say) -> None:
    raise ConfigError("this run's settings are wrong", hint="fix them")


def test_plan_splits_the_idle_cores_or_pins_the_threads(monkeypatch):
    monkeypatch.setattr(ex, "auto_threads", lambda processes=1: max(1, 8 // processes))
    assert ex.plan(2, 0, 6) == (2, 4)  # 8 idle cores over 2 workers
    assert ex.plan(2, 3, 6) == (2, 3)  # pinned: that many per run
    assert ex.plan(4, 0, 2) == (2, 4)  # never more workers than runs
    assert ex.plan("auto", 1, 20) == (8, 1)  # auto: one worker per idle core


def test_progress_line_counts_runs_and_estimates_the_time_left():
    now = [0.0]
    lines: list[str] = []
    view = ex.StudyProgress(4, 2, lines.append, "compare", clock=lambda: now[0])
    view.start("a")
    view.start("b")
    assert lines[-1].startswith("compare: 0/4 runs done, 2 running, 2 left (started b)")
    assert "about" not in lines[-1]  # no estimate before a run finished
    now[0] = 100.0
    view.finish("a")
    # b ran 100 s of the 100 s mean: 0 left of it; 2 runs of 100 s each over 2 workers: 100 s
    assert lines[-1] == "compare: 1/4 runs done, 1 running, 2 left (finished a) - 100 s elapsed, about 100 s left"
    view.finish("b", ok=False)
    assert "1/4 runs done, 0 running, 2 left, 1 failed (failed b)" in lines[-1]


def test_a_killed_worker_is_started_again_and_a_failed_unit_is_named(tmp_path):
    said: list[str] = []
    units = [ex.Unit("dies", _die_once, {"marker": str(tmp_path / "marker")}),
             ex.Unit("writes", _write, {"path": str(tmp_path / "out.txt"), "text": "hello"})]
    ex.run_units(units, jobs=2, threads=1, say=said.append, label="t")
    assert (tmp_path / "marker").read_text() == "second attempt"
    assert (tmp_path / "out.txt").read_text().startswith("hello ")
    assert int((tmp_path / "out.txt").read_text().split()[1]) != os.getpid()  # in a worker process
    assert any("[dies] the worker died (signal 9); starting it again" in s for s in said)
    assert "[writes] writing out.txt" in said
    assert said[-1].startswith("t: 2/2 runs done, 0 running, 0 left")

    units = [ex.Unit("bad", _refuse), ex.Unit("good", _write, {"path": str(tmp_path / "b.txt"), "text": "x"})]
    with pytest.raises(TrainError) as err:
        ex.run_units(units, jobs=1, threads=1, say=lambda m: None)
    assert "1 of 2 runs failed: bad: this run's settings are wrong (fix them)" in str(err.value)
    assert (tmp_path / "b.txt").exists()  # the other unit still ran


def test_bad_jobs_values_are_usage_errors(tmp_path):
    for bad in ("0", "two", "-1", "100000"):
        code, _, err = _cli("compare", "rope", "--out", str(tmp_path / "s"), "--jobs", bad)
        assert code == 2 and "--jobs expects a number of worker processes" in err, (bad, err)
    code, _, err = _cli("compare", "--study", "frequency", "--out", str(tmp_path / "f"), "--jobs", "0")
    assert code == 2 and "--jobs expects a number of worker processes" in err
    assert not (tmp_path / "s").exists()


def _strip(tree):
    return without_keys(tree, TIMING)


def _metrics(run: Path) -> list[dict]:
    return [_strip(json.loads(line)) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_jobs_2_equals_a_serial_study_bit_for_bit(tmp_path):
    serial, par = tmp_path / "serial", tmp_path / "par"
    code, _, err = _cli("compare", "rope", "alibi", "--out", serial, *TINY)
    assert code == 0, err
    code, out, err = _cli("compare", "rope", "alibi", "--out", par, *TINY, "--jobs", "2", "--track", "tensorboard")
    assert code == 0, err
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(par / "runs" / "rope" / "tensorboard"))
    acc.Reload()
    logged = [json.loads(line) for line in (par / "runs" / "rope" / "metrics.jsonl").read_text().splitlines()]
    # the same number logged twice: TensorBoard stores a float32 scalar, one rounding of the logged float64
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [
        (r["step"], pytest.approx(r["loss"], rel=F32_EPS, abs=0)) for r in logged]
    a = json.loads((serial / "results.json").read_text())["results"]
    b = json.loads((par / "results.json").read_text())["results"]
    assert _strip(a) == _strip(b) and a["rope"]["eval"] and a["alibi"]["analysis"]
    for name in ("rope", "alibi"):
        assert _metrics(serial / "runs" / name) == _metrics(par / "runs" / name)
        ckpt = "checkpoints/step_0000012/model.safetensors"
        assert (serial / "runs" / name / ckpt).read_bytes() == (par / "runs" / name / ckpt).read_bytes()
    assert "report:" in out and (par / "report.html").is_file()


@pytest.mark.slow
def test_a_killed_training_worker_resumes_from_its_checkpoint_and_a_rerun_reuses_it(tmp_path):
    out = tmp_path / "study"
    sets = {**SETS, "checkpoint_every": 4, "eval_every": 40}
    settings = {"steps": 40, "lengths": [32], "windows": 1, "analyze_max": 32, "sets": sets, "preset": "tiny"}
    run = out / "runs" / "rope"
    killed: list[int] = []

    def kill_after_first_checkpoint():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not killed:
            done = [p for p in (run / "checkpoints").glob("step_*") if "." not in p.name]  # not a write under way
            if done and (run / ".pedsl.lock").exists():
                text = (run / ".pedsl.lock").read_text().strip()
                if text:
                    pid = json.loads(text)["pid"]
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            time.sleep(0.02)

    watcher = threading.Thread(target=kill_after_first_checkpoint, daemon=True)
    watcher.start()
    said: list[str] = []
    parallel.prepare(parallel.compare_units(["rope"], out, **settings), out,
                     parallel.Executor(jobs=1, threads=1), say=said.append, label="compare")
    watcher.join(5)
    assert killed and killed[0] != os.getpid()
    assert any("the worker died (signal 9)" in s for s in said), said
    assert any("rope: resuming 40 steps" in s for s in said), "\n".join(said)
    assert json.loads((run / "DONE.json").read_text())["steps"] == 40
    said.clear()
    parallel.prepare(parallel.compare_units(["rope"], out, **settings), out,
                     parallel.Executor(jobs=1, threads=1), say=said.append, label="compare")
    assert any("reusing the finished run" in s for s in said) and any("reusing eval.json" in s for s in said)


def test_a_seeded_study_is_one_unit_per_scheme_and_seed(tmp_path):
    units = parallel.seeded_units("retrieval", ["rope", "alibi"], tmp_path, seeds=[0, 3], steps=5, quick=True)
    assert [u.label for u in units] == ["rope seed 0", "alibi seed 0", "rope seed 3", "alibi seed 3"]
    assert all(u.fn is parallel._seeded_one and u.kwargs["study"] == "retrieval" and u.kwargs["steps"] == 5
               for u in units)
    assert [u.label for u in parallel.compare_units([], tmp_path)] == list(parallel.cmp.DEFAULT_SCHEMES)
    with pytest.raises(ConfigError, match="named twice"):
        parallel.compare_units(["rope", "rope"], tmp_path)


def _children(pid: int) -> set[int]:
    """The live child processes of ``pid`` (Linux /proc)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found |= {int(c) for c in (task / "children").read_text().split()}
        except OSError:
            pass
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads child processes from Linux /proc")
def test_sigterm_stops_the_study_and_its_worker_processes(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "study"
    lock = out / "runs" / "rope" / ".pedsl.lock"
    args = [a if a != "12" else "4000" for a in TINY]  # long enough to be training when the signal comes
    proc = subprocess.Popen([sys.executable, "-m", "pedsl", "compare", "rope", "alibi", "--out", str(out), *args,
                             "--jobs", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None and not (lock.exists() and lock.read_text().strip()):
        time.sleep(0.1)
    workers = _children(proc.pid)
    assert workers, "the study never started its workers"
    try:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)  # orphans would hold stderr open: this would time out
        assert proc.returncode == 128 + signal.SIGTERM and "pedsl: terminated (SIGTERM)" in err, err
        assert "Traceback" not in err
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(_alive(p) for p in workers):
            time.sleep(0.1)
        assert not [p for p in workers if _alive(p)], "worker processes outlived the study"
    finally:
        for p in workers | {proc.pid}:
            if _alive(p):
                os.kill(p, signal.SIGKILL)

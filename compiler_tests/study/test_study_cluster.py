"""`pedsl compare --executor ray|slurm`: every run a Ray task on a local Ray of two CPUs, or a job of
submitit's local executor; the study's numbers equal a serial study's (--threads pinned); a machine
without Slurm or without the library is a clear error."""

from __future__ import annotations

import json
import shutil

import pytest

from compiler_helpers import run_cli as _cli
from compiler_helpers import without_keys
from pedsl.errors import ConfigError
from pedsl.study import cluster, parallel

SETS = {"context": 32, "batch_size": 4, "n_layers": 1, "d_model": 32, "n_heads": 2, "data.max_bytes": 100000,
        "eval_every": 12, "eval_batches": 1, "warmup": 2}
TINY = ["--steps", "12", "--lengths", "32,64", "--windows", "2", "--analyze-max", "64", "--threads", "1", "-q",
        *[a for k, v in SETS.items() for a in ("--set", f"{k}={v}")]]
SETTINGS = {"steps": 12, "lengths": [32, 64], "windows": 2, "analyze_max": 64, "sets": SETS, "preset": "tiny"}
TIMING = {"wall_time_s", "cpu_time_s", "tokens_per_s", "run"}


def _strip(tree):
    return without_keys(tree, TIMING)


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    out = tmp_path_factory.mktemp("serial") / "study"
    code, _, err = _cli("compare", "rope", "alibi", "--out", out, *TINY)
    assert code == 0, err
    return json.loads((out / "results.json").read_text())["results"]


@pytest.mark.slow
def test_ray_tasks_on_a_local_ray_equal_a_serial_study(tmp_path, serial):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")  # a small local Ray; the study joins it
    try:
        code, _, err = _cli("compare", "rope", "alibi", "--out", tmp_path / "s", *TINY, "--executor", "ray")
    finally:
        ray.shutdown()
    assert code == 0, err
    assert _strip(json.loads((tmp_path / "s" / "results.json").read_text())["results"]) == _strip(serial)


@pytest.mark.slow
def test_submitit_jobs_equal_a_serial_study(tmp_path, serial):
    out = tmp_path / "s"
    said: list[str] = []
    units = parallel.compare_units(["rope", "alibi"], out, **SETTINGS)
    parallel.prepare(units, out, parallel.Executor(kind="slurm", threads=1, cluster="local"), say=said.append,
                     label="compare")
    assert said[-1].startswith("compare: 2/2 runs done, 0 running, 0 left")
    assert len(list((out / "slurm").glob("*_log.out"))) >= 2  # submitit's job logs beside the study
    code, _, err = _cli("compare", "rope", "alibi", "--out", out, *TINY)  # reuses both runs, writes the report
    assert code == 0, err
    assert _strip(json.loads((out / "results.json").read_text())["results"]) == _strip(serial)


def test_executor_options_are_checked_before_anything_runs(tmp_path, monkeypatch):
    code, _, err = _cli("compare", "rope", "--out", tmp_path / "s", "--address", "auto")
    assert code == 2 and "--address applies to --executor ray only" in err
    code, _, err = _cli("compare", "rope", "--out", tmp_path / "s", "--executor", "ray", "--partition", "gpu")
    assert code == 2 and "--partition applies to --executor slurm only" in err
    monkeypatch.setattr(cluster.importlib.util, "find_spec", lambda name: None)
    code, _, err = _cli("compare", "rope", "--out", tmp_path / "s", "--executor", "ray")
    assert code == 1 and "pip install 'pedsl[ray]'" in err and len(err.strip().splitlines()) <= 3
    assert not (tmp_path / "s").exists()


def test_slurm_without_slurm_is_a_clear_error_never_a_local_run(tmp_path):
    if shutil.which("srun"):
        pytest.skip("this machine has Slurm")
    with pytest.raises(ConfigError, match="no Slurm here"):
        cluster.run_slurm([], threads=1, say=lambda m: None, folder=tmp_path / "slurm")


@pytest.mark.parametrize("sbatch, said", [
    ('echo "sbatch: error: Batch job submission failed: Invalid partition" >&2\nexit 1', "Invalid partition"),
    ("echo garbage", "Could not make sense of sbatch output"),
], ids=["sbatch-fails", "sbatch-garbage"])
def test_sbatch_that_fails_or_prints_garbage_is_a_clear_error(tmp_path, monkeypatch, sbatch, said):
    """A fake Slurm on PATH: sbatch exits 1 (submitit's FailedJobError) or prints no job id
    (FailedSubmissionError); both were exit 3."""
    pytest.importorskip("submitit")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name, body in (("sbatch", sbatch), ("srun", "exit 0"), ("squeue", "exit 0"), ("sacct", "exit 0"),
                       ("scancel", "exit 0")):
        (bin_ / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_ / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}:{__import__('os').environ['PATH']}")
    code, _, err = _cli("compare", "rope", "--out", tmp_path / "s", *TINY, "--executor", "slurm")
    assert code == 1, err
    assert "error[E981]: --executor slurm: the job could not be submitted" in err and said in err


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("address, code, said", [
    ("ray://127.0.0.1:{closed}", 1, "nothing accepts a connection at 127.0.0.1:{closed} within 3 s"),
    ("127.0.0.1:{closed}", 1, "nothing accepts a connection at 127.0.0.1:{closed} within 3 s"),
    ("[::1]:{closed}", 1, "cannot join the Ray cluster"),
    ("no-such-host.invalid:6379", 1, "does not resolve"),
    ("auto", 1, "cannot join the Ray cluster at 'auto'"),
    ("http://[::1", 2, "is not a Ray address"),
    ("127.0.0.1", 2, "is not a Ray address"),
    ("ray://127.0.0.1:x", 2, "is not a Ray address"),
], ids=["client-closed", "gcs-closed", "v6-closed", "unresolvable", "auto-none", "bad-url", "no-port", "bad-port"])
def test_a_ray_address_that_cannot_be_joined_is_refused_in_seconds(tmp_path, monkeypatch, address, code, said):
    """Each was exit 3 after 3-34 s, and a closed GCS port hung past 240 s; now a TCP probe with a stated
    3 s timeout (and the syntax before it) refuses them before the study starts."""
    import time

    pytest.importorskip("ray")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "ray"))  # 'auto' must not find another test's cluster
    closed = _closed_port()
    t0 = time.monotonic()
    got, _, err = _cli("compare", "rope", "--out", tmp_path / "s", *TINY, "--executor", "ray",
                       "--address", address.format(closed=closed))
    assert time.monotonic() - t0 < 20
    assert got == code and said.format(closed=closed) in err, err
    assert not (tmp_path / "s").exists()


def test_a_port_that_answers_but_not_as_ray_is_refused_in_seconds(tmp_path):
    """A listening socket that is not a Ray head (ray.init waited for a GCS there for minutes): the probe
    sends an HTTP/2 preface and wants gRPC's SETTINGS frame back within the timeout."""
    import socket
    import time

    pytest.importorskip("ray")
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        port = srv.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(ConfigError, match="is not a Ray head"):
            cluster.check_ray_address(f"127.0.0.1:{port}", timeout=1.0)
        assert time.monotonic() - t0 < 5

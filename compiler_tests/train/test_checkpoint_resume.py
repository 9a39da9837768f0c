"""Checkpoints that survive faults: a SIGKILLed run resumed with --resume logs exactly the
losses of an uninterrupted run; corrupt, truncated, missing and mismatched checkpoints give a
CheckpointError that names the file and what differs (never a silent restart)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from pedsl.errors import CheckpointError
from pedsl.model import TransformerLM
from pedsl.train import checkpoint as ck
from pedsl.train.loop import train
from train_helpers import helper, read_metrics, small_cfg

HELPER = Path(__file__).parent / "fixtures" / "train_helper.py"


def _run(cfg, run: Path, *extra: str) -> subprocess.Popen:
    cfg_file = run.parent / f"{run.name}.json"
    cfg_file.write_text(cfg.model_dump_json())
    return subprocess.Popen([sys.executable, str(HELPER), str(cfg_file), str(run), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _logged(run: Path) -> list[tuple]:
    return [(r["step"], r["loss"], r["lr"], r.get("val_loss")) for r in read_metrics(run)]


@pytest.mark.slow
def test_resume_after_sigkill_reproduces_the_uninterrupted_losses(tmp_path):
    cfg = small_cfg(steps=120, checkpoint_every=25, eval_every=40, log_every=5)
    victim = _run(cfg, tmp_path / "victim", "--sleep", "0.01")
    train(cfg, tmp_path / "ref", attention=helper.spec(), quiet=True)  # the uninterrupted run, in this process
    metrics = tmp_path / "victim" / "metrics.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline:  # kill somewhere after step 60 (checkpoint 50 exists), mid-interval
        try:
            steps = [json.loads(x)["step"] for x in metrics.read_text().splitlines() if x.endswith("}")]
        except (FileNotFoundError, json.JSONDecodeError):
            steps = []
        if steps and steps[-1] >= 60:
            break
        time.sleep(0.005)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL
    killed_at = max(json.loads(x)["step"] for x in metrics.read_text().splitlines() if x.endswith("}"))
    assert killed_at < 120, "the run finished before it was killed"
    resumed = _run(cfg, tmp_path / "victim", "--resume")
    assert resumed.wait(120) == 0, resumed.stderr.read()
    assert _logged(tmp_path / "victim") == _logged(tmp_path / "ref")
    a = json.loads((tmp_path / "ref" / "DONE.json").read_text())
    b = json.loads((tmp_path / "victim" / "DONE.json").read_text())
    assert a["val_loss"] == b["val_loss"]


def test_in_process_resume_matches_and_extends(tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    train(small_cfg(steps=30), full, attention=helper.spec(), quiet=True)
    train(small_cfg(steps=20), part, attention=helper.spec(), quiet=True)
    # `steps` may change on resume (the schedule then differs, so only check it runs and logs on).
    train(small_cfg(steps=30), part, attention=helper.spec(), quiet=True, resume=True)
    assert [r["step"] for r in read_metrics(part)] == [r["step"] for r in read_metrics(full)]


@pytest.fixture(scope="module")
def trained_once(tmp_path_factory):
    run = tmp_path_factory.mktemp("trained") / "run"
    train(small_cfg(steps=20), run, attention=helper.spec(), quiet=True)
    return run


@pytest.fixture()
def trained(tmp_path, trained_once):
    """A finished 20-step run (checkpoints 10 and 20), a fresh copy per test."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained_once, run, symlinks=True)
    return run


def _resume(run, **kw):
    train(small_cfg(steps=30, **kw), run, attention=helper.spec(kw.pop("kind", "nope")), quiet=True, resume=True)


def _only_newest(run: Path) -> None:
    """Drop the older checkpoint, so a damaged newest one cannot be passed over (see the fallback tests)."""
    import shutil

    shutil.rmtree(run / "checkpoints" / "step_0000010")


def test_truncated_model_file_names_the_file(trained):
    _only_newest(trained)
    f = trained / "checkpoints" / "step_0000020" / "model.safetensors"
    f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="step_0000020/model.safetensors' is corrupt or truncated") as exc:
        _resume(trained)
    assert exc.value.file == str(f) and "delete" in exc.value.hint


def test_corrupt_optimizer_file_is_detected(trained):
    _only_newest(trained)
    f = trained / "checkpoints" / "step_0000020" / "optim.safetensors"
    data = bytearray(f.read_bytes())
    data[-5] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="optim.safetensors' is corrupt"):
        _resume(trained)


def test_missing_state_json(trained):
    _only_newest(trained)
    (trained / "checkpoints" / "step_0000020" / "state.json").unlink()
    with pytest.raises(CheckpointError, match="has no state.json"):
        _resume(trained)


def test_resume_without_checkpoints_is_an_error_not_a_fresh_start(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint found"):
        train(small_cfg(steps=5), tmp_path / "empty", attention=helper.spec(), quiet=True, resume=True)


def test_resume_with_another_scheme(trained):
    with pytest.raises(CheckpointError, match="trained with another scheme"):
        train(small_cfg(steps=30), trained, attention=helper.spec("alibi"), quiet=True, resume=True)


def test_resume_with_another_shape_names_the_setting(trained):
    with pytest.raises(CheckpointError, match=r"model.d_model: 32 in the run, 64 now"):
        _resume(trained, d_model=64)


def test_shape_mismatch_names_the_tensor(trained):
    path = ck.latest_checkpoint(trained / "checkpoints")
    _, _, state = ck.read_checkpoint(path)
    cfg = small_cfg(d_model=64)
    model = TransformerLM(cfg.model, helper.spec().factory(cfg.model))
    with pytest.raises(CheckpointError, match=r"tensor 'blocks.0.attn.proj.weight' has shape \[32, 32\] in the checkpoint and \[64, 64\]"):
        ck.check_compatible(path, state, scheme_hash=state["scheme_hash"], config_hash=state["config_hash"],
                            model=model)


def test_leftover_temporary_checkpoint_is_ignored(trained):
    (trained / "checkpoints" / "step_0000030.tmp-999").mkdir()
    assert ck.latest_checkpoint(trained / "checkpoints").name == "step_0000020"


def test_rng_state_roundtrip():
    state = ck.rng_state()
    a = torch.rand(3)
    json.loads(json.dumps(state))
    ck.set_rng_state(state)
    assert torch.equal(torch.rand(3), a)


# ---------------------------------------------------------------------------------------------
# state.json is validated (a Pydantic schema, the step against the folder's name); a damaged
# newest checkpoint is passed over for the previous valid one, said so; stale temporary folders go


def _edit_state(run: Path, **changes) -> Path:
    f = run / "checkpoints" / "step_0000020" / "state.json"
    state = json.loads(f.read_text())
    state.update(changes)
    f.write_text(json.dumps(state))
    return f


@pytest.mark.parametrize("changes, needle", [
    ({"step": -5}, "step: Input should be greater than or equal to 0"),
    ({"step": "20"}, "step: Input should be a valid integer"),
    ({"step": 7}, "it says step 7 in the folder of step 20"),
    ({"files": {"model.safetensors": "x"}}, "files: Value error, needs the sha256 of model.safetensors"),
    ({"rng": {"torch": "!!", "python": []}}, "rng.torch: Value error, the torch RNG state is not base64"),
    ({"shapes": {"w": [-3]}}, "shapes: Value error, a tensor size is negative"),
])
def test_invalid_state_json_is_refused_by_field(trained, changes, needle):
    _only_newest(trained)
    f = _edit_state(trained, **changes)
    with pytest.raises(CheckpointError, match=re.escape(needle)) as exc:
        _resume(trained)
    assert exc.value.file == str(f) and "delete" in exc.value.hint
    assert (trained / "checkpoints" / "step_0000020").is_dir()  # nothing deleted: the user decides


def test_garbage_and_missing_fields_in_state_json(trained):
    _only_newest(trained)
    f = trained / "checkpoints" / "step_0000020" / "state.json"
    good = f.read_text()
    for garbage in (b"\x00\xff\xfe garbage", b"[1, 2", b"[]", b"null"):
        f.write_bytes(garbage)
        with pytest.raises(CheckpointError, match="state.json' is (corrupt|invalid)"):
            _resume(trained)
    state = json.loads(good)
    del state["rng"]
    f.write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match="rng: Field required"):
        _resume(trained)


def test_negative_step_never_trains_with_a_negative_learning_rate(trained):
    _only_newest(trained)
    _edit_state(trained, step=-5)
    with pytest.raises(CheckpointError):
        _resume(trained)
    assert all(r["lr"] > 0 for r in read_metrics(trained))


def test_damaged_newest_checkpoint_falls_back_to_the_previous_one(trained, tmp_path, capfd):
    _edit_state(trained, step=-5)
    _resume(trained)
    err = capfd.readouterr().err
    assert "checkpoint step_0000020 cannot be used" in err and "resuming from step_0000010" in err
    names = sorted(p.name for p in (trained / "checkpoints").iterdir())
    assert names == ["step_0000020", "step_0000020.bad", "step_0000030"]  # redone from step 10; the bad one kept aside
    assert json.loads((trained / "checkpoints" / "step_0000020.bad" / "state.json").read_text())["step"] == -5
    # the same losses as a run resumed from step 10 of an intact copy
    ref = tmp_path / "ref"
    train(small_cfg(steps=20), ref, attention=helper.spec(), quiet=True)
    import shutil

    shutil.rmtree(ref / "checkpoints" / "step_0000020")
    _resume(ref)
    assert _logged(trained) == _logged(ref)


def test_stale_temporary_checkpoint_folders_are_removed(trained, capfd):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = trained / "checkpoints" / f"step_0000030.tmp-{dead.pid}"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    old = trained / "checkpoints" / f"step_0000010.old-{dead.pid}"
    old.mkdir()
    _resume(trained)
    assert not stale.exists() and not old.exists()
    assert "removed 2 temporary checkpoint folder(s)" not in capfd.readouterr().err  # quiet
    stale.mkdir()
    from pedsl.train import runlock

    assert runlock.clean_temporary(trained / "checkpoints") == [stale]
    mine = trained / "checkpoints" / f"step_0000040.tmp-{os.getpid()}"  # a live process's: kept
    mine.mkdir()
    assert runlock.clean_temporary(trained / "checkpoints") == [] and mine.exists()


def test_disk_full_hint_names_the_temporary_folders(trained, monkeypatch):
    from pedsl.errors import OutputError

    leftover = trained / "checkpoints" / f"step_0000015.tmp-{os.getpid()}"  # a live pid: not cleaned
    leftover.mkdir()
    real_write = ck.write_new_bytes

    def full(path, data):
        if "tmp-" in str(path):
            raise OSError(28, "No space left on device")
        return real_write(path, data)

    monkeypatch.setattr(ck, "write_new_bytes", full)
    with pytest.raises(OutputError, match="No space left on device") as exc:
        _resume(trained, checkpoint_every=25)
    assert leftover.name in exc.value.hint
    assert not (trained / "checkpoints" / f"step_0000030.tmp-{os.getpid()}").exists()  # its own half-write is gone

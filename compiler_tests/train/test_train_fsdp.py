"""FSDP2: `torchrun --nproc-per-node 2 ... --shard fsdp` (gloo, CPU) gives the single-process loss curve
with the same global batch (up to float32 rounding: train_helpers.curve_bound); its checkpoints hold the whole state (gathered on
rank 0) and resume under FSDP or in one process to the same curve; FSDP on one process is refused."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from pedsl.config import TrainConfig
from pedsl.errors import UsageError
from pedsl.train.loop import train
from train_helpers import TORCHRUN, curve_bound, helper, read_metrics, small_cfg, torchrun_env

HELPER = Path(__file__).parent / "fixtures" / "train_helper.py"


def _fsdp(cfg_file: Path, out: Path, *extra: str) -> None:
    two = subprocess.run([*TORCHRUN, "--standalone", "--nproc-per-node", "2", str(HELPER), str(cfg_file), str(out),
                          "--attention", "alibi", "--shard", "fsdp", *extra],
                         capture_output=True, text=True, env=torchrun_env(), timeout=240)
    assert two.returncode == 0, two.stderr[:3000]


def _same_curve(cfg, a: list[dict], b: list[dict]) -> None:
    """The same curve up to the rounding of differently ordered reductions (sharded gradients, gathered
    weights); the gradient norm also sums the squares of a whole parameter tensor (the largest: the
    embedding)."""
    assert [r["step"] for r in a] == [r["step"] for r in b]
    widest = cfg.model.vocab_size * cfg.model.d_model
    for ra, rb in zip(a, b):
        assert abs(rb["loss"] - ra["loss"]) <= curve_bound(cfg, ra["step"], ra["loss"])
        assert abs(rb["grad_norm"] - ra["grad_norm"]) <= curve_bound(cfg, ra["step"], ra["grad_norm"], widest)
        assert ("val_loss" in ra) == ("val_loss" in rb)
        if "val_loss" in ra:
            assert abs(rb["val_loss"] - ra["val_loss"]) <= curve_bound(cfg, ra["step"], ra["val_loss"])


@pytest.mark.slow
def test_fsdp_two_processes_match_one_process_and_resume(tmp_path):
    cfg = small_cfg(steps=12, log_every=2, eval_every=6, checkpoint_every=6, batch_size=8, n_layers=2)
    cfg_file = tmp_path / "cfg.json"
    cfg_file.write_text(cfg.model_dump_json())
    _fsdp(cfg_file, tmp_path / "two")
    train(cfg, tmp_path / "one", attention=helper.spec("alibi"), quiet=True)  # one process, same global batch
    one = read_metrics(tmp_path / "one")
    assert [r["step"] for r in one] == list(range(2, 13, 2))
    _same_curve(cfg, one, read_metrics(tmp_path / "two"))
    done = json.loads((tmp_path / "two" / "DONE.json").read_text())
    assert done["world_size"] == 2 and done["shard"] == "fsdp"
    assert sorted(p.name for p in (tmp_path / "two" / "checkpoints").iterdir()) == ["step_0000006", "step_0000012"]
    # the gathered checkpoint is the whole model: the same tensor names and shapes as one process's
    st_two = json.loads((tmp_path / "two" / "checkpoints" / "step_0000006" / "state.json").read_text())
    st_one = json.loads((tmp_path / "one" / "checkpoints" / "step_0000006" / "state.json").read_text())
    assert st_two["shapes"] == st_one["shapes"] and st_two["param_groups"] == st_one["param_groups"]

    # interrupted after step 6: resumed under FSDP, and in one process, both continue the curve
    for name in ("fsdp_resumed", "one_resumed"):
        run = tmp_path / name
        shutil.copytree(tmp_path / "two", run)
        shutil.rmtree(run / "checkpoints" / "step_0000012")
        (run / "DONE.json").unlink()
        if name == "fsdp_resumed":
            _fsdp(cfg_file, run, "--resume")
        else:
            train(cfg, run, attention=helper.spec("alibi"), resume=True, quiet=True)
        _same_curve(cfg, one, read_metrics(run))


def test_fsdp_on_one_process_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="--shard fsdp needs several processes"):
        train(small_cfg(steps=2), tmp_path / "r", attention=helper.spec(), quiet=True, shard="fsdp")
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_pedsl_train_shard_fsdp_under_torchrun_with_a_learned_scheme(tmp_path):
    from compiler_helpers import run_cli

    args = ["acc_learned_qk", "--context", "32", "--batch-size", "8", "--threads", "1", "--steps", "4", "--lr", "1e-2",
            "--set", "n_layers=2", "--set", "d_model=32", "--set", "n_heads=2", "--set", "eval_every=2",
            "--set", "eval_batches=1", "--set", "log_every=1", "--set", "checkpoint_every=2",
            "--set", "data.max_bytes=200000", "-q"]
    two = subprocess.run([*TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "pedsl", "train", *args,
                          "--shard", "fsdp", "--out", str(tmp_path / "two")],
                         capture_output=True, text=True, env=torchrun_env(), timeout=240, cwd=tmp_path)
    assert two.returncode == 0, two.stderr[:3000]
    code, _, err = run_cli("train", *args, "--out", str(tmp_path / "one"))
    assert code == 0, err
    cfg = TrainConfig.from_yaml(tmp_path / "one" / "config.yaml")
    _same_curve(cfg, read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two"))

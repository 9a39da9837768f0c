"""DDP: `torchrun --nproc-per-node 2` (gloo, CPU) gives the single-process loss curve with the
same global batch (up to float32 rounding: train_helpers.curve_bound); only rank 0 writes the run directory."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pedsl.train.loop import train
from train_helpers import TORCHRUN, curve_bound, helper, read_metrics, small_cfg, torchrun_env

HELPER = Path(__file__).parent / "fixtures" / "train_helper.py"


@pytest.mark.slow
def test_ddp_two_processes_match_one_process(tmp_path):
    cfg = small_cfg(steps=12, log_every=2, eval_every=6, checkpoint_every=6, batch_size=8)
    cfg_file = tmp_path / "cfg.json"
    cfg_file.write_text(cfg.model_dump_json())
    two = subprocess.run([*TORCHRUN, "--standalone", "--nproc-per-node", "2", str(HELPER), str(cfg_file),
                          str(tmp_path / "two")], capture_output=True, text=True, env=torchrun_env(), timeout=180)
    assert two.returncode == 0, two.stderr[-3000:]
    train(cfg, tmp_path / "one", attention=helper.spec(), quiet=True)  # one process, same global batch
    a, b = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(2, 13, 2))
    for ra, rb in zip(a, b):  # the two processes split each step's reductions: a reordering, nothing more
        assert abs(rb["loss"] - ra["loss"]) <= curve_bound(cfg, ra["step"], ra["loss"])
        assert ("val_loss" in ra) == ("val_loss" in rb)
        if "val_loss" in ra:
            assert abs(rb["val_loss"] - ra["val_loss"]) <= curve_bound(cfg, ra["step"], ra["val_loss"])
    done = json.loads((tmp_path / "two" / "DONE.json").read_text())
    assert done["world_size"] == 2
    assert sorted(p.name for p in (tmp_path / "two" / "checkpoints").iterdir()) == ["step_0000006", "step_0000012"]

"""Thread policy: the idle cores from the load average, split over ranks; train applies it."""

from __future__ import annotations

import os

import pytest
import torch

from pedsl import torchenv as runtime


@pytest.mark.parametrize("cpus, load, others, processes, want", [
    (2, 0.0, None, 1, 2), (2, 0.9, None, 1, 1), (2, 1.6, None, 1, 1), (2, 9.0, None, 1, 1),
    (16, 3.2, None, 1, 13), (16, 0.0, None, 2, 8), (16, 12.0, None, 8, 1), (8, 0.4, None, 3, 2),
    (2, 1.0, 0, 1, 2),  # the load of a pip install that just ended: nothing runs now
    (2, 1.0, 1, 1, 1), (2, 0.2, 3, 1, 2),  # a job running now; a burst the load average has not seen
])
def test_auto_threads_takes_the_idle_cores(monkeypatch, cpus, load, others, processes, want):
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(runtime, "others_running", lambda: others)
    assert runtime.auto_threads(processes) == want


def test_others_running_reads_proc_loadavg(monkeypatch, tmp_path):
    fake = tmp_path / "loadavg"
    fake.write_text("0.50 0.40 0.30 3/250 12345\n")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda p, *a, **k: real_open(fake if p == "/proc/loadavg" else p, *a, **k))
    assert runtime.others_running(samples=2, interval=0) == 2
    fake.write_text("garbage\n")
    assert runtime.others_running(samples=1) is None


def test_auto_threads_without_a_load_average(monkeypatch):
    def no_load():
        raise OSError("no load average here")

    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.setattr(os, "getloadavg", no_load)
    monkeypatch.setattr(runtime, "others_running", lambda: None)
    assert runtime.auto_threads() == 4 and runtime.auto_threads(3) == 1


def test_train_applies_the_policy_when_threads_is_zero(monkeypatch, tmp_path, capsys):
    from train_helpers import helper, small_cfg
    from pedsl.train.loop import train

    before = torch.get_num_threads()
    monkeypatch.setattr(runtime, "auto_threads", lambda processes=1: 1 if before != 1 else 2)
    want = 1 if before != 1 else 2
    try:
        train(small_cfg(threads=0, steps=2, log_every=1, eval_every=2, checkpoint_every=2), tmp_path / "run",
              attention=helper.spec("nope"))
        assert torch.get_num_threads() == want
    finally:
        torch.set_num_threads(before)
    assert f"({want} CPU thread(s) each)" in capsys.readouterr().err

"""Thread policy: the idle cores from the load average, split over ranks; train applies it."""

from __future__ import annotations

import os

import pytest
import torch

from pedsl import runtime


@pytest.mark.parametrize("cpus, load, processes, want", [
    (2, 0.0, 1, 2), (2, 0.9, 1, 1), (2, 1.6, 1, 1), (2, 9.0, 1, 1), (16, 3.2, 1, 13), (16, 0.0, 2, 8),
    (16, 12.0, 8, 1), (8, 0.4, 3, 2),
])
def test_auto_threads_takes_the_idle_cores(monkeypatch, cpus, load, processes, want):
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    assert runtime.auto_threads(processes) == want


def test_auto_threads_without_a_load_average(monkeypatch):
    def no_load():
        raise OSError("no load average here")

    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.setattr(os, "getloadavg", no_load)
    assert runtime.auto_threads() == 4 and runtime.auto_threads(3) == 1


def test_train_applies_the_policy_when_threads_is_zero(monkeypatch, tmp_path, capsys):
    from test_train_loop import helper, small_cfg
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

"""xpos, stick_breaking and cope train end to end (a tiny budget: the loss falls, the run evaluates), and
`pedsl compile` writes a standalone module for each."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from compiler_helpers import SCHEMES, run_cli
from train_helpers import TINY, read_metrics


@pytest.mark.parametrize("name", ["xpos", "stick_breaking", "cope"])
def test_trains_with_a_falling_loss(tmp_path, name):
    run = tmp_path / name
    code, _, err = run_cli("train", str(SCHEMES / f"{name}.pe"), "--out", str(run), "--steps", "30", *TINY)
    assert code == 0, err
    losses = [m["loss"] for m in read_metrics(run) if "loss" in m]
    assert losses and all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]


@pytest.mark.parametrize("name", ["xpos", "stick_breaking", "cope"])
def test_compile_writes_a_standalone_module(tmp_path, name):
    code, _, err = run_cli("compile", str(SCHEMES / f"{name}.pe"), "-o", str(tmp_path))
    assert code == 0, err
    spec = importlib.util.spec_from_file_location(f"standalone_{name}", tmp_path / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    m = mod.Module().double()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, m.heads, 12, m.head_dim, generator=g, dtype=torch.float64) for _ in range(3))
    full = m(q, k, v)
    cache = m.new_cache(1)
    steps = [m(q[:, :, :5], k[:, :, :5], v[:, :, :5], cache=cache)]
    steps += [m(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], cache=cache) for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=2), full, rtol=1e-10, atol=1e-12)

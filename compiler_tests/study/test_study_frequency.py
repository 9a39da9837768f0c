"""The frequency-law study's pieces: the positional energy against a loop reference, the law's
fit on synthetic data with a known slope, the lag task, and a tiny end-to-end study."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pedsl.data.stream import make_generator
from pedsl.data.synthetic import lag_batch, topic_batch
from pedsl.study.frequency import measure
from pedsl.study.frequency.fit import fit_law
from pedsl.study.frequency.run import run_frequency_study


def test_positional_energy_matches_loops():
    g = torch.Generator().manual_seed(0)
    B, H, L, D = 2, 2, 7, 4
    q = torch.randn(B, H, L, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, H, L, D, generator=g, dtype=torch.float64)
    pairs = [(0, 2), (1, 3)]  # halves layout of 4 channels
    freqs = [1.0, 0.1]
    fast = measure.positional_energy(q, k, pairs, freqs)
    ref = measure.positional_energy_reference(q, k, pairs, freqs)
    assert fast.shape == (H, 2)
    assert torch.allclose(fast, ref, rtol=1e-10, atol=1e-12)


def test_positional_energy_sees_position_not_content():
    # constant q and k on pair 0 (a pure distance pattern), random content on pair 1
    g = torch.Generator().manual_seed(1)
    B, L = 16, 64
    q = torch.zeros(B, 1, L, 4, dtype=torch.float64)
    k = torch.zeros_like(q)
    q[..., 0], k[..., 0] = 1.0, 1.0
    q[..., 1] = torch.randn(B, 1, L, generator=g, dtype=torch.float64) * 3
    k[..., 1] = torch.randn(B, 1, L, generator=g, dtype=torch.float64) * 3
    e = measure.positional_energy(q, k, [(0, 2), (1, 3)], [0.5, 0.5])[0]
    assert e[0] > 0.3 and e[1] < 0.15 * e[0]  # cos(0.5 d) has variance ~1/2 over d; content averages out
    from pedsl.study.instruments import frequency_energy

    assert frequency_energy(q, k, [(0, 2), (1, 3)])[0, 1] > 0.95  # the all-channel energy: content dominates


@pytest.mark.parametrize("slope,c", [(-1.0, math.pi), (-0.6, 1.5)])
def test_fit_recovers_a_known_slope(slope, c):
    rng = np.random.default_rng(0)
    W = np.repeat([8.0, 16, 32, 64, 128], 4)
    theta = c * W ** slope * np.exp(rng.normal(0, 0.05, len(W)))
    fit = fit_law(W, theta, n_boot=400)
    assert fit["slope"] == pytest.approx(slope, abs=3 * fit["slope_se"] + 1e-9)
    assert abs(fit["slope"] - slope) < 0.05
    assert fit["slope_ci95"][0] < slope < fit["slope_ci95"][1]
    assert fit["c_free"] == pytest.approx(c, rel=0.15)
    if slope == -1.0:
        assert fit["c_ci95"][0] < c < fit["c_ci95"][1]
    exact = fit_law(W, c * W ** slope, n_boot=50)
    assert exact["slope"] == pytest.approx(slope, abs=1e-9) and exact["slope_se"] < 1e-9


def test_log_mean_frequency():
    assert measure.log_mean_frequency(np.array([1.0, 1.0, 0.0]), np.array([1.0, 0.01, 0.5])) == pytest.approx(
        0.5 * math.log(0.01))


def test_lag_task_copies_at_its_distance():
    t = lag_batch(64, 200, lag=9, g=make_generator(0))
    same = (t[:, 9:] == t[:, :-9]).float().mean().item()
    assert 0.5 < same < 0.56  # p = 1/2 plus the 1/26 chance match
    assert abs((t[:, 1:] == t[:, :-1]).float().mean().item() - 1 / 26) < 0.01


def test_topic_task_blocks_share_four_letters():
    t = topic_batch(8, 100, block_len=16, g=make_generator(1))
    for row in t:
        for b in range(0, 100, 16):
            assert 2 <= len(set(row[b:b + 16].tolist())) <= 4
    # neighbouring blocks draw their sets independently: they rarely coincide
    assert sum(set(r[:16].tolist()) == set(r[16:32].tolist()) for r in t) <= 1


@pytest.mark.parametrize("args", [["rope"], ["--data", "stdlib"], ["--seed", "3"], ["--set", "task=nope"]])
def test_cli_refuses_what_the_study_does_not_use(args, tmp_path, capsys):
    from pedsl.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["compare", "--study", "frequency", "--out", str(tmp_path), "-q", *args])
    err = capsys.readouterr().err
    assert exc.value.code in (1, 2) and "Traceback" not in err and "error" in err


@pytest.mark.slow
def test_tiny_study_end_to_end(tmp_path):
    sets = {"widths": [4, 6, 8], "seeds": [0], "d_model": 32, "n_heads": 1, "head_dim": 16, "context": 16,
            "batch_size": 2, "probe_samples": 2, "eval_batches": 1}
    res = run_frequency_study(tmp_path, steps=2, sets=dict(sets))
    assert len(res["runs"]) == 3 and [r["W"] for r in res["runs"]] == [4, 6, 8]
    assert (tmp_path / "frequency.png").exists() and "| positional energy |" in (tmp_path / "frequency.md").read_text()
    again = run_frequency_study(tmp_path, steps=2, sets=dict(sets))
    assert [r["log_freq"] for r in again["runs"]] == [r["log_freq"] for r in res["runs"]]  # runs reused


def test_cli_seeds_and_set_seeds_must_agree(tmp_path, capsys):
    from pedsl.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["compare", "--study", "frequency", "--out", str(tmp_path / "f"), "-q", "--seeds", "7,8",
              "--set", "seeds=[1, 2]"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--seeds 7,8" in err and "--set seeds=[1, 2]" in err
    assert not (tmp_path / "f").exists()


def test_cli_frequency_study_honours_seeds(tmp_path, capsys, monkeypatch):
    """`compare --study frequency --seeds 7,8` trains every width with seeds 7 and 8 (not the default
    0, 1, 2), and the printed summary and the report state them."""
    import json

    import yaml

    from pedsl.cli import main

    monkeypatch.setattr("pedsl.study.plots.save_figure", lambda fig, out, name: [f"{name}.png"])
    out = tmp_path / "f"
    tiny = ["widths=[4, 6]", "seeds=[7, 8]", "d_model=16", "n_heads=1", "head_dim=16", "context=16",
            "batch_size=2", "probe_samples=2", "eval_batches=1", "max_bytes=65536"]
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--study", "frequency", "--out", str(out), "-q", "--threads", "1", "--steps", "1",
              "--seeds", "7,8", *[x for s in tiny for x in ("--set", s)]])  # the same seeds twice: accepted
    printed = capsys.readouterr().out
    assert exc.value.code == 0
    runs = sorted(p.name for p in (out / "runs").iterdir())
    assert runs == ["topic4_s7", "topic4_s8", "topic6_s7", "topic6_s8"]
    assert {yaml.safe_load((out / "runs" / r / "config.yaml").read_text())["seed"] for r in runs} == {7, 8}
    res = json.loads((out / "frequency.json").read_text())
    assert res["meta"]["seeds"] == [7, 8] and sorted(r["seed"] for r in res["runs"]) == [7, 7, 8, 8]
    assert "seeds [7, 8]" in (out / "frequency.md").read_text() and "seeds [7, 8]" in printed


@pytest.mark.parametrize("sets", [{"seed": 3}, {"data": "stdlib"}, {"block_len": 9}, {"preset": "small"},
                                  {"widths": [8, 64], "context": 100}])
def test_study_refuses_settings_it_decides_per_run(sets, tmp_path):
    from pedsl.errors import UsageError

    with pytest.raises(UsageError) as exc:
        run_frequency_study(tmp_path, sets=dict(sets))
    assert next(k for k in sets if k != "widths") in str(exc.value)
    assert not (tmp_path / "runs").exists()

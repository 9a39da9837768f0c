"""The progress line's time-left estimate (fake clock) and the loss-curve plot from metrics.jsonl."""

from __future__ import annotations

import json

from pedsl.study.plots import loss_curves, read_metrics
from pedsl.study.progress import Eta, duration


def test_time_left_is_the_rate_so_far_times_the_work_left_and_skips_do_not_count():
    now = [0.0]
    lines: list[str] = []
    eta = Eta(10, lines.append, "study", clock=lambda: now[0])
    assert eta.left() is None
    eta.skip(2)            # reused work: 8 units left to do, at no cost
    now[0] = 50.0
    eta.done(1, "a")       # the first unit carries the start-up: no estimate yet
    assert eta.left() is None and lines[-1] == "study 12% (a) - 50 s elapsed"
    now[0] = 80.0
    eta.done(2, "b")       # 2 units in the 30 s since: 5 units left -> 75 s
    assert eta.left() == 75.0
    assert lines[-1] == "study 38% (b) - 80 s elapsed, about 75 s left"
    now[0] = 180.0
    eta.done(5)
    assert lines[-1] == "study 100% - 3 min elapsed"
    assert duration(45) == "45 s" and duration(600) == "10 min" and duration(3 * 3600 + 300) == "3 h 05 min"


def test_time_left_is_measured_per_kind_of_unit():
    """Training that costs 20 times an evaluation (weights said 6 : 1) is not estimated from the
    evaluations' pace: each kind has its own rate, the first unit's own when nothing else measured it."""
    now = [0.0]
    lines: list[str] = []
    eta = Eta({"train": 12, "eval": 2}, lines.append, "study", clock=lambda: now[0])
    now[0] = 100.0
    eta.done(6, "train a", kind="train")   # the first unit: start-up included, no estimate yet
    assert eta.left() is None
    now[0] = 105.0
    eta.done(1, "eval a", kind="eval")
    assert eta.left() == 6 * (100 / 6) + 1 * 5.0  # train at the first unit's pace, eval at its own
    eta.skip(1, kind="eval")                 # reused: nothing left of eval
    assert eta.left() == 100.0
    now[0] = 185.0
    eta.done(6, "train b", kind="train")
    assert eta.left() is None or eta.left() == 0.0
    assert lines[-1] == "study 100% (train b) - 3 min elapsed"
    other = Eta({"train": 2, "eval": 4}, lambda m: None, clock=lambda: now[0])
    now[0] += 10
    other.done(1, kind="eval")               # first unit
    now[0] += 20
    other.done(1, kind="eval")               # eval: 20 s per unit; train not measured: borrows it
    assert other.left() == 2 * 20.0 + 2 * 20.0


def test_loss_curves_draw_one_panel_per_scheme_from_metrics(tmp_path):
    for name in ("a", "b"):
        run = tmp_path / name
        run.mkdir()
        recs = [{"step": s, "loss": 5.0 / s, **({"val_loss": 4.0 / s} if s % 20 == 0 else {})} for s in range(10, 61, 10)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"step": 70, "lo')
    assert len(read_metrics(tmp_path / "a")) == 6  # the half-written last line is skipped
    files = loss_curves({"a": {0: tmp_path / "a"}, "b": {0: tmp_path / "b", 1: tmp_path / "missing"}}, tmp_path)
    assert files == ["loss_curves.png", "loss_curves.svg"] and (tmp_path / "loss_curves.png").stat().st_size > 0
    svg = (tmp_path / "loss_curves.svg").read_text()
    assert "training step" in svg and "seed 0 validation" in svg and "seed 1" not in svg
    assert loss_curves({"a": {0: tmp_path / "missing"}}, tmp_path / "none") == []

"""Seed aggregation and the significance flag on synthetic numbers with a known spread."""

from __future__ import annotations

import math

import pytest

from pedsl.study import seeds


def test_spread_is_mean_min_max_of_the_finite_values():
    s = seeds.spread([1.0, 2.0, 6.0, None, float("nan")])
    assert s == {"mean": 3.0, "min": 1.0, "max": 6.0, "n": 3}
    assert seeds.spread([None]) is None
    assert seeds.fmt(s, ".2f") == "3.00 [1.00, 6.00]"
    assert seeds.fmt(seeds.spread([2.5]), ".1f") == "2.5" and seeds.fmt(None) == "-"


@pytest.mark.parametrize("gap,expected", [(0.5, False), (1.9, False), (2.1, True), (10.0, True)])
def test_a_difference_within_the_spread_is_not_significant(gap, expected):
    # a: 1 +/- 1 (range [0, 2]); b shifted by `gap`, same width: the ranges overlap iff gap <= 2
    a = seeds.spread([0.0, 1.0, 2.0])
    b = seeds.spread([gap, 1.0 + gap, 2.0 + gap])
    assert math.isclose(b["mean"] - a["mean"], gap)
    assert seeds.significant(a, b) is expected and seeds.significant(b, a) is expected
    assert seeds.flag(a, b) == ("" if expected else " (n.s.)")


def test_one_seed_makes_no_claim():
    one, three = seeds.spread([1.0]), seeds.spread([5.0, 5.1, 5.2])
    assert seeds.significant(one, three) is None and seeds.flag(one, three) == ""


def test_aggregate_keeps_the_tree_shape_and_averages_the_leaves():
    trees = [{"ppl": {"128": {"ratio": 1.0, "tokens": 8}, "256": {"ratio": 2.0, "tokens": 8}}, "scheme": "rope",
              "far": [0.1, 0.3]},
             {"ppl": {"128": {"ratio": 1.0, "tokens": 8}, "256": {"ratio": 4.0, "tokens": 8}}, "scheme": "rope",
              "far": [0.3, 0.5]},
             {"ppl": {"128": {"ratio": 1.0, "tokens": 8}}, "scheme": "rope", "far": [0.2, 0.4]}]
    means, spreads = seeds.aggregate(trees)
    assert means["ppl"]["256"]["ratio"] == 3.0 and means["scheme"] == "rope"
    assert spreads["ppl"]["256"]["ratio"] == {"mean": 3.0, "min": 2.0, "max": 4.0, "n": 2}
    assert spreads["ppl"]["128"]["ratio"]["n"] == 3 and spreads["scheme"] is None
    assert means["far"] == pytest.approx([0.2, 0.4]) and spreads["far"][1]["max"] == 0.5
    assert seeds.spread_at(spreads, "ppl", "256", "ratio")["min"] == 2.0
    assert seeds.spread_at(spreads, "ppl", "512", "ratio") is None


def test_the_report_marks_differences_within_the_spread_and_only_those():
    from pedsl.study.seeded.run import aggregate_runs
    from pedsl.study.seeded.report import tables

    def run(seed, r256, r512):
        return {"train": {"steps": 10, "val_loss": 1.0 + seed, "wall_time_s": 1.0},
                "eval": {"ppl": {"128": {"ppl": 4.0, "ratio": 1.0}, "256": {"ppl": 5.0, "ratio": r256},
                                 "512": {"ppl": 6.0, "ratio": r512}}},
                "retrieval": None, "analysis": None, "run_dir": f"runs/x/seed{seed}"}

    # rope: 256 -> [2.0, 2.2], 512 -> [3.0, 3.4]; alibi: 256 overlaps rope's range, 512 is far below it
    results = {"rope": aggregate_runs({0: run(0, 2.0, 3.0), 1: run(1, 2.2, 3.4)}),
               "alibi": aggregate_runs({0: run(0, 2.1, 1.0), 1: run(1, 2.5, 1.1)})}
    meta = {"context": 128, "seeds": [0, 1], "data": "stdlib"}
    (title, header, rows, note), *_ = tables(results, meta)
    assert header == ["scheme", "ppl @ 128", "256 (2x)", "512 (4x)"]
    alibi = dict(zip(header, rows[1]))
    assert alibi["256 (2x)"] == "2.30 [2.10, 2.50] (n.s.)"
    assert alibi["512 (4x)"] == "1.05 [1.00, 1.10]"
    assert "n.s." not in " ".join(rows[0]) and "not significant" in note
    one = {"rope": aggregate_runs({0: run(0, 2.0, 3.0)}), "alibi": aggregate_runs({0: run(0, 2.1, 1.0)})}
    (_, _, rows, note), *_ = tables(one, {**meta, "seeds": [0]})
    assert "n.s." not in " ".join(rows[1]) and "no significance claimed" in note

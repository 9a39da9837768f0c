"""`pedsl explain`, `pedsl diff` and `pedsl graph` show a multi-axis scheme's axes, its per-axis frequency
table and which pairs read which axis."""

from __future__ import annotations

import json

from compiler_helpers import SCHEMES, run_cli


def test_explain_shows_the_axes_and_an_axis_column():
    code, out, _ = run_cli("explain", str(SCHEMES / "mrope.pe"), "-P", "head_dim=128")
    assert code == 0
    assert "positions: axes t, h, w (positions (3, B, L))" in out
    assert "axes read: pairs t: 0-15; h: 16-39; w: 40-63" in out
    rows = [line.split() for line in out.splitlines() if line.strip()[:2].strip().isdigit() and "," in line]
    axis_col = {int(r[0]): r[3] for r in rows if len(r) > 4 and r[3] in "thw"}
    assert axis_col[0] == "t" and axis_col[15] == "t" and axis_col[16] == "h" and axis_col[63] == "w"


def test_graph_text_and_json_name_the_pairs_of_each_axis():
    code, out, _ = run_cli("graph", str(SCHEMES / "mrope_interleaved.pe"))
    assert code == 0
    assert "positions: axes t, h, w" in out
    assert "axes read: pairs t: 0, 3, 6, 9, 12, 15; h: 1, 4, 7, 10, 13; w: 2, 5, 8, 11, 14" in out
    code, out, _ = run_cli("graph", str(SCHEMES / "rope_2d.pe"), "--format", "json")
    plan = json.loads(out)["plan"]
    assert plan["axes"] == ["h", "w"]
    assert {t["group"]: set(t["pair_axes"]) for t in plan["transports"]} == {"row": {"h"}, "col": {"w"}}


def test_diff_reports_the_axis_assignment_change():
    code, out, _ = run_cli("diff", str(SCHEMES / "mrope.pe"), str(SCHEMES / "mrope_interleaved.pe"))
    assert code in (0, 1)
    assert "position axes:" in out
    assert "was: axes t, h, w (positions (3, B, L)): [all] pairs t: 0-3; h: 4-9; w: 10-15" in out
    assert "now: axes t, h, w (positions (3, B, L)): [all] pairs t: 0, 3, 6, 9, 12, 15" in out
    code, out, _ = run_cli("diff", str(SCHEMES / "rope.pe"), str(SCHEMES / "rope_partial.pe"))
    assert "position axes" not in out  # one-axis schemes say nothing about axes
    code, out, _ = run_cli("diff", str(SCHEMES / "rope.pe"), str(SCHEMES / "mrope.pe"))
    assert "~ axes: [] -> [t, h, w]" in out


def test_graph_and_diff_give_the_frequencies_of_each_axis():
    """graph lists each axis's pairs with their frequency along it; diff the periods per axis, so VideoRoPE's
    temporal allocation (t on the slowest pairs) reads against M-RoPE's (t on the fastest)."""
    code, out, _ = run_cli("graph", str(SCHEMES / "mrope_interleaved.pe"))
    assert code == 0
    lines = out.split("frequencies per axis")[1].splitlines()
    assert lines[1] == "  [all] t: 0: 1, 3: 0.05546, 6: 0.003075, 9: 0.0001705, 12: 9.457e-06, 15: 5.245e-07"
    assert lines[2].startswith("  [all] h: 1: 0.3813, 4: ") and lines[3].startswith("  [all] w: 2: 0.1454, ")
    code, out, _ = run_cli("graph", str(SCHEMES / "rope.pe"))
    assert "frequencies per axis" not in out
    code, out, _ = run_cli("diff", str(SCHEMES / "mrope.pe"), str(SCHEMES / "video_rope.pe"))
    assert ("was: [all] t: periods 6.283 .. 83.79 over 4 pairs; h: periods 198.7 .. 1.49e+04 over 6 pairs; "
            "w: periods 3.533e+04 .. 2.65e+06 over 6 pairs") in out
    assert ("now: [row] h: periods 6.283 .. 3.533e+04 over 6 pairs; [col] w: periods 14.9 .. 8.379e+04 over 6 pairs; "
            "[time] t: periods 1.99e+05 .. 2.65e+06 over 4 pairs") in out

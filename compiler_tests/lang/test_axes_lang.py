"""The `axes` statement, position.AXIS, sections/interleave and the per-axis lint (the bad inputs are
fixtures/bad/axis_*.pe): typing, inheritance, formatting, frequencies per axis, W101 per axis."""

from __future__ import annotations

import math

from compiler_helpers import SCHEMES
from pedsl.lang.api import check, format as fmt, load
from pedsl.lang.ast import canonical
from pedsl.lang.parser import parse_module
from pedsl.lang.builtin_defs.axes import contiguous, interleaved
from pedsl.lang.frequencies import axis_frequencies
from pedsl.lang.lint import axis_extents, frayed_axes

AXIAL = """scheme r2 {
  axes h, w   # rows, columns
  param base: float (> 1) = 10.0
  channels { row = fraction(0.5); col = rest }
  qk on row: rotate(geometric(base) * position.h)
  qk on col: rotate(geometric(base) * position.w)
  train { context = 256 }
}
"""


def test_axes_are_declared_inherited_and_overridden():
    s = load(AXIAL)
    assert s.axes == ("h", "w")
    child = load(AXIAL + "scheme r3 extends r2 { axes h, w, z }\n", scheme="r3")
    assert child.axes == ("h", "w", "z")
    assert load((SCHEMES / "rope.pe").read_text()).axes == ()


def test_format_keeps_the_axes_statement_and_is_idempotent():
    out = fmt(AXIAL)
    assert "  axes h, w  # rows, columns\n" in out
    assert fmt(out) == out
    assert canonical(parse_module(out)) == canonical(parse_module(AXIAL))


def test_qwen_assignments():
    """Qwen2-VL [16, 24, 24] contiguous; Qwen3-VL [24, 20, 20] round-robin t, h, w while h and w last."""
    a = contiguous([16, 24, 24], 64)
    assert a == (0,) * 16 + (1,) * 24 + (2,) * 24
    b = interleaved([24, 20, 20], 64)
    assert b[:6] == (0, 1, 2, 0, 1, 2) and b[60:] == (0, 0, 0, 0)
    assert [b.count(x) for x in range(3)] == [24, 20, 20]
    assert all(b[k] == 1 for k in range(1, 60, 3)) and all(b[k] == 2 for k in range(2, 60, 3))


def test_frequencies_per_axis_follow_the_assignment():
    s = load(SCHEMES / "mrope.pe", params={"head_dim": 128})
    per = axis_frequencies(s)["all"]
    grid = [1e6 ** (-2 * k / 128) for k in range(64)]
    axis = contiguous([16, 24, 24], 64)
    for a, name in enumerate("thw"):
        for k in range(64):
            assert math.isclose(per[name][k], grid[k] if axis[k] == a else 0.0, rel_tol=1e-12, abs_tol=0)


def test_w101_per_axis_against_the_grid_extent():
    s = load(AXIAL)
    found = {(g, a): (n, ext) for g, a, n, _, _, ext in frayed_axes(s, 256)}
    assert found[("row", "h")][1] == 16 and found[("col", "w")][1] == 16  # a square 16 x 16 grid
    assert ("row", "w") not in found and ("col", "h") not in found  # a group reads one axis only
    slow = sum(1 for k in range(8) if 2 * math.pi / 10.0 ** (-2 * k / 16) > 16)
    assert found[("row", "h")][0] == slow
    wide = s.model_copy(update={"train": {"context": 256, "grid_width": 64}})  # a 4 x 64 grid
    assert axis_extents(wide, 256) == {"h": 4.0, "w": 64.0}
    assert {a for _, a, *_ in frayed_axes(wide, 256)} == {"h"}  # periods up to 47 < 64 along w
    assert axis_extents(load(SCHEMES / "mrope.pe"), 128) == {"t": 128.0, "h": 128.0, "w": 128.0}


def test_w101_per_axis_of_a_three_axis_clip():
    """Three axes and a context that is a cube: an 8 x 8 x 8 clip, each axis's extent 8 (128 is no cube: the
    whole context per axis, as text with images has); rope_3d frays along every axis there."""
    s = load(SCHEMES / "rope_3d.pe")
    assert axis_extents(s, 512) == {"t": 8.0, "h": 8.0, "w": 8.0}
    assert axis_extents(s, 1000) == {"t": 10.0, "h": 10.0, "w": 10.0}
    assert axis_extents(s, 128) == {"t": 128.0, "h": 128.0, "w": 128.0}
    found = {(g, a): (n, ext) for g, a, n, _, _, ext in frayed_axes(s, 512)}
    assert set(found) == {("time", "t"), ("row", "h"), ("col", "w")}
    assert found[("time", "t")] == (sum(1 for k in range(4) if 2 * math.pi * 100.0 ** (2 * k / 8) > 8), 8.0)
    assert "allow frayed_frequencies" in (SCHEMES / "rope_3d.pe").read_text()
    text = (SCHEMES / "rope_3d.pe").read_text().replace("allow frayed_frequencies", "")
    assert [d.code for d in check(text)].count("W101") == 3
    codes = [d.code for d in check(AXIAL)]
    assert codes.count("W101") == 2
    assert not [d for d in check(AXIAL.replace("train {", "allow frayed_frequencies\n  train {"))
                if d.code == "W101"]

"""The bias study's recipe (``pedsl compare --study bias``, see :mod:`pedsl.study.bias`): what it
trains, how long, with which seeds, and where it measures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pedsl.study.measures import Measures

HERE = Path(__file__).resolve().parent / "schemes"

# ALiBi first: the report flags every difference from the first scheme within the spread (n.s.); sandwich,
# rope and the other library schemes join by name. t5_bias_init is T5 with its table started as HF's T5
# starts it (the library's starts at zero): whether T5's rise past the training length is its budget.
SCHEMES = ("alibi", "t5_bias", str(HERE / "t5_bias_init.pe"), "kerple_log", "kerple_power", "fire")
OWN = {Path(s).stem: s for s in SCHEMES if s.endswith(".pe")}  # SCHEMES may name the study's files by stem
# the claims the study checks: each claimant should extrapolate flatter than each baseline
CLAIMANTS = ("fire", "kerple_log", "kerple_power")
BASELINES = ("t5_bias", "t5_bias_init", "alibi")
SEEDS = (0, 1, 2)
# A budget that fits its 18 runs into ~30 min of a 2-core machine with --jobs 2 --threads 1
# (docs/studies/bias.md); --steps (and --quick: 150) and --set override it.
TRAIN = {"steps": 300}
MULTIPLIERS = (1, 2, 4, 8, 16, 32)
WINDOWS = 4  # perplexity windows per length
ANALYZE_MAX = 512
QUICK: dict[str, Any] = {  # the quick run's settings, of mixed types, read by key
    "multipliers": (1, 2, 4, 8, 16), "windows": 2, "analyze_max": 256}


def measures(*, quick: bool, windows: int | None, analyze_max: int | None,
             lengths: list[int] | None = None) -> Measures:
    """Perplexity at 1x..32x the training length (16x with --quick), the instruments up to 512 tokens."""
    q = QUICK if quick else {}
    return Measures(multipliers=tuple(q.get("multipliers", MULTIPLIERS)), windows=windows or q.get("windows", WINDOWS),
                    tasks=("ppl",), analyze_max=analyze_max or q.get("analyze_max", ANALYZE_MAX),
                    lengths=tuple(lengths) if lengths else None)

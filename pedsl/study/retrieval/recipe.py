"""The retrieval study's recipe (``pedsl compare --study retrieval``, see :mod:`pedsl.study.retrieval`):
what it trains on, for how long, and where it measures."""

from __future__ import annotations

from typing import Any

from pedsl.study.measures import Measures
from pedsl.study.retrieval.score import DEPTHS, SAMPLES

SCHEMES = ("rope", "rope_id", "alibi", "acc_random_qk", "acc_random_qkv", "path", "fox", "path_fox")
# The recipe (docs/studies/retrieval.md): the three tasks plus copy rows (induction
# bait), the loss on the answers weighted up, answer lengths varied in training, and a width-8 causal
# convolution over queries and keys (model.qk_conv, docs/semantics.md §10): without it the tiny
# preset's induction heads formed in some seeds and not others within 2500 steps (passkey 0.00-0.80);
# width 4 copies the passkey (1.00 over 3 seeds) but not the multi-key needle, whose 3-letter name
# sits 7 bytes before the answer (0.32-0.47); width 8 reads the name too (probe: 0.97 at 1500 steps).
MIXTURE = "passkey:0.4,multikey:0.2,kv:0.2,copy:0.2"
TRAIN = {"steps": 1500, "answer_weight": 1.0, "train_digits": [2, 10], "qk_conv": 8}  # under --steps and --set
MULTIPLIERS = (1, 2, 4, 8, 16)
QUICK: dict[str, Any] = {  # the quick run's settings, of mixed types, read by key
    "multipliers": (1, 2, 4), "depths": (0.0, 0.5, 1.0), "samples": 2, "windows": 2, "analyze_max": 256}
WINDOWS = 8  # perplexity windows per length


def measures(*, quick: bool, windows: int | None, analyze_max: int | None,
             lengths: list[int] | None = None) -> Measures:
    """What the study measures on every run (``--windows`` also sets the retrieval samples)."""
    q = QUICK if quick else {}
    return Measures(multipliers=tuple(q.get("multipliers", MULTIPLIERS)), windows=windows or q.get("windows", WINDOWS),
                    tasks=("ppl",), analyze_max=analyze_max or q.get("analyze_max", 1024),
                    lengths=tuple(lengths) if lengths else None,
                    retrieval={"depths": list(q.get("depths", DEPTHS)), "samples": windows or q.get("samples", SAMPLES)})

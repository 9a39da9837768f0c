"""The layers study's recipe (``pedsl compare --study layers``, see :mod:`pedsl.study.layers`): its
schemes, what it trains on, for how long, and where it measures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pedsl.study.measures import Measures

HERE = Path(__file__).resolve().parent / "schemes"

# library names or the study's files: without a sink, then the same with a learned sink logit, RoPE with a
# sink token, and RoPE-ID (NoPE channels in every head of every layer: the comparison for Llama 4's NoPE layers)
SCHEMES = ("rope", str(HERE / "rope_swa.pe"), str(HERE / "gemma3.pe"), str(HERE / "llama4.pe"),
           "rope_sink", str(HERE / "rope_swa_sink.pe"), str(HERE / "gemma3_sink.pe"), str(HERE / "llama4_sink.pe"),
           "rope_sink_token", "rope_id")
OWN = {Path(s).stem: s for s in SCHEMES if s.endswith(".pe")}  # SCHEMES may name the study's files by stem
SEEDS = (0, 1, 2)
# Text for the perplexity, the three retrieval tasks and copy rows (the retrieval study's recipe,
# pedsl.study.retrieval.recipe: answer loss weighted up, answer lengths varied, a width-8 causal
# convolution over q and k). Six layers (Gemma 3's 5 : 1 pattern needs six), narrowed to width 64
# (4 heads of 16). Retrieval sets the budget: with 40% text and 400 steps no scheme learned any task
# (digits at chance); a probe of RoPE with 20% text and 1200 steps gives passkey 1.00 and multi-key
# 0.42 at 1x (perplexity 7.6). One run is about 270 s of one core (1200 steps, its perplexity,
# retrieval and analysis), so the 30 runs take about 75 minutes on two cores with --jobs 2 --threads 1.
MIXTURE = "stdlib:0.2,passkey:0.35,multikey:0.15,kv:0.15,copy:0.15"
TRAIN = {"steps": 1200, "n_layers": 6, "d_model": 64, "n_heads": 4, "head_dim": 16, "context": 128,
         "answer_weight": 1.0, "train_digits": [2, 10], "qk_conv": 8}  # under --steps and --set
MULTIPLIERS = (1, 2, 4, 8, 16, 32)          # perplexity (and the instruments up to analyze_max)
RETRIEVAL_MULTIPLIERS = (1, 2, 4, 8, 16)
DEPTHS = (0.0, 0.5, 1.0)
SAMPLES = 4
WINDOWS = 4
ANALYZE_MAX = 1024
QUICK: dict[str, Any] = {  # the quick run's settings, of mixed types, read by key
    "multipliers": (1, 2, 4), "retrieval_multipliers": (1, 2), "depths": (0.0, 1.0), "samples": 2,
    "windows": 2, "analyze_max": 256}


def measures(*, quick: bool, windows: int | None, analyze_max: int | None,
             lengths: list[int] | None = None) -> Measures:
    """What the study measures on every run (``--windows`` also sets the retrieval samples; ``--lengths``
    sets the perplexity lengths and, up to 16x, the retrieval lengths)."""
    q = QUICK if quick else {}
    mults = tuple(q.get("multipliers", MULTIPLIERS))
    return Measures(multipliers=mults, windows=windows or q.get("windows", WINDOWS), tasks=("ppl",),
                    analyze_max=analyze_max or q.get("analyze_max", ANALYZE_MAX),
                    lengths=tuple(lengths) if lengths else None,
                    retrieval={"depths": list(q.get("depths", DEPTHS)), "samples": windows or q.get("samples", SAMPLES),
                               "max_multiplier": max(q.get("retrieval_multipliers", RETRIEVAL_MULTIPLIERS))})

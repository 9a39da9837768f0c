"""What the seeded report reads out of the aggregated results: accuracy by length and by needle depth
(mean [min, max] over seeds), and what the perplexity was measured on."""

from __future__ import annotations

from pedsl.data.stream import TASK_SOURCES, parse_mixture
from pedsl.data.tasks import TASKS

TASK_TITLES = {"passkey": "passkey (single needle)", "multikey": "multi-key needle with distractors",
               "kv": "key-value lookup", "all": "mean over the three tasks"}

def acc_points(r: dict, task: str, metric: str = "accuracy") -> tuple[list[int], list[dict]]:
    """(lengths, spreads) of a scheme's accuracy vs length for a task ('all' = overall)."""
    sp = (r.get("spread") or {}).get("retrieval") or {}
    node = sp.get("overall") if task == "all" else (sp.get("tasks") or {}).get(task)
    pts = sorted((int(L), v[metric]) for L, v in (node or {}).items() if isinstance(v, dict) and v.get(metric))
    return [p[0] for p in pts], [p[1] for p in pts]


def depth_points(r: dict, task: str, L: int, metric: str = "accuracy") -> tuple[list[float], list[dict]]:
    sp = (r.get("spread") or {}).get("retrieval") or {}
    tasks = list(TASKS) if task == "all" else [task]
    by_depth: dict[float, list[dict]] = {}
    for t in tasks:
        cells = (((sp.get("tasks") or {}).get(t) or {}).get(str(L)) or {}).get("depths") or {}
        for d, v in cells.items():
            if isinstance(v, dict) and v.get(metric):
                by_depth.setdefault(float(d), []).append(v[metric])
    pts = sorted(by_depth.items())
    avg = [{k: sum(s[k] for s in ss) / len(ss) for k in ("mean", "min", "max")} | {"n": ss[0]["n"]} for _, ss in pts]
    return [p[0] for p in pts], avg

def ppl_source(meta: dict) -> str:
    """What the perplexity was measured on: the mixture's text corpus, or its first task's rows."""
    data = meta.get("data") or "stdlib"
    mix = parse_mixture(data) or [(data, 1.0)]
    if any(n not in TASK_SOURCES for n, _ in mix):
        return "the text corpus"
    return f"{mix[0][0]} rows (the mixture has no text)"

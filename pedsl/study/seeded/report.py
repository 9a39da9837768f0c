"""The seeded studies' report (``--seeds``, ``--study retrieval``, ``--study bias``): every number as mean
[min, max] over the seeds, a difference from RoPE within the spread flagged (n.s.), the bias study's
claims table (:mod:`pedsl.study.bias.claims`), and the plots of :mod:`pedsl.study.seeded.plots`."""

from __future__ import annotations

from pedsl.data.tasks import TASKS
from pedsl.study import seeds as sd
from pedsl.study.bias.claims import claims_table
from pedsl.study.page import Page, Table, figures
from pedsl.study.seeded.series import TASK_TITLES, acc_points, depth_points, ppl_source


def _cell(r: dict, part: str, *path: str) -> dict | None:
    return sd.spread_at((r.get("spread") or {}).get(part), *path)


def tables(results: dict, meta: dict) -> list[Table]:
    ctx = meta["context"]
    out = []
    ref = "rope" if "rope" in results else next(iter(results), None)
    several = len(meta.get("seeds") or []) > 1
    flag_note = (f" (n.s.) marks a difference from {ref} within the spread (min-max ranges overlap): not "
                 "significant." if several else " One seed: no spread, no significance claimed.")
    for task in ["all"] + list(TASKS):
        lens = sorted({L for r in results.values() for L in acc_points(r, task)[0]})
        if not lens or ref is None:  # ref is None only without results, so without lengths
            continue
        header = ["scheme"] + [f"{L} ({L / ctx:g}x)" for L in lens]
        rows = []
        for name, r in results.items():
            row = [name]
            for L in lens:
                path = ("overall", str(L), "accuracy") if task == "all" else ("tasks", task, str(L), "accuracy")
                s = _cell(r, "retrieval", *path)
                mark = "" if name == ref else sd.flag(s, _cell(results[ref], "retrieval", *path))
                row.append(sd.fmt(s, ".2f") + mark)
            rows.append(row)
        out.append(Table(f"Retrieval accuracy vs length: {TASK_TITLES[task]}", header, rows,
                    "Whole answer right (5 digits, greedy); mean [min, max] over seeds "
                    f"{meta.get('seeds')}, {meta.get('samples')} samples per length and depth, depths "
                    f"{meta.get('depths')} averaged. Chance is 1e-5 (a digit: 0.1)." + flag_note))
        if task == "all":
            out.append(_digits(results, lens, ctx, ref, flag_note))
    depths = sorted({d for r in results.values() for d in depth_points(r, "all", ctx)[0]})
    if depths:
        header = ["scheme"] + [f"depth {d:g}" for d in depths]
        rows = []
        for name, r in results.items():
            at_depths, cells = depth_points(r, "all", ctx)
            by = dict(zip(at_depths, cells))
            rows.append([name] + [sd.fmt(by.get(d), ".2f") for d in depths])
        out.append(Table(f"Accuracy vs needle depth at the training length {ctx} (mean over tasks)", header, rows,
                    "0 = the needle opens the haystack, 1 = it stands right before the question."))
    lens = sorted({int(L) for r in results.values() for L in (((r.get("mean") or {}).get("eval") or {}).get("ppl") or {})})
    if lens:
        header = ["scheme", f"ppl @ {ctx}"] + [f"{L} ({L / ctx:g}x)" for L in lens if L != ctx]
        rows = []
        for name, r in results.items():
            row = [name, sd.fmt(_cell(r, "eval", "ppl", str(ctx), "ppl"), ".3f")]
            for L in lens:
                if L == ctx:
                    continue
                s = _cell(r, "eval", "ppl", str(L), "ratio")
                mark = "" if name == ref else sd.flag(s, _cell(results[ref], "eval", "ppl", str(L), "ratio"))
                row.append(sd.fmt(s, ".2f") + mark)
            rows.append(row)
        out.append(Table(f"Perplexity ratio ppl(L) / ppl(L_train) on {ppl_source(meta)}", header, rows,
                    "The last L_train bytes of the same validation windows at every length." + flag_note))
    al = sorted({int(L) for r in results.values() for L in ((((r.get("mean") or {}).get("analysis") or {})
                                                              .get("summary") or {}).get("far_mass") or {})})
    if al:
        out.append(_instruments(results, al))
    header = ["scheme", "seeds", "steps", "val loss (nats/byte)", "train time (s)", "eval + retrieval + analysis (s)"]
    rows = []
    for name, r in results.items():
        t = (r.get("mean") or {}).get("train") or {}
        other = sum(((r.get("mean") or {}).get(k) or {}).get("wall_time_s") or 0 for k in ("eval", "retrieval", "analysis"))
        steps = t.get("steps")
        rows.append([name, ",".join(str(s) for s in r.get("seeds", [])), f"{steps:.0f}" if steps else "-",
                     sd.fmt(_cell(r, "train", "val_loss"), ".3f"), f"{t.get('wall_time_s') or 0:.0f}", f"{other:.0f}"])
    if meta.get("schemes"):
        out.append(Table("Schemes", ["scheme", "what it is"], [[n, d] for n, d in meta["schemes"].items()],
                         "Library schemes by name; the others are files (the study's own, or as given)."))
    mixed = ":" in str(meta.get("data") or "")
    out.append(Table("Training runs (times: mean per seed)", header, rows,
                f"Data: {meta.get('data')}" + (" (the validation loss is on the mixture)." if mixed else ".")))
    return out

def _digits(results: dict, lens: list[int], ctx: int, ref: str, flag_note: str) -> Table:
    """Digit accuracy vs length, mean over the tasks: where few whole answers are right, it still tells
    a model that reads some of the needle from one at chance (0.1)."""
    rows = []
    for name, r in results.items():
        row = [name]
        for L in lens:
            s = _cell(r, "retrieval", "overall", str(L), "digit_accuracy")
            mark = "" if name == ref else sd.flag(s, _cell(results[ref], "retrieval", "overall", str(L), "digit_accuracy"))
            row.append(sd.fmt(s, ".2f") + mark)
        rows.append(row)
    return Table("Retrieval digit accuracy vs length: mean over the three tasks",
                 ["scheme"] + [f"{L} ({L / ctx:g}x)" for L in lens], rows,
                 "Answer digits right (greedy), mean [min, max] over seeds; chance is 0.1." + flag_note)


def _learned_sinks(results: dict) -> bool:
    """Whether a run of the study has a learned sink (its analysis measured a share for it)."""
    return any(v for r in results.values() for v in ((((r.get("mean") or {}).get("analysis") or {})
                                                      .get("summary") or {}).get("learned_sink_mass") or {}).values())


def _instruments(results: dict, al: list[int]) -> Table:
    learned = _learned_sinks(results)
    sinks = [("sink_mass", L, "first token") for L in dict.fromkeys((al[0], al[-1]))]
    if learned:
        sinks += [("learned_sink_mass", L, "learned sink") for L in dict.fromkeys((al[0], al[-1]))]
    header = (["scheme"] + [f"far mass @ {L}" for L in al] + [f"{what} @ {L}" for _, L, what in sinks]
              + [f"k sigma_1 @ {al[-1]}", f"k stable rank @ {al[-1]}"])
    rows = []
    for name, r in results.items():
        rows.append([name] + [sd.fmt(_cell(r, "analysis", "summary", "far_mass", str(L)), ".3f") for L in al]
                    + [sd.fmt(_cell(r, "analysis", "summary", key, str(L)), ".3f") for key, L, _ in sinks]
                    + [sd.fmt(_cell(r, "analysis", "summary", key, str(al[-1])), spec)
                       for key, spec in (("k_sigma1", ".1f"), ("k_stable_rank", ".2f"))])
    W = next((((r.get("mean") or {}).get("analysis") or {}).get("far_window") for r in results.values()), None)
    return Table("Instruments on the same runs (mean over layers and heads)", header, rows,
                 f"Far mass: attention beyond W = {W:g} tokens; first token: attention on the first token"
                 + ("; learned sink: the share of the softmax the learned sink (logit or token) takes" if learned else "")
                 + "; sigma_1 and stable rank ||K||_F^2 / sigma_1^2 of the post-transport keys.")


CAPTIONS = {"acc_vs_length": "Accuracy vs length (band: min-max over seeds)",
            "acc_vs_depth": "Accuracy vs needle depth at the training length",
            "niah_all": "Needle in a haystack, mean over tasks", "niah_passkey": "Needle in a haystack: passkey",
            "niah_multikey": "Needle in a haystack: multi-key", "niah_kv": "Needle in a haystack: key-value",
            "ppl_ratio": "Perplexity ratio vs length", "far_mass": "Far attention mass vs length",
            "sink_mass": "Attention on the first token and on the learned sink vs length", "loss_curves": "Loss curves, one panel per scheme, a line per run"}

def _title(meta: dict, n: int) -> str:
    study = meta.get("study")
    return (f"pedsl compare --study {study}" if study and study != "default" else "pedsl compare") + \
        f": {n} schemes, seeds {meta.get('seeds')}"


def _intro(meta: dict, n: int) -> str:
    return (f"Preset `{meta.get('preset')}`, {meta.get('steps')} steps, training length {meta['context']} bytes, "
            f"seeds {meta.get('seeds')}, data: `{meta.get('data')}`. This invocation took "
            f"{meta.get('wall_time_s', 0):.0f} s ({meta.get('cpu_time_s', 0):.0f} s CPU); all runs' training, "
            f"evaluation and analysis took {meta.get('compute_time_s', 0):.0f} s in total.")

def study_tables(results: dict, meta: dict) -> list[Table]:
    """:func:`tables`, and in the bias study its claims table after the perplexity table."""
    out = tables(results, meta)
    claims = claims_table(results, meta) if meta.get("study") == "bias" else None
    if claims is not None:
        at = next((i + 1 for i, t in enumerate(out) if t.title.startswith("Perplexity ratio")), len(out))
        out.insert(at, claims)
    return out


def page(results: dict, meta: dict, plots: dict[str, list[str]]) -> Page:
    return Page(_title(meta, len(results)), _intro(meta, len(results)),
                [*study_tables(results, meta), figures(plots, CAPTIONS)], meta)

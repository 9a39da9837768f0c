"""``pedsl profile DATA``: the data's dependency profile, its width W, a PI verdict, a suggested grid.

Steps (definitions in :mod:`pedsl.profile.mi`):

1. read DATA's bytes (:mod:`pedsl.profile.sources`) and coarsen them to each granularity
   (``1`` = bytes, ``2``/``4`` = non-overlapping 2-/4-byte symbols, ``words``), each lumped to
   ``vocab`` symbols;
2. the Miller-Madow MI profile of each sequence at distances ``r`` = every integer to 128, then
   16 per octave up to ``max_distance`` (symbols), with the shuffled-pairing null;
3. the width ``W`` (bytes) of the byte profile, and the self-similarity of the granularities;
4. the verdict on PI-style interpolation: it rescales distances, so it can only be harmless when
   the data looks the same at a coarser scale (self-similar); data with characteristic distances
   (a fixed offset, a short exponential memory) sees them moved;
5. with ``suggest``: a scheme whose rotary grid is fitted to W (:func:`suggest_scheme`).

Outputs: ``OUT/profile.json``, ``OUT/profile.png`` and ``.svg`` (all through :mod:`pedsl.fsio`).
"""

from __future__ import annotations

import datetime as _dt
import math
import time
from pathlib import Path
from typing import Any, Callable, TypedDict


from pedsl.errors import DataError, OutputError, UsageError
from pedsl.limits import check_tensor
from pedsl.profile import mi as M
from pedsl.profile import sources as S
from pedsl.fsio import atomic_write_text, ensure_dir
from pedsl.study.common import write_json

MIN_SYMBOLS = 1000
LAW_C = math.pi  # theta* = c / W; the frequency-law study measures c (pedsl compare --study frequency)


def parse_granularities(text: str | None, is_text: bool) -> list[str]:
    """``"1,2,4,words"`` -> ["1", "2", "4", "words"]; the default drops ``words`` for synthetic data."""
    if not text:
        return ["1", "2", "4", "words"] if is_text else ["1", "2", "4"]
    out = [t.strip() for t in text.split(",") if t.strip()]
    for t in out:
        if t != "words" and not (t.isdigit() and 1 <= int(t) <= 8):
            raise UsageError(f"--granularities: '{t}' is not a symbol size 1-8 or 'words'",
                             hint="e.g. --granularities 1,2,4,words")
    if not out or out[0] != "1":
        out = ["1"] + [t for t in out if t != "1"]
    return list(dict.fromkeys(out))


def _check_arguments(data, out, max_bytes, max_distance, width_fraction, vocab, train_length, law_c,
                     suggest, compare) -> None:
    """Refuse bad settings, sizes over their caps and unwritable outputs before anything is read or allocated."""
    if max_bytes < MIN_SYMBOLS:
        raise UsageError(f"--max-bytes {max_bytes} is too small", hint=f"use at least {MIN_SYMBOLS}")
    if max_distance < 1 or not 0 < width_fraction < 1 or vocab < 2 or train_length < 8 or law_c <= 0:
        raise UsageError("--max-distance must be >= 1, --width-fraction in (0, 1), --vocab >= 2, "
                         "--train-length >= 8 and --law-c > 0")
    too_big = (check_tensor("profile", max_bytes, 8, f"--max-bytes {max_bytes:,} as int64 symbols")
               or check_tensor("profile", vocab * vocab, 8, f"--vocab {vocab:,}: a {vocab:,} x {vocab:,} table of "
                                                           "pair counts, int64"))
    if too_big:
        raise UsageError(too_big, code="E994", hint="lower --max-bytes (or --vocab)")
    if compare is not None and suggest is None:
        raise UsageError("--compare trains the suggested scheme: it needs --suggest FILE.pe")
    if compare is not None and data in S.SYNTHETIC and data != "blocks":
        raise UsageError(f"--compare trains on the profiled data, and '{data}' is not a training source",
                         hint="profile stdlib, a file or folder, or blocks to compare the suggestion with RoPE")
    if out is not None:  # fail on an unwritable folder before the work
        ensure_dir(out)
    if suggest is not None:
        parent = Path(suggest).expanduser().resolve().parent
        if not parent.is_dir():
            raise OutputError(f"cannot write the suggested scheme '{suggest}': folder {parent} does not exist",
                              hint="create the folder first, or choose another --suggest path")


def _profiles(x, granularities, is_text: bool, vocab: int, max_distance: int, width_fraction: float, seed: int,
              say) -> list[M.Profile]:
    """The mutual-information profile at every granularity with enough symbols."""
    profiles: list[M.Profile] = []
    for g in parse_granularities(granularities, is_text):
        codes, K, scale = S.words(x, vocab) if g == "words" else S.coarse(x, int(g), vocab)
        name = "bytes" if g == "1" else ("words" if g == "words" else f"{g}-byte")
        if len(codes) < MIN_SYMBOLS:
            say(f"  {name}: {len(codes)} symbols, too few: skipped")
            continue
        r_max = min(max_distance, len(codes) // 8)
        t1 = time.perf_counter()
        p = M.mi_profile(codes, K, M.distance_grid(r_max), name=name, scale=scale, seed=seed)
        profiles.append(p)
        w = p.width(width_fraction)
        say(f"  {name}: {len(codes):,} symbols, alphabet {K}, {len(p.r)} distances to {r_max}, "
            f"{int(p.significant.sum())} significant, W = {w if w is not None else '-'} symbols "
            f"({time.perf_counter() - t1:.1f} s)")
    return profiles


def run_profile(data: str, *, out: str | Path | None = None, max_bytes: int = 2_000_000,
                max_distance: int = 2048, granularities: str | None = None, vocab: int = 256,
                width_fraction: float = M.WIDTH_FRACTION, seed: int = 0, block_len: int = 16,
                block_offset: int = 0, train_length: int = 128, law_c: float = LAW_C,
                suggest: str | Path | None = None, compare: str | Path | None = None,
                compare_steps: int | None = None, executor: Any = None,
                say: Callable[[str], None] = lambda m: None) -> dict:
    """The whole profile; returns the JSON summary (also written to ``out/profile.json``).
    ``executor``: where ``compare``'s two runs train (a :class:`pedsl.study.parallel.Executor`;
    None: one after the other here)."""
    t0 = time.perf_counter()
    _check_arguments(data, out, max_bytes, max_distance, width_fraction, vocab, train_length, law_c, suggest, compare)
    x, desc, is_text = S.load_bytes(data, max_bytes, seed=seed, block_len=block_len, block_offset=block_offset)
    if len(x) < MIN_SYMBOLS:
        raise DataError(f"{desc} holds {len(x)} bytes, too few to profile (at least {MIN_SYMBOLS})",
                        hint="point DATA at more text, or raise --max-bytes")
    say(f"profile of {desc}: {len(x):,} bytes")
    profiles = _profiles(x, granularities, is_text, vocab, max_distance, width_fraction, seed, say)
    byte = profiles[0]
    W = byte.width(width_fraction)
    sim = M.self_similarity(profiles, width_fraction)
    verdict = pi_verdict(sim, W)
    law = law_band(W, train_length, law_c)
    result = {
        "data": data, "description": desc, "bytes": int(len(x)),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "settings": {"max_bytes": max_bytes, "max_distance": max_distance, "vocab": vocab,
                     "width_fraction": width_fraction, "z_significant": M.Z_SIGNIFICANT, "seed": seed,
                     "beta_threshold": M.BETA_THRESHOLD, "train_length": train_length, "law_c": law_c,
                     **({"block_len": block_len, "block_offset": block_offset} if data == "blocks" else {})},
        "width_bytes": W, "self_similarity": sim, "verdict": verdict, "law": law,
        "profiles": [p.to_json(width_fraction) for p in profiles],
    }
    if suggest is not None:
        text = suggest_scheme(law, W, verdict, data=data, name=Path(suggest).stem)
        atomic_write_text(suggest, text)
        result["suggestion"] = {"file": str(suggest), "period": law["grid_period"], "train_length": train_length}
        say(f"suggested scheme -> {suggest}")
        if compare is not None:
            say(f"training RoPE and {Path(suggest).name} on {data} -> {compare}")
            result["loop"] = close_loop(data, suggest, compare, steps=compare_steps, block_len=block_len,
                                        block_offset=block_offset, executor=executor, say=say)
    result["wall_time_s"] = time.perf_counter() - t0
    if out is not None:
        files = plot_profile(profiles, sim, W, Path(out))
        result["files"] = ["profile.json"] + files
        write_json(Path(out) / "profile.json", result)
    return result


class _CompareSettings(TypedDict):
    """The keyword arguments close_loop gives run_compare (and its parallel units)."""

    data: str
    steps: int | None
    quick: bool
    sets: dict


def close_loop(data: str, suggested: str | Path, out: str | Path, *, steps: int | None = None,
               block_len: int = 16, block_offset: int = 0, executor: Any = None,
               say: Callable[[str], None] = lambda m: None) -> dict:
    """Train RoPE and the suggested scheme with one budget on the profiled data (``pedsl compare``,
    quick settings: lengths to 16x, 2 windows), each run on ``executor`` first unless it is serial,
    and return each one's validation loss and perplexity ratios."""
    from pedsl.study.compare.run import run_compare  # on use: training (torch) only for --compare

    sets = {"block_len": block_len, "block_offset": block_offset} if data == "blocks" else {}
    schemes = ["rope", str(suggested)]
    settings: _CompareSettings = {"data": data, "steps": steps, "quick": True, "sets": sets}
    if executor is not None and not executor.serial:
        from pedsl.study import parallel

        parallel.prepare(parallel.compare_units(schemes, out, **settings), out, executor, say=say,
                         label="profile --compare")
    res = run_compare(schemes, out, **settings, command=f"pedsl profile {data} --compare {out}", quiet=True, say=say)
    rows = {}
    for name, r in res["results"].items():
        ppl = (r.get("eval") or {}).get("ppl", {})
        rows[name] = {"val_loss": r["train"].get("val_loss"), "steps": r["train"].get("steps"),
                      "ppl": {L: v.get("ppl") for L, v in ppl.items()},
                      "ppl_ratio": {L: v.get("ratio") for L, v in ppl.items()},
                      "blocks_accuracy": {L: v.get("accuracy")
                                          for L, v in (r.get("eval") or {}).get("blocks", {}).items()}}
    return {"dir": str(out), "wall_time_s": res["meta"]["wall_time_s"], "schemes": rows,
            "report": str(Path(out) / "report.md")}


def pi_verdict(sim: dict, W: int | None) -> dict:
    """``{"pi": "works" | "fails" | "undetermined", "text"}`` from the self-similarity check."""
    if W is None:
        return {"pi": "undetermined", "text": "no distance carries a significant dependency between bytes: "
                "positions have nothing to encode here, and the profile says nothing about PI"}
    ws = ", ".join(f"{n} {w}" for n, w in sim["widths"].items() if w is not None)
    beta = sim["beta"]
    if sim["self_similar"] is None:
        return {"pi": "undetermined", "text": f"{sim.get('reason', 'nothing to compare')}: the self-similarity "
                "check cannot decide whether PI-style interpolation would work"}
    if sim["self_similar"]:
        return {"pi": "works", "text": f"the dependency width, measured in symbols, stays put when the data "
                f"is coarsened (W: {ws}; scale exponent beta = {beta:.2f} <= {sim['threshold']}): the data looks "
                "alike at a coarser scale, so squeezing distances by a factor (PI-style interpolation) should work"}
    return {"pi": "fails", "text": f"the dependency width, measured in symbols, shrinks when the data is "
            f"coarsened (W: {ws}; scale exponent beta = {beta:.2f} > {sim['threshold']}; 1 is a fixed byte "
            "scale): the data has characteristic distances "
            "that PI-style interpolation would move, so it should not be expected to work; prefer a grid that "
            "extrapolates without rescaling (e.g. the suggested span grid) or a distance bias"}


def law_band(W: int | None, train_length: int, c: float) -> dict:
    """The frequency band of the grid fitted to W (see :func:`suggest_scheme`)."""
    w_lo = 2 * math.pi / train_length  # one full cycle in the training length: the lowest admissible
    if W is None:
        theta = None
        w_hi = math.pi / 2  # no dependency to fit: the admissible range up to period 4
    else:
        theta = c / W
        centre = max(theta, w_lo)
        w_hi = min(math.pi, max(centre * centre / w_lo, 2 * centre))
    period = 2 * math.pi / w_hi
    return {"W": W, "c": c, "theta_star": theta, "theta_star_period": None if theta is None else 2 * math.pi / theta,
            "w_low": w_lo, "w_high": w_hi, "grid_period": round(period, 3), "train_length": train_length,
            "below_admissible": theta is not None and theta < w_lo}


def suggest_scheme(law: dict, W: int | None, verdict: dict, *, data: str, name: str = "suggested") -> str:
    """A ``.pe`` scheme: all channels rotate with ``span(train_length, cycles = 1, period = P)``, the
    geometric grid from ``2 pi / train_length`` (the lowest frequency that completes a cycle in
    training: nothing frays) up to ``2 pi / P``, with ``P`` chosen so the law's ``theta* = c / W`` sits
    at the grid's geometric centre (``w_high = theta*^2 / w_low``, kept within ``[2 theta*, pi]``).
    A ``factor`` parameter (default 1) divides positions: PI at evaluation, per the verdict."""
    ident = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name) or "suggested"
    if ident[0].isdigit():
        ident = "s_" + ident
    L, P = law["train_length"], law["grid_period"]
    min_len = max(8, int(math.ceil(P)) + 1)
    if W is None:
        why = "no significant dependency was measured: the grid spans the admissible range up to period 4"
    else:
        why = (f"dependency width W = {W} bytes; the law theta* = c / W = {law['c']:.4g} / {W} = "
               f"{law['theta_star']:.4g} rad/token (period {law['theta_star_period']:.4g})")
        if law["below_admissible"]:
            why += "; theta* is below the lowest admissible frequency, so the grid starts there"
    lines = [
        f"# Suggested by `pedsl profile {data}`: {why}.",
        f"# Grid: span(train_length, cycles = 1, period = {P}) = geometric from 2 pi / train_length",
        f"# (one cycle in training, nothing frays) to 2 pi / {P}, theta* at its geometric centre.",
        "# PI verdict: " + {"works": "PI should work here: -P factor=F at evaluation interpolates positions by F.",
                            "fails": "PI is not expected to work here: keep factor = 1.",
                            "undetermined": "undetermined: factor = 1 is plain rotation."}[verdict["pi"]],
        f'scheme {ident} "RoPE with a frequency grid fitted to the data\'s dependency width" {{',
        f"  param train_length: int (>= {min_len}) = {L}",
        "  param factor: float (>= 1) = 1.0",
        "  layout halves",
        f"  let w = span(train_length, cycles = 1, period = {P})",
        "  qk: rotate(w * position / factor)",
        "  train {",
        "    context = train_length",
        "  }",
        "  eval {",
        "    lengths = train_length * [1, 2, 4, 8, 16, 32]",
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def plot_profile(profiles: list[M.Profile], sim: dict, W: int | None, out: Path) -> list[str]:
    """Two panels: excess MI vs byte distance per granularity (log-log, with the null's 4 sigma),
    and each profile over its peak vs the distance in symbols (the self-similarity check)."""
    from pedsl.study.plots import save_figure, plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for n, p in enumerate(profiles):
        col = f"C{n}"
        e = p.excess
        d = p.r * p.scale
        pos = e > 0
        a1.plot(d[pos], e[pos], ".", ms=3, color=col, alpha=0.35)
        sig = p.significant
        a1.plot(d[sig], e[sig], "-", color=col, lw=1.2, label=f"{p.name} (W = {p.width()} symbols)")
        a1.axhline(M.Z_SIGNIFICANT * p.null_std, color=col, ls=":", lw=0.8)
        if sig.any():
            w = p.width()
            a2.plot(p.r[sig], e[sig] / e[sig].max(), "-", color=col, lw=1.2,
                    label=f"{p.name}: W = {w} symbols" + ("" if n == 0 or sim["overlaps"].get(p.name) is None
                                                          else f", shape overlap {sim['overlaps'][p.name]:.2f}"))
    if W is not None:
        a1.axvline(W, color="k", ls="--", lw=1)
        a1.annotate(f"W = {W} bytes", xy=(W, 1), xycoords=("data", "axes fraction"), xytext=(4, -14),
                    textcoords="offset points", fontsize=8)
    a1.set(xscale="log", yscale="log", xlabel="distance (bytes)", ylabel="excess MI (nats)",
           title="MI above the shuffled-pairing null (dotted: 4 sigma)")
    beta = "-" if sim["beta"] is None else f"{sim['beta']:.2f}"
    a2.axhline(M.WIDTH_FRACTION, color="grey", ls=":", lw=0.8)
    a2.set(xscale="log", yscale="log", xlabel="distance r (symbols: bytes / symbol size)",
           ylabel="excess MI / its peak", title=f"rescaled profiles (self-similar: they overlap); beta = {beta}")
    for ax in (a1, a2):
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    return save_figure(fig, out, "profile")


def summary_text(res: dict) -> str:
    """The terminal report."""
    rows = [f"{res['description']}: {res['bytes']:,} bytes ({res['wall_time_s']:.1f} s)"]
    head = (f"{'granularity':>12} {'symbols':>10} {'alphabet':>8} {'MI(r=1)':>9} {'null sd':>9} {'signif.':>8} "
            f"{'W':>7} {'W bytes':>8}")
    rows += [head, "-" * len(head)]
    for p in res["profiles"]:
        w = p["width_symbols"]
        wb = "-" if w is None else f"{p['width_bytes']:.0f}"
        rows.append(f"{p['name']:>12} {p['symbols']:>10,} {p['alphabet']:>8} {p['excess'][0]:>9.4f} "
                    f"{p['null_std']:>9.2e} {p['significant_count']:>8} {'-' if w is None else w:>7} "
                    f"{wb:>8}")
    sim = res["self_similarity"]
    ov = ", ".join(f"{k} {'-' if v is None else f'{v:.2f}'}" for k, v in sim["overlaps"].items())
    rows.append(f"dependency width W = {res['width_bytes']} bytes (excess MI >= "
                f"{res['settings']['width_fraction']:g} of its peak)")
    beta = "-" if sim["beta"] is None else f"{sim['beta']:.2f}"
    rows.append(f"self-similarity: scale exponent beta = {beta} (self-similar if <= {sim['threshold']}); "
                f"shape overlap with bytes: {ov or '-'} -> "
                f"{ {True: 'self-similar', False: 'not self-similar', None: 'undetermined'}[sim['self_similar']]}")
    rows.append(f"PI verdict: {res['verdict']['pi']}: {res['verdict']['text']}")
    law = res["law"]
    if law["theta_star"] is not None:
        rows.append(f"law: theta* = c / W = {law['theta_star']:.4g} rad/token (period {law['theta_star_period']:.4g}); "
                    f"grid {law['w_low']:.4g} .. {law['w_high']:.4g} "
                    f"(periods {law['train_length']} .. {law['grid_period']})")
    if "suggestion" in res:
        rows.append(f"suggested scheme: {res['suggestion']['file']}")
    if "loop" in res:
        rows.append(f"suggested scheme vs RoPE, one budget ({res['loop']['wall_time_s']:.0f} s; "
                    f"{res['loop']['report']}):")
        for name, r in res["loop"]["schemes"].items():
            ratios = ", ".join(f"{L}: {v:.2f}" for L, v in r["ppl_ratio"].items() if v is not None)
            acc = ", ".join(f"{L}: {v:.2f}" for L, v in r["blocks_accuracy"].items() if v is not None)
            rows.append(f"  {name}: val loss {r['val_loss']:.4f} nats/byte after {r['steps']} steps; "
                        + (f"block-task accuracy {acc or '-'}" if res["data"] == "blocks" else f"ppl ratio {ratios}"))
    return "\n".join(rows)

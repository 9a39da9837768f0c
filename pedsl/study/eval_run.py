"""``pedsl eval RUN``: perplexity and retrieval vs length for one trained run -> RUN/eval.json.

eval.json::

    {"run", "scheme", "scheme_hash", "step", "context", "settings": {lengths, tasks, windows, seed},
     "ppl":     {"<L>": {"nll", "ppl", "bits_per_byte", "ratio", "tokens", "windows"}},
     "passkey": {"<L>": {"accuracy", "digit_accuracy", "answer_nll", "samples", "chance"}},
     "blocks":  {"<L>": {"accuracy", "answer_nll", "answers", "samples", "chance"}},
     "wall_time_s"}

Under another scheme (``pedsl eval RUN --scheme OTHER -P name=value``, :mod:`pedsl.train.swap`)
``scheme`` / ``scheme_hash`` are the new scheme's, ``swap`` holds its name, source hash, file,
parameters (resolved, given, carried from the run) and the run's own scheme, and the default
output is ``RUN/eval.<scheme>[.<name>=<value>...].json``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import torch

from pedsl.data.corpus import load_corpus
from pedsl.data.stream import TrainData, make_generator, task_windows, text_source
from pedsl.study.answers import blocks, passkey
from pedsl.study.common import eval_config, open_run, write_json
from pedsl.study.perplexity import perplexity
from pedsl.study.progress import Eta, length_cost
from pedsl.study.retrieval.score import evaluate_retrieval

_CORPORA: dict[str, Any] = {}
EVAL_VERSION = 2  # bump when the scoring changes: compare then recomputes older eval.json files


def validation_data(cfg) -> torch.Tensor | None:
    """The run's validation bytes (cached per data config; a mixture's text corpus), or None for
    a generated task."""
    text = text_source(cfg.data)
    if text is None:
        return None
    data_cfg = cfg.data.model_copy(update={"source": text})
    key = data_cfg.model_dump_json()
    if key not in _CORPORA:
        _CORPORA[key] = load_corpus(data_cfg)
    return _CORPORA[key].val


def settings_of(ecfg, tasks: list[str]) -> dict:
    return {"version": EVAL_VERSION, "lengths": sorted(set(ecfg.lengths)), "tasks": list(tasks), "windows": ecfg.windows, "seed": ecfg.seed}


@torch.no_grad()
def evaluate_run(run_dir: str | Path, *, lengths: list[int] | None = None, tasks: list[str] | None = None,
                 windows: int | None = None, out: str | Path | None = None,
                 say: Callable[[str], None] = lambda m: None, loaded=None) -> dict:
    """Evaluate one run; writes ``out`` (default RUN/eval.json) atomically and returns the dict."""
    t0, c0 = time.perf_counter(), time.process_time()
    model, cfg, meta = loaded or open_run(run_dir)
    ecfg = eval_config(cfg, meta["scheme"], {"lengths": lengths, "tasks": tasks, "windows": windows})
    L0 = cfg.context
    lens = sorted(set(ecfg.lengths))
    say(f"eval {meta['scheme'].name} (step {meta['step']}): lengths {lens}, tasks {', '.join(ecfg.tasks)}")
    eta = Eta(sum(length_cost(L) for L in lens) * len(ecfg.tasks), say, "eval")
    tick = lambda L: eta.done(length_cost(L), f"{L} tokens")  # noqa: E731
    result: dict[str, Any] = {"run": str(run_dir), "scheme": meta["scheme"].name, "scheme_hash": meta["scheme_hash"],
                              "step": meta["step"], "context": L0, "settings": settings_of(ecfg, ecfg.tasks)}
    if meta.get("swap"):  # evaluated under another scheme than the run's (pedsl.train.swap)
        result["swap"] = meta["swap"]
    if "ppl" in ecfg.tasks:
        data = validation_data(cfg)
        gen = None
        if data is None:
            td = TrainData(cfg.data, L0, cfg.seed)
            gen = lambda n, length: _task_windows(td, n, length, ecfg.seed)  # noqa: E731
        result["ppl"] = perplexity(model, data, lens, L0, windows=ecfg.windows, seed=ecfg.seed, say=say,
                                   generate=gen, tick=tick)
    if "passkey" in ecfg.tasks:
        result["passkey"] = passkey(model, lens, samples=ecfg.windows, digits=cfg.data.passkey_digits,
                                    seed=ecfg.seed, say=say, tick=tick)
    if "blocks" in ecfg.tasks:
        result["blocks"] = blocks(model, lens, L0, samples=ecfg.windows, block_len=cfg.data.block_len,
                                  offset=cfg.data.block_offset, seed=ecfg.seed, say=say, tick=tick)
    if "retrieval" in ecfg.tasks:
        result["retrieval"] = evaluate_retrieval(model, lens, samples=ecfg.windows, digits=cfg.data.passkey_digits,
                                                 keys=cfg.data.multikey_keys, seed=ecfg.seed, say=say)
        for L in lens:
            tick(L)
    result["wall_time_s"] = time.perf_counter() - t0
    result["cpu_time_s"] = time.process_time() - c0
    write_json(out or Path(run_dir) / output_name("eval", meta), result)
    return result


def output_name(stem: str, meta: dict) -> str:
    """``eval.json``, or ``eval.<scheme>[.<name>=<value>...].json`` for a swapped scheme (the run's
    own result is never overwritten by a swap)."""
    swap = meta.get("swap")
    return f"{stem}.{swap['suffix']}.json" if swap else f"{stem}.json"


def _task_windows(td, n: int, length: int, seed: int) -> torch.Tensor:
    return task_windows(td.cfg, n, length, make_generator(seed, length))


def eval_table(result: dict) -> str:
    """A plain-text table: one row per length."""
    ppl, pk, bl = result.get("ppl", {}), result.get("passkey", {}), result.get("blocks", {})
    rt = (result.get("retrieval") or {}).get("overall", {})
    lens = sorted({int(k) for part in (ppl, pk, bl, rt) for k in part})
    L0 = result["context"]
    head = f"{'length':>8} {'x train':>8} {'ppl':>9} {'ratio':>8} {'passkey':>8} {'blocks':>8}" + (
        f" {'retrieval':>9}" if rt else "")
    rows = [f"{result['scheme']} (step {result['step']}, training length {L0})"]
    if result.get("swap"):
        rows.append(swap_line(result["swap"]))
    rows += [head, "-" * len(head)]

    def f(d: dict, key: str, fmt: str) -> str:
        return format(d[key], fmt) if d and d.get(key) is not None else "-"

    for L in lens:
        k = str(L)
        rows.append(f"{L:>8} {L / L0:>7.3g}x {f(ppl.get(k), 'ppl', '.3f'):>9} {f(ppl.get(k), 'ratio', '.3f'):>8} "
                    f"{f(pk.get(k), 'digit_accuracy', '.2f'):>8} {f(bl.get(k), 'accuracy', '.2f'):>8}"
                    + (f" {f(rt.get(k), 'accuracy', '.2f'):>9}" if rt else ""))
    rows.append("passkey: fraction of answer digits right (chance 0.10); blocks: block ends right (chance 0.04)"
                + ("; retrieval: whole answers right, mean over passkey, multikey, kv and 5 depths (chance 1e-5)"
                   if rt else ""))
    return "\n".join(rows)


def swap_line(swap: dict) -> str:
    """One line saying which scheme replaced the run's (name, source hash, parameters)."""
    params = ", ".join(f"{k}={v}" for k, v in swap["params"].items())
    run = swap.get("run_scheme", {})
    return (f"scheme swapped: {swap['name']} (sha256 {swap['source_hash'][:12]}; {params or 'no parameters'}) "
            f"in place of the run's {run.get('name', '?')} (sha256 {str(run.get('source_hash', ''))[:12]})")

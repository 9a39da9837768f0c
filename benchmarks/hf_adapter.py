"""What ``use_pedsl_attention`` costs against the same Hugging Face model attending natively.

    python -m benchmarks.hf_adapter [--repeats 7] [--threads 1] [--json FILE]   # needs transformers

A tiny Llama from a config (hidden 256, 4 layers, 8 query / 4 key-value heads of 32, vocabulary 512,
float32, random weights, no download), ``attn_implementation="sdpa"``; batch 2:

- ``forward``: one call on L = 1,024 tokens under ``no_grad``;
- ``generate``: greedy ``generate`` of 64 tokens after a 256-token prompt (one prefill and 63
  decoding steps through HF's ``DynamicCache``).

Variants, each a deep copy of the same model: ``native`` (HF's own rotary and SDPA); ``rope``,
``dynamic`` and ``longrope`` (the model's own encoding through pedsl: HF's rotary path, a dynamic-NTK
and a LongRoPE config of the same model, each against its own native model); ``alibi`` and
``rope_id`` (schemes outside HF's family: pedsl's general path over the whole cache each call).
Each repeat runs every variant once, the starting variant rotating from repeat to repeat (the CPU is
shared with other processes: interleaving lets their load hit all variants alike); one warm-up
repeat is dropped; the ratio is the median over repeats of (variant time / its native model's time
in the same repeat). Clock: process CPU time with one thread (``--clock wall`` otherwise).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch

HIDDEN, LAYERS, HEADS, KV, VOCAB = 256, 4, 8, 4, 512
B, L_FWD, PROMPT, NEW = 2, 1024, 256, 64
ROPES = {
    "rope": {"rope_type": "default", "rope_theta": 10000.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
    "longrope": {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 512,
                 "short_factor": [1.0 + 0.05 * i for i in range(16)], "long_factor": [1.0 + 0.5 * i for i in range(16)]},
}
OTHERS = ("alibi", "rope_id")  # library schemes on the default-rope model


def _model(rope: dict):
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=4 * HIDDEN,
                                   num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV,
                                   max_position_embeddings=2048 if rope["rope_type"] != "dynamic" else 512,
                                   rope_parameters=dict(rope), attn_implementation="sdpa", pad_token_id=0,
                                   bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def variants() -> dict[str, tuple[str, object]]:
    """name -> (the native model it is measured against, model)."""
    from pedsl.hf import use_pedsl_attention
    from pedsl.lang.library import scheme_file

    out = {}
    for name, rope in ROPES.items():
        native = _model(rope)
        out[f"native-{name}"] = (f"native-{name}", native)
        out[name] = (f"native-{name}", use_pedsl_attention(copy.deepcopy(native)))
    for name in OTHERS:
        out[name] = ("native-rope", use_pedsl_attention(copy.deepcopy(out["native-rope"][1]), scheme_file(name)))
    return out


def _timed(fn, clock) -> float:
    t0 = clock()
    with torch.no_grad():
        fn()
    return clock() - t0


def run(repeats: int, clock) -> dict:
    models = variants()
    g = torch.Generator().manual_seed(0)
    tok = torch.randint(1, VOCAB, (B, L_FWD), generator=g)
    prompt = tok[:, :PROMPT]
    jobs = {"forward": lambda m: m(tok), "generate": lambda m: m.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)}
    names = list(models)
    times = {job: {n: [] for n in names} for job in jobs}
    for r in range(repeats + 1):
        order = names[r % len(names):] + names[:r % len(names)]
        for job, fn in jobs.items():
            for n in order:
                t = _timed(lambda: fn(models[n][1]), clock)
                if r:  # the first repeat warms up
                    times[job][n].append(t)
    out = {}
    for job in jobs:
        out[job] = {}
        for n in names:
            base = times[job][models[n][0]]
            ratios = [a / b for a, b in zip(times[job][n], base)]
            out[job][n] = {"median_ms": 1e3 * statistics.median(times[job][n]), "ratio": statistics.median(ratios),
                           "ratio_min": min(ratios), "ratio_max": max(ratios)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.hf_adapter")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=("auto", "cpu", "wall"), default="auto")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cpu = a.clock == "cpu" or (a.clock == "auto" and a.threads == 1)
    clock = time.process_time if cpu else time.perf_counter
    t0 = time.time()
    res = run(a.repeats, clock)
    print(f"HF adapter vs native (sdpa): hidden {HIDDEN}, {LAYERS} layers, {HEADS} q / {KV} kv heads, B={B}; "
          f"forward L={L_FWD}; generate {NEW} tokens after {PROMPT}; {a.threads} thread(s), clock "
          f"{'cpu' if cpu else 'wall'}, medians of {a.repeats} interleaved repeats, {time.time() - t0:.0f} s")
    print("| variant | path | forward ms | forward ratio | generate ms | generate ratio |")
    print("|---|---|---|---|---|---|")
    for n in res["forward"]:
        f, g_ = res["forward"][n], res["generate"][n]
        path = "native" if n.startswith("native") else "HF rotary" if n in ROPES else "general"
        print(f"| {n} | {path} | {f['median_ms']:.1f} | {f['ratio']:.2f}x ({f['ratio_min']:.2f}-{f['ratio_max']:.2f}) | "
              f"{g_['median_ms']:.1f} | {g_['ratio']:.2f}x ({g_['ratio_min']:.2f}-{g_['ratio_max']:.2f}) |")
    if a.json:
        from pedsl.fsio import atomic_write_text

        atomic_write_text(a.json, json.dumps({"results": res, "threads": a.threads, "repeats": a.repeats}, indent=1))


if __name__ == "__main__":
    main()

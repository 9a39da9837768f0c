"""Every model type the installed transformers registers, against pedsl's Hugging Face boundary.

For each model type with a causal-LM class (transformers' ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``; a vision-language
type without one through its image-text-to-text class, fed text only): build a tiny random model from its own
config class (4 layers, width 64, 4 heads of 16, the positional fields set to non-default values: a window of 6
on the layers that take one, a NoPE layer, a base of 5e4, the attention layers of a hybrid within the first four:
:data:`EXTRA`; a composite's text config shrunk so, its sliding window off, its vision tower one small layer), then

1. ``pedsl import-hf`` of its ``config.json`` (the JSON transformers writes, read back as a file is);
2. ``use_pedsl_attention`` on a copy of the model (its default scheme is that import);
3. logits of an unpadded and a left-padded batch (20 tokens, past the window) with and without the cache, and
   greedy ``generate`` of 10 tokens and a 2-beam search of 6 from the padded batch (tokens equal, beam scores
   within the tolerance), float32, against the native model.

Each type ends in exactly one state: ``exact`` (every comparison within the tolerance below), ``refused``
(a PedslError, its first sentence recorded: it names the model type and the field), ``not applicable`` (the
model's attention has no positional encoding of its own: its modeling file names no rotary, ALiBi or
relative bias), ``cannot instantiate`` (the config class or the model does not build offline; the reason),
or ``DIFFERENT`` (imported, and the logits differ: a bug, which the fast test fails on).

Tolerance: float32 logits of the same model computed by two orders of the same arithmetic (pedsl's rotation
tables in float64, rounded once), each within ``depth * eps32 * max |logit|`` of the exact logits, ``depth`` the
longest chain of roundings in them (:func:`depth`; a sum of n terms errs by at most ~n u times their magnitude in
any order, so the bound holds on every CPU): twice that apart, ``2 * depth * eps32 * max |logit|`` (5e-4 x the
largest logit for these 4-layer models; a position read wrong moves the logits by O(1)).

    python -m tools.hf_sweep                 # the full sweep; rewrites docs/hf-compatibility.md
    python -m tools.hf_sweep llama mistral   # some types only (prints, does not rewrite the table)
    python -m tools.hf_sweep --update llama  # re-sweep some types into the last full run's table
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import re
import signal
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "hf-compatibility.md"
RESULTS = ROOT / "docs" / "hf-compatibility.json"
STATES = ("exact", "refused", "not applicable", "cannot instantiate", "DIFFERENT")
F32_EPS = 2.0 ** -23  # torch.finfo(torch.float32).eps, without importing torch here
MAX_PARAMS = 150_000_000
L, WINDOW, GENERATED = 20, 6, 10
# The fields every tiny config gets (a config class ignores those it does not have).
SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=128, pad_token_id=0, bos_token_id=None,
             eos_token_id=None, tie_word_embeddings=False, num_experts=4, num_local_experts=4, n_routed_experts=4,
             moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts_per_tok=2)
# Positional fields set to values other than the defaults, where the config class has them.
POSITIONAL = dict(sliding_window=WINDOW, use_sliding_window=True, max_window_layers=1, rope_theta=5e4,
                  no_rope_layers=[1, 0, 1, 1], attention_chunk_size=8)
# Per type: the fields that give the tiny model attention layers of every kind it has (hybrids whose default
# pattern puts no attention layer in the first 4; a mix of sliding and full layers where layer_types decides)
EXTRA = {"jamba": dict(attn_layer_period=2, attn_layer_offset=1),
         "zamba": dict(attn_layer_period=2, attn_layer_offset=1),
         "bamba": dict(attn_layer_indices=[1, 3]),
         "granitemoehybrid": dict(layer_types=["linear_attention", "full_attention"] * 2),
         **{mt: dict(layer_types=["sliding_attention", "full_attention"] * 2) for mt in ("mellum", "laguna")},
         "modernbert-decoder": dict(local_attention=2 * WINDOW),
         "dots1": dict(n_shared_experts=1),
         "doge": dict(sliding_window=None),  # its window is refused by field (compiler_tests/hf/test_hf_registry.py)
         # a dense full layer that force_rope rotates, a full layer that does not
         "cohere2_moe": dict(layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
                             mlp_layer_types=["dense", "sparse", "sparse", "sparse"]),  # its class leaves it None and the model multiplies by it
         **{mt: dict(rotary_dim=8) for mt in ("gptj", "codegen")},  # half of each 16-channel head rotates
         "ergo": dict(global_attention_every_n_layers=2, global_attention_scale=2.0),  # two full layers, scaled
         # a NoPE full layer (base 0), a full layer and the sliding layers at two other bases
         **{mt: dict(layer_types=["full_attention", "sliding_attention"] * 2, layer_rope_theta=[0, 5e4, 2e4, 5e4])
            for mt in ("granite_swa", "granitemoe_swa")},
         # PhiMoE's longrope: its short factors at every length, one mscale (the 20 + 10 tokens cross original = 8)
         "phimoe": dict(rope_parameters={"rope_type": "longrope", "rope_theta": 5e4, "original_max_position_embeddings": 8,
                                         "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 4.0],
                                         "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0],
                                         "short_mscale": 1.25, "long_mscale": 1.25}),
         "lfm2_moe": dict(layer_types=["conv", "full_attention"] * 2),  # its class leaves it None
         # Ministral 3's q scale steps at multiples of the rope dict's original length: 8 (the 20 + 10 tokens cross 3)
         "ministral3": dict(rope_parameters={"rope_type": "yarn", "rope_theta": 5e4, "factor": 4.0,
                                             "original_max_position_embeddings": 8, "llama_4_scaling_beta": 0.5})}  # its class sets sliding_window to half of it
# Multi-head latent attention: a small latent head (8 unrotated + 8 rotated query/key channels, its config's head_dim
# the rotary's), values of another width than the query/key head, every head its own keys; DeepSeek-V3 with YaRN and a softmax
# mscale (mscale_all_dim), the factor crossing the 20 + 10 tokens' original length
MLA_SMALL = dict(qk_nope_head_dim=8, qk_rope_head_dim=8, head_dim=8, v_head_dim=12, kv_lora_rank=16, q_lora_rank=24,
                 num_key_value_heads=4)
EXTRA.update({mt: dict(MLA_SMALL) for mt in ("deepseek_v2", "longcat_flash", "minicpm3", "glm4_moe_lite", "youtu",
                                              "axk1", "kimi_linear", "bailing_hybrid", "sarvam_mla")})
EXTRA["deepseek_v3"] = dict(MLA_SMALL, rope_parameters={"rope_type": "yarn", "rope_theta": 5e4, "factor": 4.0,
                                                        "original_max_position_embeddings": 8, "mscale": 1.0,
                                                        "mscale_all_dim": 1.0})
# Mistral 4: DeepSeek-V3's YaRN and Llama 4's q scale stepping at multiples of original = 8; its rotary's head_dim
# the whole query/key head (its config class's), partial_rotary_factor 0.5 of it the rotated channels
EXTRA["mistral4"] = dict(MLA_SMALL, head_dim=16, n_group=1, topk_group=1, rope_parameters={
    "rope_type": "yarn", "rope_theta": 5e4, "factor": 4.0, "original_max_position_embeddings": 8, "mscale": 1.0,
    "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.5})
EXTRA["longcat_flash"]["v_head_dim"] = 20  # values wider than the query/key head: attended in two slices
EXTRA["youtu"]["rope_interleave"] = False  # the rotate_half application of a rope_interleave type
EXTRA["kimi_linear"].update(layer_types=["linear_attention", "full_attention"] * 2, linear_head_dim=16,
                           linear_num_heads=4)  # its MLA layers (NoPE) between delta-attention layers
EXTRA["bailing_hybrid"].update(layer_types=["linear_attention", "full_attention"] * 2)
for _mt in ("deepseek_v3", "axk1", "bailing_hybrid", "sarvam_mla"):  # one group of the 4 routed experts
    EXTRA[_mt].update(n_group=1, topk_group=1)
EXTRA["beam"] = dict(n_group=1, topk_group=1)  # its 8 expert groups of the 4 routed experts: one
EXTRA["lara_mini"] = dict(layer_types=["linear_attention", "sliding_attention", "full_attention", "sliding_attention"],
                         linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
                         linear_num_value_heads=4)
# The small vision tower of a vision-language model (the sweep feeds it text only)
VISION_SMALL = dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2, intermediate_size=32, out_hidden_size=64,
                    num_hidden_layers=1, num_attention_heads=2)
# mrope_section of the small heads' 8 pairs where a type's interleaved assignment needs another split
MROPE_SECTIONS = {mt: [4, 2, 2] for mt in ("qwen3_vl", "qwen3_vl_moe", "qwen3_omni_moe")}
# A fast slice for the suite: the families of the issue, one of each mechanism (a few minutes on one core).
FAST = ("llama", "mistral", "qwen2", "phi3", "gpt_neox", "gemma2", "olmo3", "exaone4", "smollm3", "jamba", "bloom",
        "deepseek_v3", "gpt2", "qwen2_vl")


@dataclass
class Result:
    model_type: str
    state: str
    compared: str = ""
    largest: float | None = None
    reason: str = ""
    seconds: float = 0.0
    details: dict = field(default_factory=dict)


def causal_types() -> list[str]:
    """The swept types: those with a causal-LM class, and every type pedsl's registry names."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from pedsl.hf.registry import REGISTRY

    return sorted(mt for mt in {*MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, *REGISTRY} if mt in CONFIG_MAPPING_NAMES)


def positional_attention(model_type: str) -> bool:
    """Whether the type's modeling file computes a position inside attention (rotary, ALiBi, a relative bias)."""
    text = "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in modeling_files(model_type))
    return bool(re.search(r"rotary|alibi|relative_attention_bias|position_bias", text, re.I)) or not text


def modeling_files(model_type: str) -> list[Path]:
    """The modeling files of a type: its config class's package (GPT-SW3 is GPT-2's, ``openai-gpt`` lives in
    ``openai``), the file named after the type where the package holds several (``data2vec-text``)."""
    import importlib

    from transformers import CONFIG_MAPPING

    package = CONFIG_MAPPING[model_type].__module__.rsplit(".", 1)[0]
    root = Path(importlib.import_module(package).__file__).parent
    own = root / f"modeling_{model_type.replace('-', '_')}.py"
    return [own] if own.exists() else sorted(root.glob("modeling_*.py"))


def _small_fields(base, model_type: str) -> dict:
    """SMALL and POSITIONAL where the config ``base`` has those fields (a text config of a composite too)."""
    kw = {k: v for k, v in {**SMALL, **POSITIONAL}.items() if hasattr(base, k)}
    kw.pop("rope_theta", None)
    rp = getattr(base, "rope_parameters", None)
    if isinstance(rp, dict) and "rope_type" in rp:  # one rope for every layer: another base
        kw["rope_parameters"] = {**rp, "rope_theta": 5e4}
        from pedsl.hf.arch import MROPE

        if "mrope_section" in rp or model_type in MROPE:  # 8 rotary pairs of the small heads, split over t, h, w
            kw["rope_parameters"]["mrope_section"] = MROPE_SECTIONS.get(model_type, [2, 3, 3])
    if "head_dim" not in kw and hasattr(base, "hidden_size"):
        kw["head_dim"] = 16
    return {**kw, **EXTRA.get(model_type, {})}


def _composite_fields(base, model_type: str) -> dict:
    """A vision-language config's small text and vision sub-configs (the text model's positional fields as a
    text model's, its sliding window off: pedsl refuses windows on M-RoPE models by name)."""
    text = base.text_config
    kw = _small_fields(text, model_type)
    kw.update(use_sliding_window=False, sliding_window=None) if hasattr(text, "use_sliding_window") else None
    text_dict = {k: v for k, v in text.to_dict().items() if k != "layer_types"}
    vision = base.vision_config.to_dict()
    vision.update({k: v for k, v in VISION_SMALL.items() if k in vision})
    return {"text_config": {**text_dict, **kw}, "vision_config": vision}


def tiny_config(model_type: str):
    """The type's config class with SMALL and POSITIONAL where it has those fields (in its text config, with a
    small vision config, for a vision-language one)."""
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    base = cls()
    composite = all(hasattr(base, k) for k in ("text_config", "vision_config"))
    kw = _composite_fields(base, model_type) if composite else _small_fields(base, model_type)
    for drop in ((), ("no_rope_layers",), ("no_rope_layers", "attention_chunk_size"), ("head_dim",),
                 ("bos_token_id", "eos_token_id"), ("bos_token_id", "eos_token_id", "head_dim")):
        try:
            cfg = cls(**{k: v for k, v in kw.items() if k not in drop})
            break
        except Exception as exc:  # noqa: BLE001 - any config class error: try with fewer fields
            err = exc
    else:
        raise RuntimeError(f"the config class refuses small sizes: {type(err).__name__}: {str(err)[:120]}")
    cfg._attn_implementation = "sdpa"
    return cfg


def _model_class(model_type: str):
    """The causal-LM auto class, or for a vision-language model without one its image-text-to-text class (fed
    text only)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)

    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        return AutoModelForImageTextToText
    return AutoModelForCausalLM


def build(model_type: str):
    import torch

    AutoModelForCausalLM = _model_class(model_type)
    cfg = tiny_config(model_type)
    with torch.device("meta"):  # the size first: a config class that keeps large sub-models is not built
        try:
            size = sum(p.numel() for p in AutoModelForCausalLM.from_config(copy.deepcopy(cfg)).parameters())
        except ValueError:
            size = 0
    if size > MAX_PARAMS:
        raise RuntimeError(f"{size / 1e6:.0f}M parameters at the small sizes (sub-models the sweep does not shrink)")
    torch.manual_seed(0)
    try:
        model = AutoModelForCausalLM.from_config(cfg)
    except ValueError as exc:  # a model without SDPA: its eager attention
        if "does not support an attention implementation" not in str(exc):
            raise
        cfg._attn_implementation = "eager"
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg)
    model = model.float().eval()
    with torch.no_grad():  # larger weights than HF's init: logits that differ across tokens and positions
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4)
    return model


def batches(vocab: int):
    import torch

    g = torch.Generator().manual_seed(L)
    tok = torch.randint(1, min(vocab, 128), (2, L), generator=g)
    mask = torch.ones_like(tok)
    mask[1, :4] = 0
    return tok, mask


def depth(config, length: int) -> int:
    """The longest chain of roundings in a decoder's logits: per layer the reductions over the hidden size (q,
    k, v, o and the MLP's input), the head size (a score), the keys (softmax and its weighted sum) and the
    MLP's widest layer (a dense one or an expert, plus the sum over the experts a token takes); then the final
    head over the hidden size."""
    config = getattr(config, "text_config", None) or config
    hidden = config.hidden_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    widths = [getattr(config, k, None) for k in ("intermediate_size", "moe_intermediate_size", "intermediate_size_mlp",
                                                  "ffn_dim", "n_inner")]
    mlp = max([w for w in widths if isinstance(w, int)] or [4 * hidden])
    per_layer = 5 * hidden + head_dim + 2 * length + mlp + (getattr(config, "num_experts_per_tok", None) or 0)
    return config.num_hidden_layers * per_layer + hidden


def tolerance(config, length: int) -> float:
    """How far two float32 computations of the logits may be apart, relative to the largest |logit| (the module
    docstring): 2 * depth * eps32."""
    return 2 * depth(config, length) * F32_EPS


def compare(native, ours) -> tuple[float, float, str, list[str]]:
    """(largest logit difference, largest |logit|, what was compared, the comparisons that differ)."""
    import torch

    tok, mask = batches(native.config.get_text_config().vocab_size)
    worst, scale, bad, what = 0.0, 1.0, [], []
    tol = tolerance(native.config, L + GENERATED)

    def check(name, a, b):
        nonlocal worst, scale
        d = float((a - b).abs().max()) if a.numel() else 0.0
        worst, scale = max(worst, d), max(scale, float(a.abs().max()))
        what.append(name)
        if not d <= tol * float(a.abs().max()):
            bad.append(f"{name} {d:.2e}")

    with torch.no_grad():
        for name, kw in (("unpadded", dict(input_ids=tok)), ("padded", dict(input_ids=tok, attention_mask=mask))):
            for cache in (False, True):
                a = native(**kw, use_cache=cache).logits
                b = ours(**kw, use_cache=cache).logits
                real = (kw.get("attention_mask", torch.ones_like(tok))).bool()
                check(f"{name} logits{' (cache)' if cache else ''}", a[real], b[real])
        gkw = dict(attention_mask=mask, max_new_tokens=GENERATED, do_sample=False, output_logits=True,
                   return_dict_in_generate=True)
        ga, gb = native.generate(tok, **gkw), ours.generate(tok, **gkw)
        if not torch.equal(ga.sequences, gb.sequences):
            bad.append("greedy tokens")
        check("greedy generate (cache)", torch.cat(ga.logits), torch.cat(gb.logits))
        # beam search reorders the cache between steps (the general path recomputes from it every call)
        bkw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, num_beams=2, output_scores=True,
                   return_dict_in_generate=True)
        ba, bb = native.generate(tok, **bkw), ours.generate(tok, **bkw)
        if not torch.equal(ba.sequences, bb.sequences):
            bad.append("beam tokens")
        check("beam search scores (2 beams)", ba.sequences_scores, bb.sequences_scores)
    return worst, scale, ", ".join(what), bad


def _alarm(signum, frame):
    raise TimeoutError("over 120 s")


def sweep_one(model_type: str) -> Result:
    """The state of one model type (see the module docstring)."""
    from pedsl.errors import PedslError
    from pedsl.hf import import_config, use_pedsl_attention
    from pedsl.hf.attention import BAND_MISMATCH
    from pedsl.hf.registry import taught_refusal
    from pedsl.strictparse import load_json

    t0 = time.monotonic()
    res = Result(model_type, "cannot instantiate")
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(120)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            # the type's own record first, before its model is built (Gemma 4's config class does not build at
            # the small sizes): its causal-LM class may hold a taught text config (Qwen3.5's)
            why = taught_refusal({"model_type": model_type})
            if why:
                res.state, res.reason = "refused", why  # the registry's whole paragraph (pedsl.hf.refusals)
                return res
            try:
                native = build(model_type)
            except Exception as exc:  # noqa: BLE001 - the reason goes in the table
                res.reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
                return res
            config = load_json(native.config.to_json_string())
            imported = None
            try:
                imported = import_config(config)
                ours = use_pedsl_attention(copy.deepcopy(native))
            except PedslError as err:
                if imported is not None and BAND_MISMATCH in str(err.diagnostics[0].message):
                    # import-hf wrote a scheme whose window or chunk is not the mask HF applies
                    res.state, res.reason = "DIFFERENT", f"import-hf's scheme: {err.diagnostics[0].message}"[:300]
                    return res
                from pedsl.hf.registry import REGISTRY

                applicable = model_type in REGISTRY or positional_attention(model_type)
                res.state = "refused" if applicable else "not applicable"
                res.reason = str(err.diagnostics[0].message)[:300]
                return res
            worst, scale, res.compared, bad = compare(native, ours)
            res.largest = worst
            res.state = "DIFFERENT" if bad else "exact"
            res.reason = "; ".join(bad)
    except TimeoutError as exc:
        res.state, res.reason = "cannot instantiate", f"timed out ({exc})"
    except Exception as exc:  # noqa: BLE001 - an error in the comparison itself: recorded, never "exact"
        res.state = "DIFFERENT"
        res.reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    finally:
        signal.alarm(0)
        res.seconds = round(time.monotonic() - t0, 1)
    return res


def table(results: list[Result], version: str) -> str:
    """docs/hf-compatibility.md."""
    from pedsl.hf.registry import REGISTRY

    counts = {s: sum(r.state == s for r in results) for s in STATES}
    positional = sum(r.state in ("exact", "refused", "DIFFERENT") for r in results)
    lines = ["# Hugging Face compatibility", "",
             f"Generated by `python -m tools.hf_sweep` against transformers {version}: every model type with a "
             "causal-LM class (a vision-language one through its image-text-to-text class, fed text only, its window "
             "off), a tiny random model from its own config class (4 layers, width 64, 4 heads of 16, "
             f"a window of {WINDOW}, a NoPE layer where the config has `no_rope_layers`, base 5e4), `pedsl import-hf` "
             "of its config.json, `use_pedsl_attention`, and the logits of an unpadded and a left-padded batch "
             f"({L} tokens) with the cache off and on, greedy generation of 10 tokens and a 2-beam search of 6, in "
             "float32 against the native model (tolerance 2 x depth x eps32 x max |logit|, depth the longest chain of "
             "roundings in the logits: a bound for any summation order, so for any CPU). `taught` says whether "
             "pedsl's registry "
             "(pedsl/hf/registry.py) has a record for the type; every other type is refused by name.", "",
             f"{len(results)} model types: " + ", ".join(f"{counts[s]} {s}" for s in STATES if counts[s]) +
             f". With positional attention (exact + refused + different): {positional}; exact: {counts['exact']}.",
             "", "| model type | taught | state | compared | largest difference | reason |", "|---|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: r.model_type):
        largest = "" if r.largest is None else f"{r.largest:.1e}"
        reason = r.reason.replace("|", "/").replace("\n", " ")
        lines.append(f"| {r.model_type} | {'yes' if r.model_type in REGISTRY else 'no'} | {r.state} | {r.compared} | "
                     f"{largest} | {reason} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    import transformers

    from pedsl.fsio import atomic_write_text

    update = argv[:1] == ["--update"]
    if update:  # re-sweep some types, keep the other rows of the last full run
        argv = argv[1:]
        kept = [Result(**r) for r in json.loads(RESULTS.read_text(encoding="utf-8")) if r["model_type"] not in argv
                and r["model_type"] in causal_types()]
    types = argv or causal_types()
    results = []
    for mt in types:
        r = sweep_one(mt)
        results.append(r)
        print(f"{mt:28s} {r.state:18s} {r.seconds:6.1f}s {r.largest if r.largest is not None else '':<10} "
              f"{r.reason[:110]}", flush=True)
    if update:
        results = kept + results
    if not argv or update:
        atomic_write_text(DOC, table(results, transformers.__version__))
        atomic_write_text(RESULTS, json.dumps([r.__dict__ for r in results], indent=1) + "\n")
        print(f"wrote {DOC}")
    return 1 if any(r.state == "DIFFERENT" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

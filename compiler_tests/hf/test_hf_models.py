"""pedsl's Hugging Face adapter against the native model classes of transformers (tiny random models
from configs, float64, no downloads): decoding strategies that reorder, crop or swap HF's cache;
every keyword HF's attention functions receive; what each architecture does with
partial_rotary_factor; long-context configs; refusals that name the real reason."""

from __future__ import annotations

import copy
import re
import sys
from pathlib import Path

import pytest
import torch

import pedsl
from pedsl.errors import ConfigError, InteropError
from pedsl.hf import arch, import_config, use_pedsl_attention
from pedsl.hf.attention_call import APPLIED, NO_EFFECT, REFUSED, pedsl_attention_forward
from compiler_helpers import float32_bound
from hf_helpers import assert_matches_native, depth, float64_native, rounding

transformers = pytest.importorskip("transformers")
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache  # noqa: E402

ORIG = 32
SHORT = [1.0, 1.0, 1.05, 1.1, 1.2, 1.3, 1.5, 1.7]
LONG = [1.0, 1.2, 1.5, 2.0, 3.0, 4.0, 5.5, 8.0]
# rope type -> (rope_parameters, max_position_embeddings): prompts of 28-40 tokens cross ORIG while decoding
ROPES = {
    "default": ({"rope_type": "default", "rope_theta": 10000.0}, 4 * ORIG),
    "linear": ({"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}, 4 * ORIG),
    "dynamic": ({"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}, ORIG),
    "yarn": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIG, "rope_theta": 1e4}, 4 * ORIG),
    "longrope": ({"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
                  "original_max_position_embeddings": ORIG, "rope_theta": 10000.0}, 4 * ORIG),
    "llama3": ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": ORIG, "rope_theta": 500000.0}, 4 * ORIG),
}


def tiny(model_type: str = "llama", rope: dict | None = None, max_pos: int = 4 * ORIG, dtype=torch.float64, **extra):
    cfg = AutoConfig.for_model(model_type, vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                               max_position_embeddings=max_pos, pad_token_id=0, bos_token_id=None, eos_token_id=None,
                               rope_parameters=copy.deepcopy(rope or ROPES["default"][0]),
                               **{"attn_implementation": "sdpa", **extra})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(dtype).eval()
    with torch.no_grad():  # larger weights than HF's init: logits that differ across tokens and positions
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4)
    return model


def pair(kind: str):
    rope, max_pos = ROPES[kind]
    native = tiny(rope=rope, max_pos=max_pos)
    return native, use_pedsl_attention(copy.deepcopy(native))


def trio(kind: str):
    """(native, through pedsl, native with its rotary in float64: hf_helpers.float64_native)."""
    native, ours = pair(kind)
    return native, ours, float64_native(native)


def beam_scores_bound(ref, vocab: int, steps: int) -> float:
    """generate computes beam scores in float32 from the logits cast to float32: a log-softmax over the
    vocabulary per step, summed over the steps (float32_bound); logits that agree within float64 rounding round
    to the same or adjacent float32 values, which that bound covers."""
    return float32_bound(vocab + steps, ref)


def prompts(L: int, B: int = 2):
    g = torch.Generator().manual_seed(L)
    tok = torch.randint(1, 128, (B, L), generator=g)
    mask = torch.ones_like(tok)
    mask[B - 1, :3] = 0 if B > 1 else 1  # left padding
    return tok.masked_fill(mask == 0, 0), mask


# ---------------------------------------------------------------------- decoding through HF's cache


@pytest.mark.parametrize("kind", sorted(ROPES))
def test_beam_search_equals_the_native_model(kind):
    native, ours, exact = trio(kind)
    tok, mask = prompts(28)
    kw = dict(attention_mask=mask, max_new_tokens=8, num_beams=3, do_sample=False, output_scores=True,
              return_dict_in_generate=True, num_return_sequences=2)
    a, b, e = (m.generate(tok, **kw) for m in (native, ours, exact))
    assert torch.equal(a.sequences, b.sequences) and torch.equal(e.sequences, b.sequences)
    bound = beam_scores_bound(e.sequences_scores, 128, 8)
    assert float((b.sequences_scores - e.sequences_scores).abs().max()) <= bound
    floor = float((a.sequences_scores - e.sequences_scores).abs().max())  # HF's float32 phases
    assert float((b.sequences_scores - a.sequences_scores).abs().max()) <= floor + bound


@pytest.mark.parametrize("kind", sorted(ROPES))
def test_assisted_decoding_equals_the_native_model(kind):
    """Prompt-lookup and draft-model decoding crop HF's cache on rejected tokens."""
    native, ours, exact = trio(kind)
    tok = torch.arange(1, 9).repeat(1, 4)  # repeats: prompt lookup proposes candidates
    kw = dict(max_new_tokens=10, do_sample=False, output_logits=True, return_dict_in_generate=True)
    draft = copy.deepcopy(native)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(0.05 * torch.randn_like(p))  # a draft that is sometimes wrong: rejections crop the cache
    # (tables that read the length see the verifying call's length: same strategy on both sides)
    for how in ({"prompt_lookup_num_tokens": 3}, {"assistant_model": draft}):
        a, b, e = (m.generate(tok, **kw, **how) for m in (native, ours, exact))
        assert torch.equal(a.sequences, b.sequences) and torch.equal(e.sequences, b.sequences)
        assert_matches_native(torch.cat(b.logits), torch.cat(a.logits), torch.cat(e.logits), depth(native.config, 42))


@pytest.mark.parametrize("kind", sorted(ROPES))
def test_two_conversations_decoded_in_turn(kind):
    """Two conversations with their own caches, one step each in turn (the first past ORIG, the second
    below it): every step's logits equal the native model doing the same."""
    native, ours, exact = trio(kind)
    (ta, _), (tb, _) = prompts(40, 1), prompts(12, 1)
    outs = []
    for model in (native, ours, exact):
        caches, toks, logits = [DynamicCache(), DynamicCache()], [ta, tb], []
        with torch.no_grad():
            for step in range(5):
                for c in (0, 1):
                    t = toks[c] if step == 0 else toks[c][:, -1:]
                    n = toks[c].shape[1]
                    out = model(t, past_key_values=caches[c], position_ids=torch.arange(n - t.shape[1], n)[None],
                                use_cache=True)
                    logits.append(out.logits[:, -1])
                    toks[c] = torch.cat([toks[c], out.logits[:, -1:].argmax(-1)], 1)
        outs.append(torch.cat(logits))
    assert_matches_native(outs[1], outs[0], outs[2], depth(native.config, 45))


def test_general_path_schemes_follow_beam_search():
    """A scheme outside HF's family (ALiBi) keeps nothing between calls: beam search through HF's
    cache equals beam search recomputing every step without a cache."""
    native, _ = pair("default")
    ours = use_pedsl_attention(copy.deepcopy(native), _lib("alibi"))
    tok, mask = prompts(20)
    kw = dict(attention_mask=mask, max_new_tokens=5, num_beams=3, do_sample=False, output_scores=True,
              return_dict_in_generate=True)
    a, b = ours.generate(tok, use_cache=False, **kw), ours.generate(tok, **kw)
    assert torch.equal(a.sequences, b.sequences)
    assert float((b.sequences_scores - a.sequences_scores).abs().max()) <= beam_scores_bound(a.sequences_scores, 128, 5)
    assert not torch.equal(native.generate(tok, **kw).sequences, b.sequences)  # ALiBi is not RoPE


def test_dynamic_ntk_outside_hf_family_is_refused():
    text = """scheme s { param heads: int = 4  param head_dim: int = 16  layout interleaved
               qk: rotate(dynamic_ntk(10000.0, 2.0, 32) * position) }"""
    with pytest.raises(InteropError, match="run-time length"):
        use_pedsl_attention(tiny(), text)


def _lib(name):
    from compiler_helpers import SCHEMES

    return SCHEMES / f"{name}.pe"


# ---------------------------------------------------------------------- every keyword applied or refused


def hf_attention_keywords() -> set[str]:
    """Every keyword the installed transformers' models pass to their attention function."""
    root = Path(transformers.__file__).parent
    names = set(transformers.utils.generic.TransformersKwargs.__annotations__)
    for f in root.glob("models/*/modeling_*.py"):
        text = f.read_text(encoding="utf-8")
        for m in re.finditer(r"attention_interface\(", text):
            depth, i = 1, m.end()
            while depth:  # the call's own parentheses
                depth += {"(": 1, ")": -1}.get(text[i], 0)
                i += 1
            names |= set(re.findall(r"\b([a-z_]+)\s*=(?!=)", text[m.end():i - 1]))
    return names - {"self"}


def test_every_hf_attention_keyword_is_known():
    known = set(APPLIED) | set(NO_EFFECT) | set(REFUSED)
    found = hf_attention_keywords()
    assert {"softcap", "s_aux", "sinks", "sliding_window", "position_ids", "scaling"} <= found
    # query/key/value/attention_mask/dim are positional arguments some models pass by name
    assert found - known <= {"query", "key", "value", "attention_mask", "dim", "deterministic"}, found - known


@pytest.mark.parametrize("scheme", [None, "alibi"])
def test_every_hf_attention_keyword_is_applied_or_refused(scheme):
    model = use_pedsl_attention(tiny(), None if scheme is None else _lib(scheme))
    layer = model.model.layers[0].self_attn
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 6, 16, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 6, 16, generator=g, dtype=torch.float64) for _ in range(2))
    pos = torch.arange(6)[None].expand(2, 6)
    base, _ = pedsl_attention_forward(layer, q, k, v, None, scaling=0.25, position_ids=pos)
    values = {"dropout": 0.0, "sliding_window": 64, "is_causal": True, "output_attentions": False,
              "output_hidden_states": True, "output_router_logits": True, "num_items_in_batch": torch.tensor(3),
              "use_cache": True, "cache_position": torch.arange(6), "return_dict": True, "layer_type": "full_attention"}
    for kw, value in values.items():
        got, _ = pedsl_attention_forward(layer, q, k, v, None, scaling=0.25, position_ids=pos, **{kw: value})
        torch.testing.assert_close(got, base, atol=0, rtol=0)
    refused = {**{kw: torch.ones(4) for kw in REFUSED}, "softcap": 50.0, "dropout": 0.1, "is_causal": False,
               "output_attentions": True, "a_future_keyword": 1}
    for kw, value in refused.items():
        with pytest.raises(InteropError) as err:
            pedsl_attention_forward(layer, q, k, v, None, scaling=0.25, position_ids=pos, **{kw: value})
        assert kw.split("_")[0] in str(err.value) and err.value.code == "E964"


@pytest.mark.parametrize("model_type, extra, what", [
    ("gemma2", {"attn_logit_softcapping": 50.0}, "soft-caps its attention scores at 50"),
    ("gpt_oss", {}, "sinks"),
])
def test_models_with_softcap_or_sinks_are_refused(model_type, extra, what):
    """The soft-cap and the sinks under a scheme without them (the model's own layers scheme, import-hf of
    its config, takes both: test_hf_layered.py)."""
    model = tiny(model_type, dtype=torch.float32, attn_implementation="eager", **extra)
    with pytest.raises(InteropError, match=what):
        use_pedsl_attention(model, "scheme r { qk: rotate(geometric(1e4) * position) }")


# ---------------------------------------------------------------------- partial_rotary_factor per architecture


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3", "olmo2", "phi3", "phi", "stablelm",
                                        "nemotron"])
def test_partial_rotary_factor_as_the_model_class_applies_it(model_type):
    native = tiny(model_type, rope={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5},
                  partial_rotary_factor=0.5)
    text = import_config(native.config.to_dict())
    full = model_type in arch.FULL_ROTATION
    assert ("param partial_rotary_factor" in text) != full and ("every channel rotates" in text) == full
    ours = use_pedsl_attention(copy.deepcopy(native))
    tok, mask = prompts(24)
    with torch.no_grad():
        a, b, e = (m(tok, attention_mask=mask).logits for m in (native, ours, float64_native(native)))
    real = mask.bool()
    assert_matches_native(b[real], a[real], e[real], depth(native.config, 24))


def test_partial_rotary_factor_the_native_model_cannot_run_is_refused():
    rope = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4, "partial_rotary_factor": 0.5}
    native = tiny("llama", rope=rope, partial_rotary_factor=0.5)
    with pytest.raises(RuntimeError):  # the premise: transformers' Llama fails on this config
        native(torch.ones(1, 4, dtype=torch.long))
    with pytest.raises(InteropError, match="native model fails") as err:
        import_config(native.config.to_dict())
    assert err.value.code == "E961"
    cfg = {**native.config.to_dict(), "model_type": "unheard_of"}
    with pytest.raises(InteropError, match="does not know how model_type 'unheard_of'"):
        import_config(cfg)


# ---------------------------------------------------------------------- long contexts


@pytest.mark.parametrize("model_type, max_pos, theta", [("mistral", 1_024_000, 1e6), ("qwen3", 262_144, 5e6),
                                                       ("llama", 4_000_000, 5e5)])
def test_long_context_configs_load_and_run(model_type, max_pos, theta):
    native = tiny(model_type, rope={"rope_type": "default", "rope_theta": theta}, max_pos=max_pos,
                  **({"sliding_window": None} if model_type == "mistral" else {}))  # the rope, not Mistral's window
    text = import_config(native.config.to_dict())
    scheme = pedsl.load(text)  # an imported scheme describes inference: no training-size cap when it loads
    assert scheme.params.get("train_length") == max_pos
    ours = use_pedsl_attention(copy.deepcopy(native))
    # HF computes phases in float32 (0.06 rad off at position 1e6): the reference is HF's rotary in float64
    native = float64_native(native)
    tok = torch.randint(1, 128, (1, 8))
    pos = torch.arange(max_pos - 8, max_pos)[None]  # the last positions of the context
    with torch.no_grad():
        want = native(tok, position_ids=pos).logits
        # float64 phases of size max_pos carry max_pos * eps64 of absolute error into the tables
        bound = rounding(depth(native.config, 8) + max_pos, want)
        torch.testing.assert_close(ours(tok, position_ids=pos).logits, want, atol=bound, rtol=0)
    assert torch.equal(ours.generate(tok, max_new_tokens=4, do_sample=False),
                       native.generate(tok, max_new_tokens=4, do_sample=False))
    if max_pos <= pedsl.limits.MAX_LENGTH:  # training at that context is refused by `pedsl train`, with the sizes
        from pedsl.config import resolve_train_config

        with pytest.raises(ConfigError, match="training step"):
            resolve_train_config(block=scheme.train)


# ---------------------------------------------------------------------- refusals that say the real reason


def test_glm4v_is_refused_as_m_rope():
    """Qwen-VL's M-RoPE is imported (pedsl.hf.multimodal); other multimodal rotaries are not."""
    for cfg in (transformers.Glm4vConfig().to_dict(), transformers.Glm4vConfig().to_dict()["text_config"]):
        with pytest.raises(InteropError) as err:
            import_config(cfg)
        assert "M-RoPE" in str(err.value) and "head_dim" not in str(err.value)


def test_gemma3_is_refused_for_its_per_layer_rope_only():
    from pedsl.hf import rope

    for cfg in (transformers.Gemma3TextConfig().to_dict(),
                {**transformers.Gemma3TextConfig().to_dict(), "model_type": "some_gemma_like"}):
        with pytest.raises(InteropError) as err:
            rope.import_config(cfg)
        msg = str(err.value)
        # rope.import_config writes one scheme for every layer: Gemma 3 is pedsl.hf.layered's (a layers scheme)
        # an unknown model type is refused as such, whatever its fields say
        assert ("layer types" in msg or "per layer type" in msg or "layers of different kinds" in msg
                or "does not know how model_type 'some_gemma_like'" in msg) and "not read by rope_type" not in msg


def _modeling_source(model_type: str) -> str:
    models = Path(transformers.__file__).parent / "models"
    root = models / model_type if (models / model_type).is_dir() else models / model_type.removesuffix("_text")
    files = sorted(root.glob("modeling_*.py"))
    if not files:  # a type that reuses another's model class (EXAONE, InternLM3: LlamaForCausalLM)
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        cls = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type, ""), None)
        files = [Path(sys.modules[cls.__module__].__file__)] if cls is not None else []
    assert files, f"transformers has no models/{model_type}"
    return "\n".join(f.read_text(encoding="utf-8") for f in files)


@pytest.mark.parametrize("model_type", sorted(arch.FULL_ROTATION | arch.PARTIAL_ROTATION))
def test_architecture_table_matches_the_installed_model_files(model_type):
    """Every model type of pedsl.hf.arch: its own default rope reads partial_rotary_factor exactly when
    the table says the architecture rotates a fraction (the classes tested above confirm the reading)."""
    from pedsl.hf.registry import REGISTRY

    src = _modeling_source(model_type)
    if REGISTRY[model_type].sin_first:  # GPT-J / CodeGen (pedsl.hf.sincos): a fixed base over rotary_dim channels
        m = re.search(r"def create_sinusoidal_positions\(.*?return", src, re.S)
        assert m and "10000 **" in m.group(0) and "config.rotary_dim" in src
        return
    m = re.search(r"def compute_default_rope_parameters\(.*?return inv_freq", src, re.S)
    assert m, f"{model_type} has no compute_default_rope_parameters"
    reads = "partial_rotary_factor" in m.group(0)
    assert reads == (model_type in arch.PARTIAL_ROTATION)


@pytest.mark.parametrize("model_type", sorted(arch.INTERLEAVED))
def test_interleaved_architectures_rotate_interleaved_pairs(model_type):
    src = _modeling_source(model_type)
    assert "0::2" in src or "repeat_interleave" in src or "view_as_complex" in src  # Llama 4: complex pairs

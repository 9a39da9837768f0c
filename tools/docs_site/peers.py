"""The tests that compare a library scheme with another implementation of it (found by grepping
compiler_tests for the scheme's name and reading what each test compares with).

A peer is an implementation people use (Hugging Face transformers, x-transformers, rotary-embedding-torch,
an official code release) or, where no installable peer exists, a float64 loop of the paper's formula.
Every library scheme is also compared, on every backend that accepts it, with pedsl's own naive float64
interpreter (``DIFFERENTIAL``). ``compiler_tests/test_docs_site.py`` checks that every test named here
exists, so a renamed test cannot leave the gallery pointing at nothing.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DIFFERENTIAL = ("compiler_tests/compiler/test_compiler_differential.py",
                "pedsl's naive float64 interpreter (explicit transport matrices for every (i, j)), forward and "
                "the gradients of q, k, v and every learned parameter, on every backend that accepts the scheme")
_HF = "compiler_tests/hf/test_hf_interop.py::test_library_schemes_in_hf_family_compute_what_hf_computes"
_HF_WORDS = "Hugging Face transformers: `export-hf` of the scheme gives HF's own inverse frequencies and attention factor"
_DF = "compiler_tests/compiler/test_distance_functions.py::"
_AX = "compiler_tests/compiler/test_axes_peers.py::"

# scheme -> ((test id, what it compares with), ...)
PEERS: dict[str, tuple[tuple[str, str], ...]] = {
    "rope": ((_HF, _HF_WORDS),
             ("compiler_tests/ops/test_ops_rotary.py::test_halves_matches_hf_rotate_half",
              "Hugging Face's `rotate_half` rotation")),
    "pi": ((_HF, _HF_WORDS + " (rope type `linear`)"),),
    "dynamic_ntk": ((_HF, _HF_WORDS + " (rope type `dynamic`, past the original length)"),),
    "yarn": ((_HF, _HF_WORDS),
             ("compiler_tests/hf/test_hf_interop.py::test_library_yarn_is_hf_yarn", "Hugging Face's YaRN tables")),
    "llama3": ((_HF, _HF_WORDS),),
    "rerope": (("compiler_tests/compiler/test_remap.py::test_forward_and_backward_match_the_papers_formula",
                "a float64 loop over (i, j) of ReRoPE's relative position min(i - j, w) (Su 2023), forward and "
                "backward"),),
    "leaky_rerope": (("compiler_tests/compiler/test_remap.py::test_forward_and_backward_match_the_papers_formula",
                      "a float64 loop over (i, j) of Leaky ReRoPE's relative position w + (i - j - w) / k past w "
                      "(Su 2023), forward and backward"),),
    "self_extend": (("compiler_tests/compiler/test_remap.py::test_forward_and_backward_match_the_papers_formula",
                     "a float64 loop over (i, j) of Self-Extend's grouped positions (Jin et al. 2024, arXiv "
                     "2401.01325), forward and backward"),),
    "longrope": ((_HF, _HF_WORDS + " (below and past the original length)"),),
    "rope_partial": ((_HF, _HF_WORDS + " (Phi-3's `partial_rotary_factor`)"),),
    "rope_interleaved": (("compiler_tests/ops/test_ops_rotary.py::test_interleaved_matches_complex_multiplication",
                          "the complex-number form of the rotation (Meta's Llama code)"),
                         ("compiler_tests/hf/test_hf_interop.py::test_exported_pedsl_model_loads_in_transformers",
                          "a trained run exported to `LlamaForCausalLM` (q/k projections permuted to `rotate_half`)")),
    "alibi": ((_DF + "test_alibi_learned_starts_as_alibi_and_equals_x_transformers_with_its_slopes",
               "x-transformers' `AlibiPositionalBias`"),),
    "alibi_learned": ((_DF + "test_alibi_learned_starts_as_alibi_and_equals_x_transformers_with_its_slopes",
                       "x-transformers' `AlibiPositionalBias` with the learned slopes loaded"),),
    "alibi_partial": ((_DF + "test_alibi_partial_equals_x_transformers_alibi_num_heads",
                       "x-transformers' `alibi_num_heads`"),),
    "t5_bias": ((_DF + "test_buckets_equal_hugging_face_t5", "Hugging Face's T5 relative-position buckets"),
                (_DF + "test_t5_bias_equals_x_transformers_relative_position_bias",
                 "x-transformers' `RelativePositionBias` with its table loaded"),
                (_DF + "test_the_library_t5_bias_is_unidirectional_t5", "T5's unidirectional buckets")),
    "dynamic_position_bias": ((_DF + "test_dynamic_position_bias_equals_x_transformers",
                               "x-transformers' `DynamicPositionBias` with its MLP loaded"),),
    "kerple_log": ((_DF + "test_kerple_log_is_the_papers_formula", "a float64 loop of KERPLE's formula"),),
    "kerple_power": ((_DF + "test_kerple_power_is_the_papers_formula", "a float64 loop of KERPLE's formula"),),
    "sandwich": ((_DF + "test_sandwich_is_the_papers_formula", "a float64 loop of Sandwich's formula"),),
    "fire": ((_DF + "test_fire_is_the_papers_formula", "a float64 loop of FIRE's formula"),),
    "fox": (("compiler_tests/compiler/test_fox_peers.py::"
             "test_fox_equals_x_transformers_data_dependent_alibi_forward_and_backward",
             "x-transformers' `DataDependentAlibi` with its gate's `nn.Linear` loaded, forward and backward"),),
    "path": (("compiler_tests/ops/test_ops_path.py::test_forward_matches_naive",
              "explicit float64 products of the Householder steps for every pair"),
             ("compiler_tests/ops/test_ops_path.py::test_gradients_match_naive", "the same, gradients")),
    "path_fox": (("compiler_tests/ops/test_path_fox_conventions.py::test_path_fox_is_the_fox_convention_and_differs_from_fla",
                  "a float64 reference of PaTH with FoX's unscaled forget gate"),),
    "path_fox_fla": (("compiler_tests/ops/test_path_fox_conventions.py::"
                      "test_path_fox_fla_is_flas_convention_forward_and_backward",
                      "a float64 reference of FLA's PaTH-FoX (the gate scaled by 1/sqrt(D))"),),
    "mrope": ((_AX + "test_mrope_matches_qwen2_vl", "Hugging Face's Qwen2-VL M-RoPE"),),
    "mrope_interleaved": ((_AX + "test_mrope_interleaved_matches_qwen3_vl", "Hugging Face's Qwen3-VL interleaved M-RoPE"),),
    "rope_2d": ((_AX + "test_rope_2d_matches_rotary_embedding_torch_axial_frequencies",
                 "rotary-embedding-torch's axial frequencies"),),
    "rope_mixed": ((_AX + "test_rope_mixed_matches_the_official_rope_vit_code_with_its_start_and_gradients",
                    "the official RoPE-Mixed (rope-vit) code, with its start and gradients"),),
    "video_rope": (("compiler_tests/compiler/test_video_rope.py::test_attention_and_gradients_equal_the_official_formula",
                    "a float64 transcription of VideoRoPE's official code"),),
    "xpos": (("compiler_tests/compiler/test_xpos.py::test_rotated_q_and_k_equal_rotary_embedding_torch",
              "rotary-embedding-torch's `RotaryEmbedding(use_xpos=True)`"),
             ("compiler_tests/compiler/test_xpos.py::test_attention_equals_x_transformers_rotary_xpos",
              "x-transformers' `rotary_xpos`")),
    "cope": (("compiler_tests/compiler/test_cope.py::test_equals_x_transformers_cope_past_one_block_with_gradients",
              "x-transformers' CoPE, with gradients"),),
    "stick_breaking": (("compiler_tests/compiler/test_stick_breaking.py::test_general_call_equals_the_formula_loop",
                        "a float64 loop of stick-breaking attention's formula"),
                       ("compiler_tests/compiler/test_stick_breaking.py::"
                        "test_past_one_block_equals_the_authors_dense_form_with_gradients",
                        "the authors' dense log-space form, with gradients")),
    "rope_sigmoid": (("compiler_tests/compiler/test_normalizers.py::"
                      "test_the_general_call_equals_the_formula_forward_and_backward",
                      "a float64 loop of sigmoid attention's formula, with gradients"),),
    "rope_softmax1": (("compiler_tests/compiler/test_normalizers.py::"
                       "test_the_general_call_equals_the_formula_forward_and_backward",
                       "a float64 loop of softmax plus one's formula, with gradients"),),
    "rope_differential": (("compiler_tests/compiler/test_differential.py::"
                           "test_diffllama_logits_equal_with_pedsl_attention",
                           "Hugging Face's DiffLlamaForCausalLM, every layer's attention replaced, float64 logits"),
                          ("compiler_tests/compiler/test_differential.py::"
                           "test_the_general_call_equals_the_formula_forward_and_backward",
                           "a float64 loop of differential attention's formula, with gradients")),
    "rope_sink": (("compiler_tests/compiler/test_windows.py::test_sink_logit_matches_gpt_oss_eager_attention",
                   "GPT-OSS's eager attention (the learned sink logit)"),),
    "rope_local": (("compiler_tests/compiler/test_windows.py::test_window_and_chunk_equal_the_same_band_as_an_explicit_mask",
                    "an explicit band mask"),),
    "rope_chunked": (("compiler_tests/compiler/test_windows.py::test_window_and_chunk_equal_the_same_band_as_an_explicit_mask",
                      "an explicit band mask"),),
}


@lru_cache(maxsize=None)
def _functions(path: str) -> frozenset[str]:
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    return frozenset(n.name for n in tree.body if isinstance(n, ast.FunctionDef))


def missing_tests() -> list[str]:
    """The test ids of ``PEERS`` (and the differential test) that do not name a test function."""
    out = [] if (ROOT / DIFFERENTIAL[0]).is_file() else [DIFFERENTIAL[0]]
    for tests in PEERS.values():
        for test_id, _ in tests:
            path, _, func = test_id.partition("::")
            if not (ROOT / path).is_file() or func not in _functions(path):
                out.append(test_id)
    return out


def peer_tests(scheme: str) -> tuple[tuple[str, str], ...]:
    return PEERS.get(scheme, ())

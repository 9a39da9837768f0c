"""The library's deberta_v2 against Hugging Face's ``DebertaV2Model`` disentangled attention: a tiny random model
(relative_attention, pos_att_type = [p2c, c2p], log position buckets, share_att_key both ways), in float64, at
the attention layer. The layer's own query, key and value projections of the hidden states are pedsl's q, k and
v; its position tables are the layer's projections of the encoder's (layer-normed) relative embeddings -
``key_proj`` / ``query_proj`` with share_att_key, ``pos_key_proj`` / ``pos_query_proj`` without - loaded as
``relative_keys`` / ``relative_queries``. Hugging Face forms its scale sqrt(3 D) in float32; the test gives it
the float64 scale, so both sides compute the same function in float64 (the buckets are float32 on both sides:
that is their definition)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from compiler_helpers import SCHEMES, float64_bound  # noqa: E402
from pedsl.compiler import compile_scheme  # noqa: E402

F64 = torch.float64
H, D, BUCKETS, TOP = 2, 8, 8, 20


def _layer(share: bool, c2p: bool = True):
    cfg = transformers.DebertaV2Config(
        vocab_size=50, hidden_size=H * D, num_hidden_layers=1, num_attention_heads=H, intermediate_size=32,
        max_position_embeddings=64, relative_attention=True, pos_att_type=["p2c", "c2p"] if c2p else ["p2c"],
        position_buckets=BUCKETS, max_relative_positions=TOP, share_att_key=share, norm_rel_ebd="layer_norm",
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = transformers.DebertaV2Model(cfg).to(F64).eval()
    return model.encoder.layer[0].attention.self, model.encoder.get_rel_embedding()


def _pedsl_inputs(att, rel, x, share: bool):
    """q, k, v (B, H, L, D) from the layer's projections; the position tables (2 buckets, H, D)."""
    heads = lambda t: t.view(*t.shape[:-1], H, D)  # noqa: E731
    q, k, v = (heads(p(x)).transpose(1, 2) for p in (att.query_proj, att.key_proj, att.value_proj))
    r = rel[:2 * BUCKETS]
    key_proj = att.key_proj if share else getattr(att, "pos_key_proj", None)
    tables = {"relative_queries": heads((att.query_proj if share else att.pos_query_proj)(r))}
    if key_proj is not None and "c2p" in att.pos_att_type:
        tables["relative_keys"] = heads(key_proj(r))
    return q, k, v, tables


@pytest.fixture
def float64_scale(monkeypatch):
    """Hugging Face's scale sqrt(D * factor) in float64 rather than float32."""
    from transformers.models.deberta_v2 import modeling_deberta_v2 as hf

    monkeypatch.setattr(hf, "scaled_size_sqrt", lambda t, f: torch.sqrt(torch.tensor(t.size(-1) * f, dtype=F64)))


@pytest.mark.parametrize("share", [True, False])
def test_equals_hugging_face_disentangled_attention(share, float64_scale):
    """L = 40 > max_relative_positions = 20: exact, log and clamped buckets; right padding in row 1."""
    att, rel = _layer(share)
    B, L = 2, 40
    x = torch.randn(B, L, H * D, generator=torch.Generator().manual_seed(1), dtype=F64)
    valid = torch.ones(B, L, dtype=torch.bool)
    valid[1, 31:] = False
    with torch.no_grad():
        want = att(x, valid[:, None, None, :] & valid[:, None, :, None], rel_embeddings=rel)[0]
        q, k, v, tables = _pedsl_inputs(att, rel, x, share)
    m = compile_scheme(SCHEMES / "deberta_v2.pe", num_heads=H, head_dim=D,
                       params={"buckets": BUCKETS, "max_distance": TOP}).double()
    m.load_state_dict(tables, strict=False)
    got = m(q, k, v, attn_mask=valid).transpose(1, 2).reshape(B, L, H * D)
    assert (got[valid] - want[valid]).abs().max() <= float64_bound(L * D, want)
    plain = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, L, H * D)
    assert (plain - want).abs().max() > 1e-3  # the terms matter at this scale


def test_p2c_alone_equals_hugging_face(float64_scale):
    """pos_att_type = [p2c]: deberta(c2p = false), the scale sqrt(2 D)."""
    att, rel = _layer(False, c2p=False)
    x = torch.randn(1, 30, H * D, generator=torch.Generator().manual_seed(2), dtype=F64)
    with torch.no_grad():
        want = att(x, torch.ones(1, 1, 30, 30, dtype=torch.bool), rel_embeddings=rel)[0]
        q, k, v, tables = _pedsl_inputs(att, rel, x, False)
    text = (f'import "{SCHEMES / "deberta_v2.pe"}"\n'
            f"scheme p2c extends deberta_v2 {{ relative = deberta(buckets = {BUCKETS}, max_distance = {TOP}, "
            "c2p = false, p2c = true) }")
    m = compile_scheme(text, num_heads=H, head_dim=D).double()
    assert m.relative_queries is not None
    m.load_state_dict(tables, strict=False)
    got = m(q, k, v).transpose(1, 2).reshape(1, 30, H * D)
    assert (got - want).abs().max() <= float64_bound(30 * D, want)


@pytest.mark.parametrize("buckets, top", [(256, 512), (8, 20), (6, 100)])
def test_buckets_equal_make_log_bucket_position(buckets, top):
    """The general path's and the reference's buckets against Hugging Face's at every distance to 4 max_distance."""
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    from pedsl.compiler.general.relative import deberta_bucket
    from pedsl.compiler.reference import _log_bucket

    d = torch.arange(-4 * top, 4 * top + 1)
    want = make_log_bucket_position(d, buckets, top).long()
    assert torch.equal(deberta_bucket(d, buckets, top), want)
    assert [_log_bucket(int(x), buckets, top) for x in d] == want.tolist()
    assert int(want.max()) >= buckets - 1  # max_distance reaches the last bucket; beyond, the callers clamp

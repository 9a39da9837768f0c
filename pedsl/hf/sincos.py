"""GPT-J and CodeGen's rotary as pedsl reads it (transformers 5's ``modeling_gptj.py`` and ``modeling_codegen.py``).

- ``create_sinusoidal_positions(max_positions, rotary_dim)``: ``inv_freq = 1 / 10000 ** (arange(0, dim, 2) / dim)``
  over ``dim = rotary_dim``: the base is fixed, no ``rope_theta`` or ``rope_parameters`` is read;
- the attention turns the first ``rotary_dim`` channels of each head with ``rotate_every_two``: pairs
  (2p, 2p + 1), the interleaved layout; the other channels pass;
- the rotary embedding returns ``(sin, cos)``, in that order (the identity rotation pedsl's general path gives it
  is sin = 0, cos = 1 in those places);
- the config names its heads ``n_head`` and its width ``n_embd``; ``rotary_dim`` null makes a table of ``n_embd``
  channels the heads cannot take (the native model fails), refused here.

:func:`rotary_config` rewrites such a config as the Phi-3-style partial rotary the rest of import-hf reads.
No torch here: import-hf reads this.
"""

from __future__ import annotations

from pedsl.errors import InteropError, quoted
from pedsl.hf import arch, registry

#: Keys the model's rotary does not read: dropped, since the fixed base is what it computes.
_UNREAD = ("rope_theta", "rope_parameters", "rope_scaling", "partial_rotary_factor", "rotary_dim")


def is_sin_first(cfg: dict) -> bool:
    """Whether the config's model type is a taught GPT-J-style type (its rotary returns (sin, cos))."""
    fam = registry.family((arch.model_types(cfg) or [""])[-1])
    return fam is not None and fam.sin_first and not fam.refused


def rotary_config(cfg: dict) -> dict:
    """The config as a partial rotary of ``rotary_dim / head_dim`` at base 10000; any other config unchanged."""
    if not is_sin_first(cfg):
        return cfg
    heads, hidden = registry._int(cfg, "n_head"), registry._int(cfg, "n_embd")
    if heads is None or hidden is None or hidden % heads:
        raise InteropError(f"n_embd {quoted(hidden)} must be a multiple of n_head {quoted(heads)}", code="E963",
                           hint="a GPT-J / CodeGen config.json gives both (each head holds n_embd / n_head channels)")
    head_dim, rot = hidden // heads, cfg.get("rotary_dim")
    if isinstance(rot, bool) or not isinstance(rot, int) or not 2 <= rot <= head_dim or rot % 2:
        raise InteropError(f"rotary_dim must be an even number of channels in 2 .. {head_dim} (n_embd / n_head), got "
                           f"{quoted(rot, 60)}", code="E961", hint="with rotary_dim null the model builds a table "
                           "of n_embd channels that its heads cannot take: there is no encoding to import")
    out = {k: v for k, v in cfg.items() if k not in _UNREAD}
    out.update(num_attention_heads=heads, hidden_size=hidden, head_dim=head_dim,
               partial_rotary_factor=rot / head_dim)
    return out

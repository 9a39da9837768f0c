"""A compiled scheme run on values narrower or wider than its query/key heads (MLA's ``v_head_dim``).

A scheme's scores read q and k only; the values enter once, as the weights' sum ``sum_j a_ij v_j``, linear in
each value channel. So values of ``Dv != D`` channels are attended exactly by cutting them into slices of at most
``D`` channels, zero-padding the last, attending each slice with the same q and k and keeping each slice's own
channels: a zero channel adds nothing to any other. One call when ``Dv <= D`` (DeepSeek's tiny and real configs
alike); a scheme that turns or extends the values themselves (a ``qkv`` transport, ``sink = token``'s learned
value slot) has no such reading and is refused.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pedsl.errors import InteropError


def _reads_values(module) -> str | None:
    """What of the scheme acts on the value channels themselves (None: its values are only summed)."""
    if any(t.values for t in module.plan.transports):
        return "a transport of the values (qk v)"
    if getattr(module, "sink_value", None) is not None:
        return "sink = token (a learned value slot of head_dim channels)"
    return None


def attend(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **kw) -> torch.Tensor:
    """``module(query, key, value, **kw)`` for values of any width: (B, H, Lq, Dv) with ``Dv`` the values'."""
    D, Dv = key.shape[-1], value.shape[-1]
    if Dv == D:
        return module(query, key, value, **kw)
    why = _reads_values(module)
    if why is not None:
        raise InteropError(f"the model's values have {Dv} channels and its queries and keys {D} (multi-head latent "
                           f"attention's v_head_dim), but scheme '{module.scheme.name}' has {why}, which needs values "
                           "as wide as the keys", code="E964",
                           hint="use a scheme whose transports act on q and k only (qk: ...), without sink = token")
    outs = []
    for start in range(0, Dv, D):
        part = value[..., start:start + D]
        width = part.shape[-1]
        if width < D:
            part = F.pad(part, (0, D - width))
        outs.append(module(query, key, part, **kw)[..., :width])
    return outs[0] if len(outs) == 1 else torch.cat(outs, -1)

"""The documentation's Python examples run as written (they are what a new user copies first). They were the
README's; the page that holds them now is docs/how-it-works.md."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from compiler_helpers import float32_bound, float64_bound

PAGE = Path(__file__).resolve().parents[1] / "docs" / "how-it-works.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)


def test_the_decoding_example_runs_and_decodes_like_one_full_forward():
    block = next(b for b in _python_blocks() if "new_cache" in b)
    torch.manual_seed(0)
    env: dict = {}
    exec(compile(block, "docs/how-it-works.md", "exec"), env)  # noqa: S102 - the repository's own docs
    lm, cache = env["lm"], env["cache"]
    assert len(cache) == 5 + 8 and env["logits"].shape == (2, 1, 256)
    # the cached decoding equals one full forward over the same tokens
    toks = torch.randint(0, 256, (2, 7))
    # each way within float32's (float64's) rounding of the logits' chain: the embedding's width d through
    # q, k, v and FoX's gate, a score over the head's 16 channels, the softmax and its sum over the 7 keys,
    # the output head over d; so both ways within twice that
    d, L = lm.emb.embedding_dim, toks.shape[1]
    n = 3 * d + 16 + 2 * L
    for dtype, bound in ((torch.float32, float32_bound), (torch.float64, float64_bound)):
        lm = lm.to(dtype)
        c = lm.attn.new_cache(batch_size=2)
        with torch.no_grad():
            full = lm(toks)
            steps = torch.cat([lm(toks[:, :4], c)] + [lm(toks[:, i:i + 1], c) for i in range(4, 7)], dim=1)
        assert steps.dtype == dtype
        torch.testing.assert_close(steps, full, rtol=0, atol=2 * bound(n, full))

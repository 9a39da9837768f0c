"""The documentation's Python examples run as written (they are what a new user copies first). They were the
README's; the page that holds them now is docs/how-it-works.md."""

from __future__ import annotations

import re
from pathlib import Path

import torch

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
    c = lm.attn.new_cache(batch_size=2)
    with torch.no_grad():
        full = lm(toks)
        steps = torch.cat([lm(toks[:, :4], c)] + [lm(toks[:, i:i + 1], c) for i in range(4, 7)], dim=1)
    torch.testing.assert_close(steps, full, rtol=1e-5, atol=1e-5)

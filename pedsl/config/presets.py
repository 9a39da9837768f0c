"""The model sizes a run starts from (``--preset``): tiny and small for a CPU, base at the papers' scale."""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    # ~1 minute for 600 steps at context 128, batch 16 on a 2-core CPU.
    "tiny": {"model": {"n_layers": 2, "d_model": 128, "n_heads": 4, "head_dim": 32},
             "context": 128, "steps": 600, "batch_size": 16, "lr": 3e-3, "min_lr": 3e-4, "warmup": 50},
    "small": {"model": {"n_layers": 4, "d_model": 256, "n_heads": 8, "head_dim": 32},
              "context": 256, "steps": 2000, "batch_size": 16, "lr": 2e-3, "min_lr": 2e-4, "warmup": 100},
    # The papers' scale (GPU): 16 layers, width 768, 12 heads of 64.
    "base": {"model": {"n_layers": 16, "d_model": 768, "n_heads": 12, "head_dim": 64},
             "context": 1024, "steps": 20000, "batch_size": 32, "lr": 6e-4, "min_lr": 6e-5,
             "warmup": 1000, "data": {"max_bytes": 64_000_000}},
}

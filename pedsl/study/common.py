"""What eval, analyze and compare share: opening a run, its eval settings, atomic JSON, progress.

Opening a run compiles its scheme with ``requires_grad=False`` (evaluation never needs a
backward, and that lets the compiler pick forward-only kernels such as FlexAttention on CPU)
and the compiled backend of the run (never the float64 reference). The process-wide setting
``torch.set_flush_denormal(True)`` is the application's choice (docs/semantics.md §6):
:func:`pedsl.torchenv.setup_torch` makes it for ``pedsl eval / analyze / compare`` (and train).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pedsl
from pedsl.errors import CheckpointError, EvalError, OutputError, PedslError
from pedsl.fsio import atomic_write_text, ensure_dir, read_text
from pedsl.strictparse import load_json
from pedsl.limits import MAX_LENGTH, MAX_LIST
from pedsl.scheme_config import eval_config as _scheme_eval_config


def progress(quiet: bool) -> Callable[[str], None]:
    """A printer to stderr with a wall-clock stamp, or a no-op."""
    if quiet:
        return lambda msg: None
    t0 = time.perf_counter()

    def say(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:6.0f}s] {msg}", file=sys.stderr, flush=True)

    return say


def open_run(run_dir: str | Path, scheme: str | Path | None = None, params: dict | None = None):
    """``(model, cfg, meta)`` of a finished or checkpointed run, ready for evaluation.

    With ``scheme`` (a library name or .pe file) and/or ``params`` the trained weights are loaded
    under that scheme instead of the run's own (:mod:`pedsl.train.swap`); ``meta["scheme"]`` and
    ``meta["scheme_hash"]`` are then the new scheme's and ``meta["swap"]`` describes it.

    Every failure (missing directory, no config, corrupt checkpoint, unloadable scheme) is an
    :class:`EvalError` / :class:`CheckpointError` with a hint, never a traceback. The folder is
    read by :func:`pedsl.train.rundir.read` (the same reader as :func:`pedsl.train.load_run`).
    """
    if scheme is not None or params:
        return _open_swapped(Path(run_dir), scheme, params or {})
    # pedsl.train, pedsl.model and pedsl.compiler import torch: they stay inside the functions that
    # open a run, so the CLI modules that import this one for progress() or parse_lengths() stay light.
    from pedsl.train import load_run, rundir

    r = rundir.read(run_dir)
    run = r.path
    try:
        scheme, files = r.load_scheme()
        model, cfg, meta = load_run(run, attention=eval_attention(r.cfg, scheme, r.scheme_hash or files.digest))
        meta["scheme"] = scheme
    except PedslError:
        raise
    except Exception as exc:  # noqa: BLE001 - e.g. a truncated config.yaml that still parses oddly
        raise EvalError(f"run '{run}' cannot be opened: {type(exc).__name__}: {exc}",
                        hint="the run directory is incomplete or corrupt; train it again") from None
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, cfg, meta


def _open_swapped(run: Path, other, params: dict):
    import torch

    from pedsl.model import TransformerLM
    from pedsl.train.swap import check_swap, swapped_scheme

    model0, cfg, meta = open_run(run)
    new, record = swapped_scheme(run, cfg.params, other, params)
    torch.manual_seed(cfg.seed)
    model = TransformerLM(cfg.model, eval_attention(cfg, new).factory(cfg.model))
    src = model0.state_dict()
    check_swap(src, model.state_dict(), run=str(run), run_scheme=meta["scheme"].name, new_scheme=new.name)
    model.load_state_dict(src, strict=True)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    record["run_scheme"] = {"name": meta["scheme"].name, "source_hash": meta["scheme_hash"],
                            "params": dict(meta["scheme"].params)}
    return model, cfg, {**meta, "scheme": new, "scheme_hash": new.source_hash, "swap": record}


def eval_attention(cfg, scheme, digest: str | None = None):
    """``scheme`` compiled for evaluation (requires_grad=False, the run's backend), as a
    :class:`~pedsl.train.recipe.SchemeRecipe` whose hash is ``digest`` (the run's recorded
    hash of the resolved scheme) or the scheme's own."""
    from pedsl.train.recipe import SchemeRecipe, per_layer

    def build(m):
        return per_layer(scheme, m, backend=cfg.backend, requires_grad=False)

    return SchemeRecipe(name=scheme.name, source=scheme.source, source_hash=digest or scheme.source_hash,
                           build=build, scheme=scheme)


def eval_config(cfg, scheme, overrides: dict[str, Any] | None = None):
    """The run's EvalConfig: defaults <- the scheme's ``eval {}`` block <- overrides."""
    return _scheme_eval_config(scheme, context=cfg.context, overrides=overrides)


def write_json(path: str | Path, data: Any) -> None:
    """Write JSON atomically (pedsl.fsio); NaN/inf become null."""
    write_text(path, json.dumps(finite_json(data), indent=1) + "\n")


def write_text(path: str | Path, text: str) -> None:
    ensure_dir(Path(path).parent)
    atomic_write_text(path, text)


def read_json(path: str | Path) -> Any | None:
    """Parsed JSON, or None when the file is missing or unreadable (a half-written study), or over
    16 MiB (a planted huge file is never read whole)."""
    try:
        return load_json(read_text(path, 16 << 20))
    except (OSError, ValueError):
        return None


def finite_json(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): finite_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite_json(v) for v in x]
    return x


def parse_lengths(text: str | None) -> list[int] | None:
    """``"128,256,512"`` (or spaces) -> [128, 256, 512]; multipliers like ``"1x,2x"`` are not accepted."""
    if text is None or not str(text).strip():
        return None
    out = []
    for part in str(text).replace(",", " ").split():
        try:
            v = int(part)
        except ValueError:
            raise EvalError(f"--lengths expects whole numbers of tokens, got '{part}'",
                            hint="e.g. --lengths 128,256,512,1024") from None
        if v < 2:
            raise EvalError(f"--lengths: {v} is too short (at least 2 tokens)")
        if v > MAX_LENGTH:
            raise EvalError(f"--lengths: {v:,} is above the limit of {MAX_LENGTH:,} tokens",
                            hint="see pedsl/limits.py (docs/safety.md, Resource caps)")
        out.append(v)
    if len(set(out)) > MAX_LIST:
        raise EvalError(f"--lengths: {len(set(out)):,} lengths; the limit is {MAX_LIST:,}")
    return sorted(set(out))


def make_dir(path: str | Path) -> Path:
    """``path`` created with its parents (an :class:`OutputError` naming it when that fails)."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the study directory '{path}': {exc.strerror or exc}",
                          hint="choose another --out") from None
    return path


def git_commit() -> str | None:
    """The short commit of the pedsl checkout the study ran from (``(with uncommitted changes)``
    when its tracked files differ), or None outside a git checkout."""
    try:
        root = Path(pedsl.__file__).resolve().parent.parent
        res = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5)
        if res.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return res.stdout.strip() + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def versions() -> dict[str, Any]:
    """pedsl, torch and python versions, platform, CPUs and torch threads: what a report's
    "Reproduce" section names."""
    import torch  # only the studies call this; `pedsl eval --help` stays free of torch

    return {"pedsl": getattr(pedsl, "__version__", "?"), "torch": torch.__version__,
            "python": platform.python_version(), "platform": platform.platform(terse=True),
            "cpus": os.cpu_count(), "threads": torch.get_num_threads()}


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def provenance() -> dict[str, Any]:
    """``git``, the :func:`versions` and ``date``, in the order the studies' results.json keep them."""
    return {"git": git_commit(), **versions(), "date": utc_now()}


__all__ = ["CheckpointError", "eval_config", "git_commit", "make_dir", "open_run", "parse_lengths", "progress",
           "provenance", "read_json", "utc_now", "versions", "write_json", "write_text"]

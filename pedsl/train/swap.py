"""A trained run's weights under another positional-encoding scheme.

Used by ``pedsl eval / analyze RUN --scheme OTHER [-P name=value]`` (evaluate the weights with
the encoding swapped, e.g. RoPE -> PI at inference) and by ``pedsl train --init-from RUN
[--scheme OTHER]`` (fine-tune from the weights, e.g. PI + 60 steps at 4x the length).

A swap is allowed when the learned tensors of the two schemes (the state-dict entries of the
attention modules' ``pe`` submodules) match by name and shape; the rest of the model is the
run's own architecture, so it always matches. The RoPE scaling family (PI, NTK, dynamic NTK,
YaRN, Llama 3, LongRoPE) has no learned tensors, so any of them can replace RoPE; a scheme with
learned tensors (e.g. ``acc_learned_qk``) cannot replace one without them and the error lists
every difference.

Parameters of the new scheme: the run's explicit overrides (``RUN/config.yaml`` ``params``) that
the new scheme also declares are carried over (``base`` of a RoPE trained with ``-P base=...``),
then ``-P`` overrides apply; an unknown name is a :class:`~pedsl.errors.ParamError` with a
did-you-mean hint. The scheme used is described by :func:`scheme_record`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

from pedsl.errors import CheckpointError, ConfigError

PE_MARK = ".attn.pe."


def scheme_path(name_or_path: str | Path) -> Path:
    """A library scheme name (``pi``) or a ``.pe`` file -> its path (E209 for an unknown name)."""
    from pedsl.lang.library import scheme_file  # on use: lark and torch only when a scheme or run is read

    return scheme_file(name_or_path)


def run_scheme_file(run: Path) -> tuple[Path, str | None]:
    """The run's own copy of its scheme (``RUN/scheme/<main>``, older runs ``RUN/scheme.pe``), the one
    verified against the run's hash, and the scheme name the run records."""
    from pedsl.train import rundir

    r = rundir.read(run)
    scheme, _ = r.load_scheme()
    return Path(scheme.file), r.scheme_name()


def swapped_scheme(run: Path, run_params: Mapping[str, Any], other: str | Path | None,
                   overrides: Mapping[str, Any] | None = None):
    """``(scheme, record)``: ``other`` (a library name or .pe file; None: the run's own scheme file)
    loaded with the run's carried parameters and ``overrides``."""
    from pedsl.train.recipe import load_scheme

    if other is None:
        path, name = run_scheme_file(Path(run))
    else:
        path, name = scheme_path(other), None
    declared = load_scheme(path, None, name).params
    carried = {k: v for k, v in dict(run_params or {}).items() if k in declared}
    overrides = dict(overrides or {})
    scheme = load_scheme(path, {**carried, **overrides}, name)
    return scheme, scheme_record(scheme, overrides, carried, path)


def scheme_record(scheme, overrides: Mapping[str, Any], carried: Mapping[str, Any], path: Path | str) -> dict:
    """What the output JSON and the reports say about the scheme used."""
    return {"name": scheme.name, "source_hash": scheme.source_hash, "file": str(path),
            "params": dict(scheme.params), "overrides": dict(overrides), "carried": dict(carried),
            "suffix": suffix(scheme.name, overrides)}


def suffix(name: str, overrides: Mapping[str, Any]) -> str:
    """A file-name-safe tag: ``pi`` or ``pi.factor=4`` (for ``eval.<tag>.json``)."""
    parts = [name] + [f"{k}={v}" for k, v in sorted(overrides.items())]
    return re.sub(r"[^A-Za-z0-9._=+-]", "_", ".".join(parts))


def pe_differences(src: Mapping[str, Any], dst: Mapping[str, Any]) -> list[str]:
    """What differs between two state dicts' scheme tensors: ``src``/``dst`` map names to shapes
    (lists or tensors). Empty when a swap is allowed."""
    def shape(v):
        return list(v.shape) if hasattr(v, "shape") else list(v)

    a = {k: shape(v) for k, v in src.items()}
    b = {k: shape(v) for k, v in dst.items()}
    out = []
    for k in sorted(set(a) | set(b)):
        if a.get(k) == b.get(k):
            continue
        if k not in b:
            out.append(f"'{k}' {a[k]} only in the run")
        elif k not in a:
            out.append(f"'{k}' {b[k]} only in the new scheme")
        else:
            out.append(f"'{k}' has shape {a[k]} in the run and {b[k]} in the new scheme")
    return out


def check_swap(src: Mapping[str, Any], dst: Mapping[str, Any], *, run: str, run_scheme: str,
               new_scheme: str) -> None:
    """Raise CheckpointError listing every difference when the weights cannot move over."""
    diff = pe_differences(src, dst)
    if not diff:
        return
    pe = [d for d in diff if PE_MARK in d]
    kind = "learned positional-encoding tensors" if len(pe) == len(diff) else "tensors"
    shown = "; ".join(diff[:8]) + (f"; and {len(diff) - 8} more" if len(diff) > 8 else "")
    raise CheckpointError(
        f"cannot swap the scheme of run '{run}' from '{run_scheme}' to '{new_scheme}': their {kind} differ: "
        f"{shown}", hint="a swap keeps every trained weight, so the two schemes must have the same learned "
        "tensors (the RoPE scaling family - pi, ntk, dynamic_ntk, yarn, llama3, longrope - has none); "
        "train the new scheme instead")


def init_record(run: Path) -> dict:
    """The ``init_from`` entry of a fine-tune's config: the source run's newest checkpoint."""
    from pedsl.fsio import read_text
    from pedsl.strictparse import load_json
    from pedsl.train import checkpoint as ck

    run = Path(run)
    if not run.is_dir() or not (run / "config.yaml").exists():
        raise ConfigError(f"--init-from: '{run}' is not a training run (no config.yaml)",
                          hint="pass the --out directory of `pedsl train` (or DIR/runs/<scheme> of `pedsl compare`)")
    path = ck.latest_checkpoint(run / "checkpoints")
    try:
        state = load_json(read_text(path / "state.json", ck.MAX_STATE_BYTES))
        return {"run": str(run.resolve()), "step": int(state["step"]), "scheme": state.get("scheme_name"),
                "scheme_hash": state["scheme_hash"], "model_sha256": state["files"]["model.safetensors"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"the checkpoint '{path}' of --init-from cannot be read ({type(exc).__name__}: {exc})",
                              file=str(path / "state.json"), hint="train the source run again") from None


def init_config(run: str | Path, *, scheme: str | Path | None = None, params: Mapping[str, Any] | None = None,
                overrides: Mapping[str, Any] | None = None):
    """``(cfg, scheme)`` of a fine-tune from ``run``: the run's settings (model, data, seed, optimizer)
    <- ``overrides`` (context, steps, lr ...), its newest checkpoint recorded in ``cfg.init_from``.
    The scheme's own ``train {}`` block is not applied: the model is the run's."""
    from pedsl.config import TrainConfig
    from pedsl.scheme_config import train_config

    run = Path(run)
    rec = init_record(run)
    src = TrainConfig.from_yaml(run / "config.yaml")
    new, _ = swapped_scheme(run, src.params, scheme, params)
    path = scheme_path(scheme) if scheme is not None else run / "scheme.pe"
    carried = {k: v for k, v in src.params.items() if k in new.params}
    cfg = train_config(new, path, params={**carried, **dict(params or {})},
                       overrides={**dict(overrides or {}), "init_from": rec}, base=src)
    return cfg, new


def load_init(model, cfg, new_scheme: str) -> None:
    """Load ``cfg.init_from``'s checkpoint into a freshly built ``model`` (the start of a fine-tune)."""
    from pedsl.train import checkpoint as ck

    rec = cfg.init_from
    path = Path(rec.run) / "checkpoints" / f"{ck.PREFIX}{rec.step:07d}"
    if not path.is_dir():
        raise CheckpointError(f"the source checkpoint '{path}' of this fine-tune is gone",
                              file=str(path), hint="keep the source run's checkpoints, or fine-tune from another run")
    model_t, _, state = ck.read_checkpoint(path)
    if state["files"]["model.safetensors"] != rec.model_sha256:
        raise CheckpointError(f"the source checkpoint '{path}' changed since this fine-tune started "
                              f"(sha256 {state['files']['model.safetensors'][:12]}..., recorded {rec.model_sha256[:12]}...)",
                              file=str(path / "model.safetensors"), hint="start the fine-tune again into a new --out")
    check_swap(model_t, model.state_dict(), run=rec.run, run_scheme=str(rec.scheme), new_scheme=new_scheme)
    ck.load_into(model, None, model_t, {}, state)

"""Checkpoints that survive faults: safetensors tensors, a JSON state, atomic directories.

Layout of one checkpoint (``RUN/checkpoints/step_0000600/``)::

    model.safetensors   the model's state_dict (float tensors, shared storage broken)
    optim.safetensors   AdamW state flattened: ``state.{param_index}.{exp_avg|exp_avg_sq|step}``
    state.json          step, RNG states, data position, config/scheme hashes, model shapes,
                        optimizer param_groups, sha256 of both tensor files

A checkpoint is written into ``step_XXXXXXX.tmp-<pid>/`` (every file fsynced), then renamed to
its final name with ``os.replace`` and the parent directory fsynced, so a crash leaves either a
complete checkpoint or an ignored temporary directory. Loading verifies the sha256 of both
tensor files and every mismatch raises :class:`CheckpointError` naming the file and what differs.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from pedsl.errors import CheckpointError, clip, quoted
from pedsl.fsio import fsync_dir, open_regular, read_bytes, write_new_bytes
from pedsl.strictparse import load_json

PREFIX = "step_"


# ---------------------------------------------------------------------------------------------
# RNG states as JSON


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
        "python": _to_json(random.getstate()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [base64.b64encode(s.numpy().tobytes()).decode() for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8))
    random.setstate(_from_json(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(
            [torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8) for s in state["cuda"]])


def _to_json(x: Any) -> Any:
    return [_to_json(v) for v in x] if isinstance(x, (tuple, list)) else x


def _from_json(x: Any) -> Any:
    return tuple(_from_json(v) for v in x) if isinstance(x, list) else x


# ---------------------------------------------------------------------------------------------
# Save


def _tensors(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in sd.items()}


def flatten_optimizer(optim: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list[dict]]:
    sd = optim.state_dict()
    flat = {}
    for idx, st in sd["state"].items():
        for name, value in st.items():
            t = value if torch.is_tensor(value) else torch.tensor(value)
            flat[f"state.{idx}.{name}"] = t.detach().to("cpu").contiguous().clone()
    return flat, sd["param_groups"]


def unflatten_optimizer(flat: dict[str, torch.Tensor], groups: list[dict]) -> dict[str, Any]:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, t in flat.items():
        _, idx, name = key.split(".", 2)
        state.setdefault(int(idx), {})[name] = t
    return {"state": state, "param_groups": groups}


def save_checkpoint(ckpt_root: Path, step: int, model: torch.nn.Module, optim: torch.optim.Optimizer,
                    meta: dict[str, Any], keep: int) -> Path:
    """Write ``ckpt_root/step_XXXXXXX`` atomically and delete all but the newest ``keep``."""
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / f"{PREFIX}{step:07d}"
    tmp = ckpt_root / f"{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    sd = model.state_dict()
    model_bytes = st_save(_tensors(sd))
    flat, groups = flatten_optimizer(optim)
    optim_bytes = st_save(flat) if flat else st_save({"__empty__": torch.zeros(0)})
    state = {
        **meta,
        "step": step,
        "rng": rng_state(),
        "shapes": {k: list(v.shape) for k, v in sd.items()},
        "param_groups": groups,
        "files": {"model.safetensors": hashlib.sha256(model_bytes).hexdigest(),
                  "optim.safetensors": hashlib.sha256(optim_bytes).hexdigest()},
    }
    try:
        for name, data in (("model.safetensors", model_bytes), ("optim.safetensors", optim_bytes),
                           ("state.json", json.dumps(state, indent=1).encode())):
            write_new_bytes(tmp / name, data)
        fsync_dir(tmp)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # a full disk: leave no half-written folder behind
        raise
    if final.exists():  # the same step written again after a resume
        trash = ckpt_root / f"{final.name}.old-{os.getpid()}"
        os.replace(final, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(tmp, final)
    fsync_dir(ckpt_root)
    for old in list_checkpoints(ckpt_root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


# ---------------------------------------------------------------------------------------------
# Load


MAX_STATE_BYTES = 64 << 20  # a state.json is a few hundred kB (the RNG states)


class _Rng(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    torch: str
    python: list[Any]
    cuda: list[str] | None = None

    @field_validator("torch")
    @classmethod
    def _base64(cls, v: str) -> str:
        try:
            base64.b64decode(v, validate=True)
        except ValueError:
            raise ValueError("the torch RNG state is not base64") from None
        return v


class CheckpointState(BaseModel):
    """The schema of a checkpoint's ``state.json`` (extra keys are kept: older and newer writers)."""

    model_config = ConfigDict(extra="allow", strict=True)
    step: int = Field(ge=0, le=10**12)
    files: dict[str, str]
    rng: _Rng
    shapes: dict[str, list[int]]
    param_groups: list[dict[str, Any]]
    scheme_name: str | None = None
    scheme_hash: str | None = None
    scheme_layers: list[str] | None = None  # a layers scheme: the part each layer was built with
    config_hash: str | None = None
    data: dict[str, int] | None = None

    @field_validator("files")
    @classmethod
    def _hashes(cls, v: dict[str, str]) -> dict[str, str]:
        for name in ("model.safetensors", "optim.safetensors"):
            if not isinstance(v.get(name), str) or len(v[name]) != 64 or any(c not in "0123456789abcdef" for c in v[name]):
                raise ValueError(f"needs the sha256 of {name} (64 hex digits)")
        return v

    @field_validator("shapes")
    @classmethod
    def _sizes(cls, v: dict[str, list[int]]) -> dict[str, list[int]]:
        if any(d < 0 for dims in v.values() for d in dims):
            raise ValueError("a tensor size is negative")
        return v


def validate_state(path: Path, state: Any) -> CheckpointState:
    """The parsed state of checkpoint ``path``; CheckpointError naming the field when it is invalid
    or its step differs from the folder's name (a hand-edited state.json)."""
    state_file = path / "state.json"
    hint = f"the checkpoint was edited or damaged; delete '{path}' to resume from an older checkpoint"
    try:
        parsed = CheckpointState.model_validate(state)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "the top level"
        got = "" if first["type"] == "missing" else f" (found {quoted(first.get('input'), 60)})"
        raise CheckpointError(f"'{state_file}' is invalid: {where}: {first['msg']}{got}", file=str(state_file),
                              hint=hint) from None
    name = path.name
    if name.startswith(PREFIX) and name[len(PREFIX):].isdigit() and int(name[len(PREFIX):]) != parsed.step:
        raise CheckpointError(f"'{state_file}' is invalid: it says step {parsed.step} in the folder of step "
                              f"{int(name[len(PREFIX):])}", file=str(state_file), hint=hint)
    return parsed


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    """Complete checkpoint directories, oldest first (temporary ones are ignored)."""
    if not ckpt_root.is_dir():
        return []
    out = []
    for p in ckpt_root.iterdir():
        name = p.name
        if p.is_dir() and name.startswith(PREFIX) and name[len(PREFIX):].isdigit():
            out.append(p)
    return sorted(out, key=lambda p: int(p.name[len(PREFIX):]))


def latest_checkpoint(ckpt_root: Path) -> Path:
    ckpts = list_checkpoints(ckpt_root)
    if not ckpts:
        raise CheckpointError(f"no checkpoint found in '{ckpt_root}'",
                              hint="run without --resume to start a new run, or check the --out directory")
    return ckpts[-1]


def _sha256_streamed(f: Path) -> tuple[str, int]:
    """(sha256, size) of a regular file, read in 1 MiB chunks."""
    h, size = hashlib.sha256(), 0
    with open_regular(f) as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def read_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, Any]]:
    """(model tensors, optimizer tensors, state) of one checkpoint, verified against its hashes."""
    state_file = path / "state.json"
    try:
        state = load_json(read_bytes(state_file, MAX_STATE_BYTES + 1).decode("utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint '{path}' has no state.json", file=str(state_file),
                              hint=f"the checkpoint is incomplete; delete '{path}' to resume from an older one") from None
    except OSError as exc:  # a FIFO or a device in its place (refused unread), permissions, ...
        raise CheckpointError(f"'{state_file}' cannot be read: {exc.strerror or exc}", file=str(state_file),
                              hint=f"delete '{path}' to resume from an older checkpoint") from None
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"'{state_file}' is corrupt (not JSON: {exc})", file=str(state_file),
                              hint=f"delete '{path}' to resume from an older checkpoint") from None
    validate_state(path, state)
    files = state["files"]
    tensors = []
    for name in ("model.safetensors", "optim.safetensors"):
        f = path / name
        try:
            digest, size = _sha256_streamed(f)  # a damaged or planted huge file is never held in memory
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint file '{f}' is missing", file=str(f),
                                  hint=f"delete '{path}' to resume from an older checkpoint") from None
        if digest != files.get(name):
            raise CheckpointError(
                f"checkpoint file '{f}' is corrupt or truncated ({size} bytes; its sha256 "
                f"{digest[:12]}... differs from the {files.get(name, '?')[:12]}... recorded in state.json)",
                file=str(f), hint=f"delete '{path}' to resume from an older checkpoint")
        data = read_bytes(f, size + 1)
        if hashlib.sha256(data).hexdigest() != digest:  # changed since it was hashed
            raise CheckpointError(f"checkpoint file '{f}' changed while it was read", file=str(f))
        try:
            tensors.append(st_load(data))
        except (SafetensorError, Exception) as exc:  # noqa: BLE001 - any decoding failure
            raise CheckpointError(f"checkpoint file '{f}' cannot be read: {exc}", file=str(f)) from None
    _finite_weights(path, tensors[0])
    return tensors[0], tensors[1], state


def _finite_weights(path: Path, model_t: dict[str, torch.Tensor]) -> None:
    """CheckpointError when a weight is NaN or infinite: training stops before a non-finite step,
    so such a checkpoint was edited or damaged, and every result from it would be NaN."""
    for name, t in sorted(model_t.items()):
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"checkpoint '{path}' holds non-finite weights (NaN or infinity in '{clip(name, 80)}')",
                                  file=str(path / "model.safetensors"),
                                  hint=f"pedsl never saves such weights: the file was edited or damaged; delete "
                                       f"'{path}' to use an older checkpoint")


def check_compatible(path: Path, state: dict[str, Any], *, scheme_hash: str, config_hash: str,
                     model: torch.nn.Module) -> None:
    """Raise CheckpointError when a checkpoint belongs to another scheme, config or shape."""
    check_hashes(path, state, scheme_hash=scheme_hash, config_hash=config_hash)
    check_shapes(path, state, model)


def check_hashes(path: Path, state: dict[str, Any], *, scheme_hash: str, config_hash: str) -> None:
    """Raise CheckpointError when a checkpoint records another scheme or config than the run's."""
    f = str(path / "state.json")
    if state.get("scheme_hash") != scheme_hash:
        raise CheckpointError(
            f"checkpoint '{path}' was trained with another scheme (sha256 {str(state.get('scheme_hash'))[:12]}..., "
            f"this scheme is {scheme_hash[:12]}...)", file=f,
            hint="resume with the run's own copy of its scheme (RUN/scheme/) or use another --out")
    if state.get("config_hash") != config_hash:
        diff = clip(str(state.get("config_diff_hint", "")))
        raise CheckpointError(
            f"checkpoint '{path}' was trained with another configuration{diff}", file=f,
            hint="resume with the same settings as the run (see RUN/config.yaml) or use another --out")


def check_shapes(path: Path, state: dict[str, Any], model: torch.nn.Module) -> None:
    """Raise CheckpointError when the tensor shapes a checkpoint records differ from the model's."""
    f = str(path / "state.json")
    own = {k: list(v.shape) for k, v in model.state_dict().items()}
    saved = state.get("shapes", {})
    for k in sorted(set(own) | set(saved)):
        if own.get(k) != saved.get(k):
            raise CheckpointError(
                f"checkpoint '{path}' does not fit the model: tensor '{k}' has shape {saved.get(k)} "
                f"in the checkpoint and {own.get(k)} in the model", file=f,
                hint="use the same model settings as the run (see RUN/config.yaml)")


def _same_settings(saved: list[Any], own: list[dict[str, Any]]) -> None:
    """ValueError when a saved optimizer group differs from the one the run's config builds, in anything
    but its learning rate (set by the schedule each step) and parameter indices: a hand-edited
    ``maximize``, ``eps`` or ``amsgrad`` would otherwise train silently with it, or crash mid-step."""
    if not isinstance(saved, list) or len(saved) != len(own) or not all(isinstance(g, dict) for g in saved):
        raise ValueError(f"state.json has {len(saved) if isinstance(saved, list) else 'no'} optimizer groups, "
                         f"the run's config builds {len(own)}")
    for i, (g, o) in enumerate(zip(saved, own)):
        for key, value in o.items():
            if key in ("params", "lr") or key not in g:
                continue
            if _to_json(g[key]) != _to_json(value):
                raise ValueError(f"optimizer group {i} has {key} = {quoted(g[key])} in state.json, but the run's "
                                 f"config gives {quoted(value)}")


def load_into(model: torch.nn.Module, optim: torch.optim.Optimizer | None, model_t: dict, optim_t: dict,
              state: dict[str, Any]) -> None:
    device = next(iter(model.state_dict().values())).device if model.state_dict() else "cpu"
    model.load_state_dict({k: v.to(device) for k, v in model_t.items()}, strict=True)
    if optim is not None:
        optim_t = {k: v for k, v in optim_t.items() if k != "__empty__"}
        _same_settings(state["param_groups"], optim.state_dict()["param_groups"])
        _fits_parameters(optim_t, state["param_groups"], optim)
        sd = unflatten_optimizer(optim_t, state["param_groups"])
        optim.load_state_dict(sd)  # AdamW moves state to the params' device


_MOMENTS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")  # AdamW's per-parameter tensors; "step" is a scalar


def _fits_parameters(flat: dict[str, torch.Tensor], saved: list[dict], optim: torch.optim.Optimizer) -> None:
    """ValueError when an optimizer tensor is not one AdamW keeps for a parameter of this model, or
    has another shape (torch would load it and fail at the first step)."""
    by_index: dict[int, torch.Tensor] = {}
    for g, own in zip(saved, optim.param_groups):
        ids = g.get("params")
        if not isinstance(ids, list) or len(ids) != len(own["params"]):
            raise ValueError(f"an optimizer group of state.json lists {len(ids) if isinstance(ids, list) else 'no'} "
                             f"parameters, the model's has {len(own['params'])}")
        by_index.update(zip(ids, own["params"]))
    for key, t in flat.items():
        _, idx, name = (key.split(".", 2) + ["", ""])[:3]
        param = by_index.get(int(idx)) if idx.isdigit() else None
        if param is None or name not in (*_MOMENTS, "step"):
            raise ValueError(f"optim.safetensors holds {quoted(key, 80)}, which is no optimizer state of this model")
        want = list(param.shape) if name in _MOMENTS else []
        if list(t.shape) != want or not t.is_floating_point():
            raise ValueError(f"optimizer tensor '{key}' is {t.dtype} of shape {list(t.shape)}; its parameter needs "
                             f"floating point of shape {want}")


def _check_rng(state: dict[str, Any]) -> None:
    """The RNG states applied to throw-away generators first: a bad one fails before anything changes."""
    torch.Generator().set_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8))
    random.Random().setstate(_from_json(state["python"]))


def restore(path: Path, model: torch.nn.Module, optim: torch.optim.Optimizer, model_t: dict, optim_t: dict,
            state: dict[str, Any]) -> None:
    """Load checkpoint ``path`` (read by :func:`read_checkpoint`) into the model, the optimizer and the
    RNGs. CheckpointError when it cannot be: files that match their hashes but hold what no run
    writes (an edited ``eps``, a bad RNG state, optimizer tensors of the wrong shape)."""
    try:
        _check_rng(state["rng"])
        load_into(model, optim, model_t, optim_t, state)
        set_rng_state(state["rng"])
    except (ValueError, TypeError, KeyError, RuntimeError, IndexError, OverflowError) as exc:
        raise CheckpointError(f"checkpoint '{path}' cannot be restored: {type(exc).__name__}: "
                              f"{clip(str(exc), 300)}", file=str(path / "state.json"),
                              hint=f"the checkpoint was edited or damaged; delete '{path}' to resume from an "
                                   "older checkpoint") from None

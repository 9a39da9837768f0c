"""torch.distributed set-up for ``torchrun --nproc-per-node N -m pedsl train [--shard fsdp] ...``.

Under torchrun (``WORLD_SIZE`` > 1 in the environment) the process group is initialised with
gloo on CPU and nccl on CUDA; each rank takes rows ``rank::world`` of the same global batch
(:meth:`pedsl.data.stream.TrainData.train_batch`) and the gradients are averaged over the ranks, so
the loss curve is the single-process one with the same global batch (within float tolerance):

- ``ddp`` (the default): every rank holds the whole model and optimizer; DistributedDataParallel
  averages the gradients.
- ``fsdp``: PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``) on every transformer block and
  on the model: each rank holds 1/N of every parameter, gradient and optimizer moment, and gathers a
  block's parameters only while it computes. A checkpoint is the full state gathered on rank 0
  (:func:`full_state`), the same files as a DDP or single-process run, so either resumes the other.

Only rank 0 writes files. Without torchrun everything here is a no-op, and ``fsdp`` is refused
(one process has nothing to shard over).
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from pedsl.errors import ConfigError, UsageError

SHARDING = ("ddp", "fsdp")


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    shard: str = "ddp"

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def sharded(self) -> bool:
        """Whether parameters and optimizer state are sharded over the ranks (FSDP)."""
        return self.enabled and self.shard == "fsdp"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of a scalar tensor over ranks (identity on one process)."""
        if not self.enabled:
            return value
        v = value.detach().clone()
        dist.all_reduce(v, op=dist.ReduceOp.SUM)
        return v / self.world


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("device 'cuda' was asked for but CUDA is not available",
                              hint="use --device cpu (or auto)")
        return torch.device("cuda", local_rank)
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"unknown device '{name}'", hint="use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"device '{name}' was asked for but CUDA is not available", hint="use --device cpu (or auto)")
        if dev.index is not None and dev.index >= count:
            raise ConfigError(f"device '{name}' does not exist: this machine has {count} CUDA device(s), "
                              f"cuda:0 .. cuda:{count - 1}", hint="use --device cuda (or auto)")
    elif dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise ConfigError(f"device '{name}' was asked for but MPS is not available", hint="use --device cpu (or auto)")
    elif dev.type != "cpu":
        raise ConfigError(f"device '{name}' cannot train a model", hint="use auto, cpu, cuda, cuda:N or mps")
    return dev


def setup(device: str = "auto", shard: str = "ddp") -> Dist:
    """Initialise the process group when launched by torchrun; pick this rank's device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if shard not in SHARDING:
        raise UsageError(f"unknown sharding '{shard}'", hint=f"use one of: {', '.join(SHARDING)}")
    if world <= 1:
        if shard == "fsdp":
            raise UsageError("--shard fsdp needs several processes: one process has nothing to shard the model over",
                             hint="launch with torchrun --nproc-per-node N -m pedsl train ... (N >= 2), or drop --shard")
        return Dist(device=pick_device(device))
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = pick_device(device, local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    return Dist(rank=rank, world=world, local_rank=local_rank, device=dev, shard=shard)


def teardown(d: Dist, finished: bool = False) -> None:
    """Leave the process group; after a finished run every rank leaves together (a rank that tears gloo
    down while another still sends aborts that one: "terminate called without an active exception",
    seen on a loaded machine). After a failure no barrier: the other ranks may never reach it.

    The garbage collector runs first and last: a sharded model's FSDP state sits in reference
    cycles that can keep the group and its work objects (with their tensors) alive; released only
    at the interpreter's shutdown, a gloo thread that needs the GIL then aborts the process with
    that same message (seen once in CI on a finished FSDP run, not reproduced in 30 runs here)."""
    if d.enabled and dist.is_initialized():
        gc.collect()
        if finished:
            dist.barrier()
        dist.destroy_process_group()
        gc.collect()


def wrap(model: torch.nn.Module, d: Dist) -> torch.nn.Module:
    """The module whose forward syncs the gradients: DDP around the model; the model itself when it
    is sharded (FSDP syncs through hooks on its modules) or on one process."""
    if not d.enabled or d.sharded:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [d.device.index] if d.device.type == "cuda" else None
    return DDP(model, device_ids=ids)


# ---------------------------------------------------------------------------------------------
# FSDP2


def shard(model: torch.nn.Module, optim: torch.optim.Optimizer, d: Dist,
          make_optimizer: Callable[[torch.nn.Module], torch.optim.Optimizer]) -> torch.optim.Optimizer:
    """Shard ``model`` in place with FSDP2 (each block, then the whole model) and return a new
    optimizer over the sharded parameters holding ``optim``'s state (a resumed run's moments), which
    every rank loaded whole. A no-op returning ``optim`` unless ``d`` is sharded."""
    if not d.sharded:
        return optim
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
    from torch.distributed.fsdp import fully_shard

    state = _by_name(model, optim)
    for block in getattr(model, "blocks", ()):
        fully_shard(block)
    fully_shard(model)
    sharded = make_optimizer(model)
    if state["state"]:
        set_optimizer_state_dict(model, sharded, optim_state_dict=state,
                                 options=StateDictOptions(full_state_dict=True))
    return sharded


def _by_name(model: torch.nn.Module, optim: torch.optim.Optimizer) -> dict[str, Any]:
    """``optim.state_dict()`` with parameter names instead of indices (the form FSDP's loader reads)."""
    names = {id(p): n for n, p in model.named_parameters()}
    sd = optim.state_dict()
    index = {i: names[id(p)] for i, p in enumerate(p for g in optim.param_groups for p in g["params"])}
    # in the order AdamW creates them (step, exp_avg, exp_avg_sq): given in a checkpoint's sorted
    # order, FSDP's loader put the moments swapped on the second rank (torch 2.13, gloo)
    return {"state": {index[i]: {k: st[k] for k in sorted(st, key=lambda k: (k != "step", k))}
                      for i, st in sd["state"].items()},
            "param_groups": [{**g, "params": [index[i] for i in g["params"]]} for g in sd["param_groups"]]}


class _Whole:
    """A gathered state dict standing in for a module or optimizer where only ``state_dict()`` is read."""

    def __init__(self, sd: dict[str, Any]) -> None:
        self._sd = sd

    def state_dict(self) -> dict[str, Any]:
        return self._sd


def full_state(model: torch.nn.Module, optim: torch.optim.Optimizer, d: Dist) -> tuple[Any, Any]:
    """(model, optimizer) whose ``state_dict()`` is the whole, unsharded state, for a checkpoint.
    Sharded: gathered on rank 0 (on the CPU; every rank must call this, the others get empty
    states), the optimizer's in ``torch.optim``'s own form (parameter indices), so the checkpoint is
    the one a DDP or single-process run writes. Otherwise the objects themselves."""
    if not d.sharded:
        return model, optim
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    msd = get_model_state_dict(model, options=opts)
    # torch types it as any optimizer's state; torch.optim's is {"state": {name: ...}, "param_groups": [{"params": [name, ...], ...}]}
    osd: dict[str, Any] = get_optimizer_state_dict(model, optim, options=opts)
    if not d.is_main:
        return _Whole({}), _Whole({})
    order = [n for g in osd["param_groups"] for n in g["params"]]
    index = {n: i for i, n in enumerate(order)}
    indexed = {"state": {index[n]: st for n, st in osd["state"].items()},
               "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in osd["param_groups"]]}
    return _Whole(msd), _Whole(indexed)


def to_float(t: Any) -> float:
    """A scalar that may be a DTensor (a sharded model's gradient norm) as a float."""
    return float(t.full_tensor() if hasattr(t, "full_tensor") else t)

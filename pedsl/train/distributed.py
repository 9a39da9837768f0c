"""torch.distributed set-up for ``torchrun --nproc-per-node N -m pedsl train ...``.

Under torchrun (``WORLD_SIZE`` > 1 in the environment) the process group is initialised with
gloo on CPU and nccl on CUDA; each rank takes rows ``rank::world`` of the same global batch
(:meth:`pedsl.data.stream.TrainData.train_batch`), DistributedDataParallel averages the gradients, so
the loss curve is the single-process one with the same global batch (within float tolerance).
Only rank 0 writes files. Without torchrun everything here is a no-op.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pedsl.errors import ConfigError


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def enabled(self) -> bool:
        return self.world > 1

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


def setup(device: str = "auto") -> Dist:
    """Initialise the process group when launched by torchrun; pick this rank's device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist(device=pick_device(device))
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = pick_device(device, local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    return Dist(rank=rank, world=world, local_rank=local_rank, device=dev)


def teardown(d: Dist) -> None:
    if d.enabled and dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: torch.nn.Module, d: Dist) -> torch.nn.Module:
    if not d.enabled:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [d.device.index] if d.device.type == "cuda" else None
    return DDP(model, device_ids=ids)

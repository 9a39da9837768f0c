"""``pedsl train SCHEME.pe|train.yaml [options]``: train a small language model with a scheme.

Settings resolve as: defaults <- preset <- the scheme's ``train {}`` block <- a train.yaml (when
given instead of a .pe file) <- these options. Works unchanged under
``torchrun --nproc-per-node N -m pedsl train ...`` (DDP; rank 0 writes the run directory), and
``torchrun ... -m pedsl train --shard fsdp ...`` shards the model over the processes (FSDP2).
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from pedsl.cli.option_rules import check_set_keys, refuse_given, set_conflicts, train_set_keys
from pedsl.cli.options import key_values, output_path, param_values
from pedsl.config import TrainConfig
from pedsl.errors import ConfigError, UsageError
from pedsl.lang.library import scheme_file
from pedsl.scheme_config import train_config

# option -> the --set keys of the same setting (both given with different values: a usage error)
SET_BY_OPTION = {"steps": "steps", "context": "context", "preset": "preset", "batch_size": "batch_size", "lr": "lr",
                 "seed": "seed", "data": "data,source,data.source", "device": "device", "threads": "threads",
                 "backend": "backend", "compile_": "compile"}


@click.command("train")
@click.argument("source", metavar="SCHEME.pe|train.yaml", required=False)
@click.option("--out", "out", type=click.Path(file_okay=False), callback=output_path, default=None,
              help="Run directory (default: runs/<scheme-name>).")
@click.option("--steps", type=int, default=None, help="Optimizer steps.")
@click.option("--context", type=int, default=None, help="Training length in bytes.")
@click.option("--preset", default=None, help="Model size: tiny, small or base.")
@click.option("--batch-size", type=int, default=None, help="Global batch size (split over ranks).")
@click.option("--lr", type=float, default=None, help="Peak learning rate.")
@click.option("--seed", type=int, default=None, help="Seed of init and data order.")
@click.option("--data", default=None, help="stdlib, passkey, multikey, kv, blocks, a local file/folder, or a weighted mixture such as stdlib:0.7,passkey:0.1,multikey:0.1,kv:0.1.")
@click.option("--device", default=None, help="auto, cpu, cuda.")
@click.option("--threads", type=int, default=None, help="torch CPU threads per process (default: the idle cores, from the load average).")
@click.option("--backend", default=None, help="Force a compiler backend (default auto).")
@click.option("--compile/--no-compile", "compile_", default=None, help="Use torch.compile.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Any other setting, e.g. --set eval_every=50 --set data.max_bytes=1000000.")
@click.option("-P", "--param", "params", multiple=True, metavar="NAME=VALUE", help="Scheme parameter override.")
@click.option("--init-from", "init_from", type=click.Path(file_okay=False), default=None, metavar="RUN",
              help="Start from this run's weights (a fine-tune: fresh optimizer, step 0; its settings unless "
              "overridden). No SCHEME argument: --scheme, or the run's own scheme.")
@click.option("--scheme", "scheme", default=None, metavar="NAME|FILE.pe",
              help="With --init-from: the scheme to fine-tune with (library name or .pe file).")
@click.option("--shard", type=click.Choice(["ddp", "fsdp"]), default=None,
              help="Under torchrun with several processes: ddp (the default) keeps the whole model on every "
              "process; fsdp shards parameters, gradients and optimizer state over them (FSDP2). Checkpoints hold "
              "the whole model either way, so either resumes the other's run.")
@click.option("--resume", is_flag=True, help="Continue the run in --out from its latest checkpoint.")
@click.option("--force-new", is_flag=True,
              help="Discard the run already in --out (checkpoints, metrics, results) and start over.")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
def train(source, out, steps, context, preset, batch_size, lr, seed, data, device, threads, backend,
          compile_, sets, params, init_from, scheme, shard, resume, force_new, quiet):
    """Train a small byte-level language model whose attention is the scheme.

    --out must be new, empty or a pedsl run folder; it is locked while training.

    ``pedsl train --init-from RUN [--scheme OTHER] --context N --steps S`` fine-tunes a trained run
    (e.g. RoPE -> PI + 60 steps at 4x the length); the new run's config.yaml records the source run,
    its step and scheme hash (``init_from``), and it resumes like any run.
    """
    # pedsl.train imports torch: imported here, so loading this module (for --help) stays quick.
    from pedsl.train.loop import train as run_training
    from pedsl.train.recipe import from_scheme, load_scheme

    overrides = {"steps": steps, "context": context, "preset": preset, "batch_size": batch_size, "lr": lr,
                 "seed": seed, "data": data, "device": device, "threads": threads, "backend": backend,
                 "compile": compile_}
    set_values = key_values(sets, "--set", "batch_size=8")
    check_set_keys(set_values, train_set_keys())
    set_conflicts(set_values, SET_BY_OPTION)
    overrides.update(set_values)
    cli_params = param_values(params)
    if resume and force_new:
        raise UsageError("--resume and --force-new exclude each other", hint="continue the run, or start over")
    if shard is not None and int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        raise UsageError(f"--shard {shard} needs several processes: one process has nothing to split the model "
                         "or the batch over", hint="launch with torchrun --nproc-per-node N -m pedsl train ... "
                         "(N >= 2), or drop --shard")
    how = {"resume": resume, "quiet": quiet, "force_new": force_new, "shard": shard or "ddp"}
    if init_from is not None:
        if source is not None:
            raise UsageError(f"--init-from takes no SCHEME argument (got '{source}')",
                             hint=f"pass the new scheme as --scheme {source}")
        _refuse_preset(set_values, "with --init-from (a fine-tune keeps the run's model and settings)")
        return _fine_tune(init_from, scheme, cli_params, overrides, out, **how)
    if source is None:
        raise UsageError("missing SCHEME.pe or train.yaml", hint="e.g. `pedsl train schemes/rope.pe --preset tiny`, "
                         "or `pedsl train --init-from RUN --scheme pi` to fine-tune a run")
    if scheme is not None:
        raise UsageError("--scheme goes with --init-from", hint=f"train the scheme directly: `pedsl train {scheme}`")
    src = Path(source)
    if src.suffix in (".yaml", ".yml"):
        _refuse_preset(set_values, f"with a training config ('{source}' gives every setting)")
        base = TrainConfig.from_yaml(src)
        scheme_path = Path(base.scheme)
        if not scheme_path.is_absolute() and (src.parent / scheme_path).is_file():
            scheme_path = src.parent / scheme_path  # relative to the YAML's folder (as `pedsl compile` writes it)
        else:
            scheme_path = scheme_file(base.scheme)  # as given (from the current folder), or a library name
        if scheme_path.suffix != ".pe" or scheme_path.resolve().suffix != ".pe":  # never quote another file
            target = scheme_path.resolve().name
            link = f" (a link to '{target}')" if target != scheme_path.name else ""
            raise ConfigError(f"'scheme: {base.scheme}'{link} is not a .pe file", file=str(src),
                              hint="a training config names a .pe scheme file or a library scheme")
        merged_params = {**base.params, **cli_params}
        scheme = load_scheme(scheme_path, merged_params)
        cfg = train_config(scheme, scheme_path, params=merged_params, overrides=overrides, base=base)
    else:
        src = scheme_file(source)  # a path, or the name of a library scheme
        if not src.exists():
            raise ConfigError(f"scheme file '{src}' does not exist", file=str(src))
        scheme = load_scheme(src, cli_params)
        cfg = train_config(scheme, src, params=cli_params, overrides=overrides)
    out_dir = Path(out) if out else Path("runs") / scheme.name
    run_training(cfg, out_dir, attention=from_scheme(cfg, scheme), **how)


def _fine_tune(init_from: str, scheme: str | None, params: dict, overrides: dict, out: str | None, **how) -> None:
    """``pedsl train --init-from RUN [--scheme S]``: the run's settings under the options, its weights."""
    from pedsl.train.loop import train as run_training
    from pedsl.train.recipe import from_scheme
    from pedsl.train.swap import init_config

    cfg, scheme_obj = init_config(init_from, scheme=scheme, params=params, overrides=overrides)
    out_dir = Path(out) if out else Path("runs") / f"{scheme_obj.name}-from-{Path(init_from).name}"
    run_training(cfg, out_dir, attention=from_scheme(cfg, scheme_obj), **how)


def _refuse_preset(sets: dict, where: str) -> None:
    """A preset is the first layer of settings; over a whole config (a run's, a train.yaml) it would
    change only the name recorded, so --preset and --set preset= are refused there."""
    hint = "change single settings with --set KEY=VALUE or the options (--context, --steps, ...)"
    refuse_given(["preset"], f"not used {where}", hint=hint)
    if "preset" in sets:
        raise UsageError(f"--set preset={sets['preset']}: not used {where}", hint=hint)

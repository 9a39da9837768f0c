"""The training loop: AdamW, warm-up + cosine decay, clipping, validation, checkpoints.

Deterministic on CPU: the model is initialised from ``cfg.seed``, every training batch is a pure
function of ``(seed, step)`` and a checkpoint restores parameters, AdamW moments and RNG states
bit for bit, so ``--resume`` after a crash logs exactly the losses of an uninterrupted run.
A non-finite loss stops the run with :class:`TrainError` before the optimizer touches the
weights; the last checkpoint written is the last good one.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from pedsl.config import RESUMABLE_FIELDS, TrainConfig
from pedsl.data.stream import TrainData
from pedsl.errors import CheckpointError, ConfigError, OutputError, TrainError, quoted
from pedsl.fsio import atomic_write_text, open_append, open_regular
from pedsl.strictparse import load_json
from pedsl.model import TransformerLM, scheme_axes
from pedsl.torchenv import setup_torch
from pedsl.train import checkpoint as ck
from pedsl.train import distributed, live, rundir
from pedsl.train.runlock import temporary_folders
from pedsl.train.schemefiles import attention_files
from pedsl.train.swap import load_init
from pedsl.train.recipe import SchemeRecipe, from_scheme


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to ``lr`` over ``warmup`` steps, then cosine decay to ``min_lr`` at ``steps``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1.0 + math.cos(math.pi * progress))


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only (not on norms, gains or scheme scalars)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), foreach=False)


@torch.no_grad()
def validate(model: TransformerLM, batches: list[torch.Tensor], device: torch.device,
             positions: Callable[[int], torch.Tensor | None] = lambda n: None) -> float:
    """Mean loss over the validation ``batches``; ``positions(n)``: the positions of ``n`` windows
    (:meth:`pedsl.data.stream.TrainData.positions`; None: the token index)."""
    was = model.training
    model.eval()
    total = sum(float(model.loss(b.to(device), _on(positions(b.shape[0]), device))) for b in batches) / len(batches)
    model.train(was)
    return total


def _on(positions: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    return None if positions is None else positions.to(device)


def _config_diff(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(old) | set(new)):
        if not prefix and k in RESUMABLE_FIELDS:
            continue
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict) and k != "params":
            out += _config_diff(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k}: {quoted(a)} in the run, {quoted(b)} now")
    return out


# what --force-new deletes from a run folder before starting over (never anything else)
_RUN_OUTPUTS = ("checkpoints", "metrics.jsonl", "DONE.json", "eval.json", "analysis.json", rundir.SCHEME_DIR)


def _prepare_run_dir(run: Path, cfg: TrainConfig, attn: SchemeRecipe, resume: bool, force_new: bool = False) -> None:
    """Called with the run's lock held (:func:`pedsl.train.rundir.open_for_training`)."""
    ckpts = ck.list_checkpoints(run / "checkpoints")
    if not resume:
        if ckpts and force_new:
            for name in _RUN_OUTPUTS:
                p = run / name
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p)
                elif p.exists() or p.is_symlink():
                    p.unlink()
        elif ckpts:
            raise OutputError(f"'{run}' already holds checkpoints of a run (latest: {ckpts[-1].name})",
                              hint="pass --resume to continue it, --force-new to discard it and start over, "
                                   "or choose another --out")
        rundir.write_scheme(run, attention_files(attn), attn.source)
        atomic_write_text(run / "config.yaml", cfg.to_yaml())
        atomic_write_text(run / "metrics.jsonl", "")
        (run / "DONE.json").unlink(missing_ok=True)
        return
    rundir.verify_scheme(run, attention_files(attn), what="resume")
    saved = run / "config.yaml"
    if saved.exists():
        old = TrainConfig.from_yaml(saved).model_dump(mode="json")
        diff = _config_diff(old, cfg.model_dump(mode="json"))
        if diff:
            raise CheckpointError(f"cannot resume '{run}': the configuration differs from the run's: "
                                  + "; ".join(diff[:5]), file=str(saved),
                                  hint=f"resume with the same settings (e.g. `pedsl train {saved} --out {run} --resume`)")


def _truncate_metrics(path: Path, step: int) -> None:
    """Keep the metrics of steps <= ``step`` (lines written after the checkpoint are redone)."""
    keep = []
    if path.exists():
        with open_regular(path) as fh:  # streamed, a line at a time: a planted huge file is never read whole
            while raw := fh.readline(1 << 20):
                if not raw.endswith(b"\n") and len(raw) == 1 << 20:  # a line over 1 MiB is no record: skip it
                    while (more := fh.readline(1 << 20)) and not more.endswith(b"\n"):
                        pass
                    continue
                try:
                    rec = load_json(raw)
                except ValueError:  # a half-written last line after a crash
                    continue
                if isinstance(rec, dict) and isinstance(rec.get("step", 0), int) and rec.get("step", 0) <= step:
                    keep.append(json.dumps(rec))
    atomic_write_text(path, "".join(x + "\n" for x in keep))


def train(cfg: TrainConfig, out_dir: str | Path, *, attention: SchemeRecipe | None = None,
          resume: bool = False, quiet: bool = False, force_new: bool = False, shard: str = "ddp") -> dict[str, Any]:
    """Train ``cfg`` into ``out_dir`` (see :mod:`pedsl.train` for the files); returns DONE.json.

    The run folder is locked while training (a second ``train`` into it is refused); ``force_new``
    discards the run already in ``out_dir`` (its checkpoints, metrics and results) and starts over.
    ``shard``: how several processes (under torchrun) split the work, ``ddp`` or ``fsdp``
    (:mod:`pedsl.train.distributed`); not part of the run (either resumes the other's checkpoints)."""
    d = distributed.setup(cfg.device, shard)
    finished = False
    try:
        with contextlib.ExitStack() as held:
            done = _train(cfg, Path(out_dir), d, attention, resume, quiet, held, force_new)
        finished = True
        return done
    finally:
        distributed.teardown(d, finished)


def _resume(run: Path, model: torch.nn.Module, optim: torch.optim.Optimizer, attn: SchemeRecipe,
            cfg: TrainConfig, say, main: bool = True) -> dict:
    """Restore the newest checkpoint that reads back whole and restores (:func:`ck.restore`) and
    return its state. Newer damaged ones are moved aside by the main process (``step_N.bad``, so
    they no longer count as the newest; never over anything already there) and said so. A
    checkpoint of another scheme, config or model shape is refused, not passed over."""
    ckpts = ck.list_checkpoints(run / "checkpoints")
    if not ckpts:
        ck.latest_checkpoint(run / "checkpoints")  # raises: no checkpoint found
    bad: list[tuple[Path, CheckpointError]] = []
    for path in reversed(ckpts):
        try:
            model_t, optim_t, state = ck.read_checkpoint(path)
        except CheckpointError as err:
            bad.append((path, err))
            continue
        ck.check_hashes(path, state, scheme_hash=attn.source_hash, config_hash=cfg.digest())  # another run's: refused
        try:
            ck.check_shapes(path, state, model)  # the config fixes the shapes: another one is damage
            ck.restore(path, model, optim, model_t, optim_t, state)
        except CheckpointError as err:
            bad.append((path, err))
            continue
        for p, problem in bad if main else ():
            aside = _aside_name(p)
            os.replace(p, aside)
            say(f"warning: checkpoint {p.name} cannot be used ({problem.diagnostics[0].message}); moved it to "
                f"{aside.name} and resuming from {path.name}")
        return state
    raise bad[0][1]


def _aside_name(ckpt: Path) -> Path:
    """``step_N.bad``, or ``step_N.bad.2``, ... when that name is taken (by anything: a folder, a file,
    a link - never followed, never deleted)."""
    for i in range(1, 10_000):
        aside = ckpt.with_name(f"{ckpt.name}.bad" + (f".{i}" if i > 1 else ""))
        if not aside.exists() and not aside.is_symlink():
            return aside
    raise OutputError(f"cannot move the damaged checkpoint {ckpt} aside: {ckpt.name}.bad ... .bad.9999 all exist",
                      hint="delete the old step_N.bad folders")


def _train(cfg: TrainConfig, run: Path, d: distributed.Dist, attn: SchemeRecipe | None,
           resume: bool, quiet: bool, held: contextlib.ExitStack, force_new: bool = False) -> dict[str, Any]:
    t_start, c_start = time.perf_counter(), time.process_time()
    # threads 0: the idle cores split over the ranks (torch's default oversubscribes a shared CPU);
    # flush_denormal (docs/semantics.md §6) is the application's process-wide choice
    threads = setup_torch(cfg.threads, processes=d.world, flush_denormal=cfg.flush_denormal)
    if cfg.batch_size % d.world:
        raise ConfigError(f"batch size {cfg.batch_size} does not split over {d.world} processes",
                          hint=f"use a multiple of {d.world}")
    attn = attn or from_scheme(cfg)
    data = TrainData(cfg.data, cfg.context, cfg.seed)  # bad data fails before the run dir is touched
    _check_axes(scheme_axes(attn.scheme), data, attn.name)
    if d.is_main:
        held.callback(rundir.open_for_training(run, quiet=quiet).release)  # locked until train() returns
        _prepare_run_dir(run, cfg, attn, resume, force_new)
    d.barrier()
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    model = TransformerLM(cfg.model, attn.factory(cfg.model)).to(d.device)
    optim: torch.optim.Optimizer = make_optimizer(model, cfg)
    meta: dict[str, str | list[str]] = {"scheme_name": attn.name, "scheme_hash": attn.source_hash, "config_hash": cfg.digest()}
    parts = attn.layer_parts(cfg.model)
    if parts is not None:  # a layers scheme: which part each layer was built with
        meta["scheme_layers"] = list(parts)
    start = 0
    if resume:
        start = _restore(run, cfg, d, attn, model, optim)
    elif cfg.init_from is not None:  # a fine-tune: the source run's weights, a fresh optimizer, step 0
        load_init(model, cfg, attn.name)
    optim = distributed.shard(model, optim, d, lambda m: make_optimizer(m, cfg))  # FSDP: after loading whole
    val_batches = [data.val_batch(i, cfg.batch_size) for i in range(cfg.eval_batches)]
    sink = live.open_sink(run, start=start, params={"scheme": attn.name, "scheme_hash": attn.source_hash,
                                                    **live.flat({"config": cfg.model_dump(mode="json")})}) \
        if d.is_main else None
    log = _Progress(cfg, run, d, quiet, start, sink)
    log.say(f"pedsl train: scheme {attn.name}, {model.num_params():,} parameters, {data.describe()}, "
            f"{d.world} process(es) on {d.device} ({threads} CPU thread(s) each), steps {start}..{cfg.steps}")
    val_loss, t_train, trained = _loop(cfg, run, d, data, model, optim, meta, val_batches, log, start)
    if val_loss is None:  # resumed a finished run
        val_loss = validate(model, val_batches, d.device, data.positions)
    baseline = data.unigram_baseline()
    result = {
        "steps": cfg.steps,
        "val_loss": val_loss,
        "unigram_baseline": baseline,
        "wall_time_s": time.perf_counter() - t_start,
        "cpu_time_s": time.process_time() - c_start,  # this process's CPU seconds (all threads)
        "tokens_per_s": cfg.batch_size * cfg.context * trained / t_train if trained else None,
        "n_params": model.num_params(),
        "scheme": attn.name,
        "scheme_hash": attn.source_hash,
        "data": data.describe(),
        "world_size": d.world,
        **({"shard": d.shard} if d.enabled else {}),
    }
    if d.is_main:
        atomic_write_text(run / "DONE.json", json.dumps(result, indent=1) + "\n")
        log.say(f"done: val loss {val_loss:.4f} nats/byte"
                + (f" (unigram baseline {baseline:.4f})" if baseline is not None else "") + f" -> {run}")
    return result


def _check_axes(want: int, data: TrainData, name: str) -> None:
    """A scheme of ``want`` > 1 position axes needs data with as many (a one-axis scheme reads any
    data in its token order: a grid in raster order)."""
    if want > 1 and want != data.axes:
        raise ConfigError(f"scheme '{name}' reads {want} position axes, but {data.describe()} gives "
                          f"{data.axes} ({'the token index' if data.axes == 1 else '(h, w) per token'})",
                          hint="train a 2-axis scheme on a grid task (--data grid_image or grid_copy)"
                          if want == 2 else "train it on data with as many position axes")


def _restore(run: Path, cfg: TrainConfig, d: distributed.Dist, attn: SchemeRecipe, model, optim) -> int:
    """Load the newest usable checkpoint into the model and optimizer; the step to continue from."""
    state = _resume(run, model, optim, attn, cfg,
                    lambda m: print(f"pedsl train: {m}", file=sys.stderr, flush=True), main=d.is_main)
    start = int(state["step"])
    if d.is_main:
        _truncate_metrics(run / "metrics.jsonl", start)
        atomic_write_text(run / "config.yaml", cfg.to_yaml())  # resumable fields (steps ...) may change
    d.barrier()
    return start


class _Progress:
    """What a run reports as it goes: messages (through the progress bar when there is one), the
    metrics file and the bar."""

    def __init__(self, cfg: TrainConfig, run: Path, d: distributed.Dist, quiet: bool, start: int,
                 sink: live.Sink | None = None):
        self.d, self.quiet, self.sink, self.finished = d, quiet, sink, False
        self.metrics = open_append(run / "metrics.jsonl") if d.is_main else None
        self.bar = None
        if d.is_main and not quiet and sys.stderr.isatty():
            from tqdm import tqdm  # only for a terminal

            self.bar = tqdm(total=cfg.steps, initial=start, unit="step", dynamic_ncols=True, leave=False)

    def say(self, msg: str) -> None:
        if not self.d.is_main or self.quiet:
            return
        if self.bar is not None:
            self.bar.write(msg, file=sys.stderr)
        else:
            print(msg, file=sys.stderr, flush=True)

    def record(self, rec: dict) -> None:
        if self.metrics is not None:
            self.metrics.write(json.dumps(rec) + "\n")
            self.metrics.flush()
        if self.sink is not None:
            self.sink.step(rec)

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close(self.finished)
        if self.bar is not None:
            self.bar.close()
        if self.metrics is not None:
            self.metrics.close()


def _checkpoint(run: Path, cfg: TrainConfig, d: distributed.Dist, step: int, model, optim, meta: dict) -> None:
    model, optim = distributed.full_state(model, optim, d)  # sharded: gathered on rank 0 (every rank takes part)
    if d.is_main:
        try:
            ck.save_checkpoint(run / "checkpoints", step, model, optim,
                               {**meta, "data": {"next_step": step}}, cfg.keep_checkpoints)
        except OSError as exc:
            leftovers = [p.name for p in temporary_folders(run / "checkpoints")]
            raise OutputError(f"cannot write the checkpoint of step {step} in '{run / 'checkpoints'}': "
                              f"{exc.strerror or exc}",
                              hint="free disk space or choose another --out"
                              + (f"; temporary folders of interrupted checkpoint writes can be deleted: "
                                 f"{', '.join(leftovers)}" if leftovers else "")) from None
    d.barrier()


def _step(cfg: TrainConfig, run: Path, d: distributed.Dist, data: TrainData, ddp, model, optim,
          step: int) -> tuple[float, float, float]:
    """One optimisation step; (loss, gradient norm, learning rate). Stops before updating the weights
    when the loss or the gradient is not finite."""
    lr = lr_at(step, cfg)
    for group in optim.param_groups:
        group["lr"] = lr
    batch, answers = data.train_rows(step, cfg.batch_size, d.rank, d.world)
    loss = _loss(ddp, batch.to(d.device), answers.to(d.device), cfg.data.answer_weight,  # this rank's rows
                 _on(data.positions(batch.shape[0]), d.device))
    loss_value = float(d.mean(loss.detach()))
    if not math.isfinite(loss_value):
        last = ck.list_checkpoints(run / "checkpoints")
        raise TrainError(
            f"the training loss became {loss_value} at step {step + 1}; stopped before updating "
            f"the weights. Last good checkpoint: {last[-1] if last else 'none yet'}",
            hint="lower --lr, raise warmup, or check the scheme's numerics (pedsl check)")
    optim.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = distributed.to_float(torch.nn.utils.clip_grad_norm_(
        model.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else math.inf))
    if not math.isfinite(grad_norm):  # a finite loss with a non-finite gradient
        last = ck.list_checkpoints(run / "checkpoints")
        raise TrainError(
            f"the gradient norm became {grad_norm} at step {step + 1} (loss {loss_value:.4f}); stopped "
            f"before updating the weights. Last good checkpoint: {last[-1] if last else 'none yet'}",
            hint="lower --lr, or check the scheme's backward numerics (pedsl check)")
    optim.step()
    return loss_value, grad_norm, lr


def _loop(cfg: TrainConfig, run: Path, d: distributed.Dist, data: TrainData, model, optim, meta: dict,
          val_batches, log: _Progress, start: int):
    """Steps start..cfg.steps with validation, metrics and checkpoints; (last val loss, seconds spent
    in steps, steps taken)."""
    ddp = distributed.wrap(model, d)
    tokens_per_step = cfg.batch_size * cfg.context
    val_loss = None
    t_log, steps_since = time.perf_counter(), 0
    t_train, trained = 0.0, 0
    model.train()
    try:
        for step in range(start, cfg.steps):
            t0 = time.perf_counter()
            loss_value, grad_norm, lr = _step(cfg, run, d, data, ddp, model, optim, step)
            done = step + 1
            t_train += time.perf_counter() - t0
            trained += 1
            steps_since += 1
            evaluate = done % cfg.eval_every == 0 or done == cfg.steps
            if evaluate:
                val_loss = validate(model, val_batches, d.device, data.positions)
            if done % cfg.log_every == 0 or evaluate:
                now = time.perf_counter()
                rec = {"step": done, "loss": loss_value, "lr": lr, "grad_norm": grad_norm,
                       "tokens_per_s": tokens_per_step * steps_since / max(now - t_log, 1e-9)}
                if evaluate and val_loss is not None:  # evaluate: val_loss was just measured
                    rec["val_loss"] = val_loss
                t_log, steps_since = now, 0
                log.record(rec)
                if evaluate:
                    log.say(f"step {done}/{cfg.steps}  loss {loss_value:.4f}  val {val_loss:.4f}  "
                            f"{rec['tokens_per_s']:.0f} tok/s")
            if log.bar is not None:
                log.bar.update(1)
                log.bar.set_postfix(loss=f"{loss_value:.3f}",
                                    tok_s=f"{tokens_per_step / max(time.perf_counter() - t0, 1e-9):.0f}")
            if done % cfg.checkpoint_every == 0 or done == cfg.steps:
                _checkpoint(run, cfg, d, done, model, optim, meta)
        log.finished = True
    finally:
        log.close()
    return val_loss, t_train, trained


def _loss(model: torch.nn.Module, batch: torch.Tensor, answers: torch.Tensor | None = None,
          answer_weight: float = 0.0, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Next-byte loss through the (possibly DDP-wrapped) model's forward, so DDP syncs gradients:
    the mean over every byte, plus ``answer_weight`` times the mean over the bytes ``answers``
    marks (batch-shaped bool; the answers of retrieval-task rows; nothing when none is marked).
    ``positions``: the batch's, ``(..., B, L + 1)`` (the grid tasks' (h, w)), or None."""
    x = batch[:, :-1]
    logits = model(x) if positions is None else model(x, positions[..., :-1])  # (B, L, V)
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)).float(),
                                            batch[:, 1:].reshape(-1), reduction="none")
    loss = nll.mean()
    if answer_weight and answers is not None:
        marked = answers[:, 1:].reshape(-1).to(nll.dtype)                  # the byte each logit predicts
        loss = loss + answer_weight * (nll * marked).sum() / marked.sum().clamp(min=1.0)
    return loss

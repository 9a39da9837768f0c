"""Live experiment tracking of training runs (``pedsl compare --track tensorboard|mlflow``).

A study sets where its runs report (:func:`use`, a :class:`Spec`; the executors hand it to every
worker process, Ray task or Slurm job); while a run trains, its main process writes each logged step
(loss, validation loss, learning rate, gradient norm, throughput) as it is logged, so a tracker shows
the curves of runs still training:

- tensorboard: event files in ``RUN/tensorboard`` (flushed at every logged step; a resumed run purges
  the steps after its checkpoint, so no step is shown twice);
- mlflow: a child run of the study's parent run (``mlflow.parentRunId``), found again by its tag
  ``pedsl.run`` (the run folder) when the run resumes or the study is run again; its parameters are
  the scheme, its hash and the flattened configuration.

A tracker that fails (a store that cannot be reached, a locked database) is said once and then left
alone: the run trains on and its files are written as always. The libraries are optional extras,
imported only when a run is tracked.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # optional dependencies, imported only when a run is tracked
    from mlflow.tracking import MlflowClient
    from torch.utils.tensorboard import SummaryWriter

EVENTS = "tensorboard"  # the event folder inside a run folder
STEP_KEYS = ("loss", "val_loss", "lr", "grad_norm", "tokens_per_s")  # metrics.jsonl -> train/<key>
Say = Callable[[str], None]


@dataclass(frozen=True)
class Spec:
    """Where runs report: ``kind`` tensorboard or mlflow; for mlflow the store (``uri``), the
    experiment id, the study's parent run id and the commit (a parameter of every child)."""

    kind: str
    uri: str | None = None
    experiment: str | None = None
    parent: str | None = None
    commit: str | None = None


_current: Spec | None = None


def use(spec: Spec | None) -> None:
    """Track the runs this process trains from now on (None: stop)."""
    global _current
    _current = spec


def current() -> Spec | None:
    return _current


def flat(tree: dict, prefix: str = "") -> dict[str, str]:
    """A nested configuration as ``{"model.d_model": "32", ...}`` (values as text)."""
    out: dict[str, str] = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = json.dumps(v) if not isinstance(v, str) else v
    return out


def find_child(client: Any, spec: Spec, run: Path) -> str | None:
    """The id of the mlflow child run of ``run`` (by its tag) under the study's parent, if any."""
    found = client.search_runs([spec.experiment], filter_string=f"tags.`pedsl.run` = '{run.resolve()}'",
                               max_results=50)
    mine = [r for r in found if r.data.tags.get("mlflow.parentRunId") == spec.parent]
    return mine[0].info.run_id if mine else None


def child_run(client: Any, spec: Spec, run: Path, label: str, params: dict[str, str]) -> str:
    """The child run of ``run``: found again, or created with its parameters."""
    from mlflow.entities import Param

    child = find_child(client, spec, run)
    if child is None:
        child = client.create_run(spec.experiment, run_name=label,
                                  tags={"mlflow.parentRunId": spec.parent, "pedsl.run": str(run.resolve())}).info.run_id
        items = [Param(k, str(v)[:6000]) for k, v in {"commit": str(spec.commit), **params}.items()]
        for i in range(0, len(items), 100):  # mlflow's batch limit
            client.log_batch(child, params=items[i:i + 100])
    return child


class Sink:
    """The live record of one run (see the module docstring); every method is safe to call after a
    failure (it then does nothing)."""

    def __init__(self, spec: Spec, run: Path, label: str, params: dict[str, str], start: int, say: Say) -> None:
        self.spec, self.run, self.say = spec, run, say
        self.writer: SummaryWriter | None = None
        self.client: MlflowClient | None = None
        self.child: str | None = None  # the run's MLflow run id
        self.failed = False
        self._guard("open", lambda: self._open(label, params, start))

    def _open(self, label: str, params: dict[str, str], start: int) -> None:
        if self.spec.kind == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            from pedsl.fsio import ensure_dir, refuse_symlink

            refuse_symlink(self.run / EVENTS)
            ensure_dir(self.run / EVENTS)
            self.writer = SummaryWriter(log_dir=str(self.run / EVENTS), purge_step=start + 1 if start else None)
            self.writer.add_text("run", f"{label}: scheme {params.get('scheme')}")
        else:
            from mlflow.tracking import MlflowClient

            self.client = MlflowClient(tracking_uri=self.spec.uri)
            self.child = child_run(self.client, self.spec, self.run, label, params)
            self.client.update_run(self.child, status="RUNNING")

    def _guard(self, what: str, fn: Callable[[], None]) -> None:
        if self.failed:
            return
        try:
            fn()
        except Exception as exc:  # tracking is a view of the run: its failure must not stop training
            self.failed = True
            self.say(f"warning: --track {self.spec.kind} stopped recording {self.run} ({what}: "
                     f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); the run goes on")

    def step(self, rec: dict[str, Any]) -> None:
        """One metrics.jsonl record, as it is logged."""
        values = {f"train/{k}": float(rec[k]) for k in STEP_KEYS if isinstance(rec.get(k), (int, float))}
        self._guard("step", lambda: self._log(values, int(rec["step"])))

    def curves(self, curves: dict[str, dict[int, float]]) -> None:
        """Evaluation curves ``{tag: {length: value}}`` (the x axis: the evaluation length in tokens)."""
        def log() -> None:
            for tag, by in curves.items():
                for length, value in sorted(by.items()):
                    self._log({tag: value}, length)
        self._guard("evaluation", log)

    def _log(self, values: dict[str, float], step: int) -> None:
        if self.writer is not None:
            for tag, v in values.items():
                self.writer.add_scalar(tag, v, step)
            self.writer.flush()  # readable now, while the run trains
        elif self.client is not None and self.child is not None:  # both set by _open
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            self.client.log_batch(self.child, metrics=[Metric(t, v, now, step) for t, v in values.items()])

    def close(self, finished: bool) -> None:
        def end() -> None:
            if self.writer is not None:
                self.writer.close()
            elif self.client is not None and self.child is not None:
                self.client.set_terminated(self.child, status="FINISHED" if finished else "FAILED")
        self._guard("close", end)


def open_sink(run: Path, *, label: str | None = None, params: dict[str, str] | None = None, start: int = 0,
              say: Say | None = None) -> Sink | None:
    """The live record of ``run`` when this process tracks its runs (:func:`use`), else None."""
    if _current is None:
        return None
    run = Path(run)
    parts = run.resolve().parts
    where = len(parts) - 1 - parts[::-1].index("runs") if "runs" in parts[:-1] else None
    label = label or ("/".join(parts[where + 1:]) if where is not None else run.name)  # study/runs/rope/seed1 -> rope/seed1
    return Sink(_current, run, label, params or {}, start,
                say or (lambda m: print(f"pedsl: {m}", file=sys.stderr, flush=True)))


__all__ = ["EVENTS", "STEP_KEYS", "Sink", "Spec", "child_run", "current", "find_child", "flat", "open_sink", "use"]

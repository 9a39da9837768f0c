"""A finished study exported to an experiment tracker (``pedsl compare --track tensorboard|mlflow``).

Read from the study's own files, so every study and every executor is tracked alike, and a study
can be tracked again after the fact (the same command reuses every run):

- every run folder under ``DIR/runs`` with a DONE.json: its per-step metrics (metrics.jsonl: loss,
  learning rate, gradient norm, throughput, validation loss), its evaluation (eval.json: perplexity
  ratio, passkey and block accuracy by length; retrieval.json), its configuration and scheme hash;
- the study: report.md / report.html, its plots (PNG) and the commit of results.json.

tensorboard: event files in ``RUN/tensorboard`` (per run) and ``DIR/tensorboard`` (the plots as
images); a new export replaces pedsl's earlier event files there. mlflow: one parent run for the
study (the report and plots as artifacts) and one child run per run folder, in the store at
``--tracking-uri`` (default: a local store in the study folder, ``DIR/mlflow.db`` with the artifacts in
``DIR/mlartifacts``: a SQLite file, since mlflow 3 refuses new folder stores such as ``./mlruns``).

Both libraries are optional extras (``pip install 'pedsl[tensorboard]'``, ``'pedsl[mlflow]'``).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Callable, Iterator

from pedsl.errors import ConfigError, OutputError
from pedsl.fsio import ensure_dir, read_text, refuse_symlink

TRACKERS = {"tensorboard": ("tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow")}  # name: (module, extra)
EVENTS = "tensorboard"
Say = Callable[[str], None]


def require(tracker: str) -> None:
    """A one-line error naming the extra when the tracker's library is not installed (exit 1)."""
    module, extra = TRACKERS[tracker]
    if importlib.util.find_spec(module) is None:
        raise ConfigError(f"--track {tracker} needs the optional package '{module}', which is not installed",
                          hint=f"pip install 'pedsl[{extra}]'")


def track_study(tracker: str, out: str | Path, *, uri: str | None = None, say: Say = lambda m: None) -> str:
    """Export the study in ``out`` to ``tracker``; returns where it went (a folder or an mlflow run id)."""
    require(tracker)
    out = Path(out)
    runs = list(run_folders(out))
    if tracker == "tensorboard":
        for label, run in runs:
            _tensorboard_run(run, label)
        _tensorboard_study(out)
        say(f"tensorboard: {len(runs)} runs -> tensorboard --logdir {out}")
        return str(out)
    from mlflow.exceptions import MlflowException

    local = uri is None
    uri = uri or f"sqlite:///{(out / 'mlflow.db').resolve()}"
    try:
        parent = _mlflow_study(out, runs, uri, (out / "mlartifacts").resolve().as_uri() if local else None)
    except MlflowException as exc:
        raise OutputError(f"mlflow could not record the study in '{uri}': {str(exc).splitlines()[0]}",
                          hint="check --tracking-uri (e.g. sqlite:///mlflow.db or http://host:5000)") from None
    say(f"mlflow: study run {parent} with {len(runs)} child runs in {uri} (mlflow ui --backend-store-uri {uri})")
    return parent


def run_folders(out: Path) -> Iterator[tuple[str, Path]]:
    """(label, folder) of every finished run of the study: ``rope``, ``rope/seed1`` ..."""
    for done in sorted((out / "runs").rglob("DONE.json")):
        yield done.parent.relative_to(out / "runs").as_posix(), done.parent


def _json(path: Path) -> dict | None:
    try:
        return json.loads(read_text(path)) if path.is_file() else None
    except (OSError, ValueError):
        return None


def step_metrics(run: Path) -> list[dict[str, float]]:
    """metrics.jsonl: one record per logged step."""
    if not (run / "metrics.jsonl").is_file():
        return []
    return [json.loads(line) for line in read_text(run / "metrics.jsonl").splitlines() if line.strip()]


def eval_metrics(run: Path) -> dict[str, dict[int, float]]:
    """The run's evaluation by length: ``{"eval/ppl_ratio": {L: ratio}, "eval/passkey_accuracy": ...}``."""
    out: dict[str, dict[int, float]] = {}
    ev = _json(run / "eval.json") or {}
    for task, field in (("ppl", "ratio"), ("ppl", "ppl"), ("passkey", "accuracy"), ("blocks", "accuracy")):
        for length, rec in (ev.get(task) or {}).items():
            if isinstance(rec, dict) and isinstance(rec.get(field), (int, float)):
                out.setdefault(f"eval/{task}_{field}", {})[int(length)] = float(rec[field])
    rt = _json(run / "retrieval.json") or {}
    for length, rec in (rt.get("overall") or {}).items():
        if isinstance(rec, dict) and isinstance(rec.get("accuracy"), (int, float)):
            out.setdefault("eval/retrieval_accuracy", {})[int(length)] = float(rec["accuracy"])
    return out


def run_params(run: Path, commit: str | None) -> dict[str, str]:
    """Scheme, its hash, the commit and the configuration (flattened: ``model.d_model``)."""
    import yaml

    done = _json(run / "DONE.json") or {}
    cfg = yaml.safe_load(read_text(run / "config.yaml")) if (run / "config.yaml").is_file() else {}
    params = {"scheme": str(done.get("scheme")), "scheme_hash": str(done.get("scheme_hash")), "commit": str(commit)}
    params.update({f"config.{k}": v for k, v in _flat(cfg or {}).items()})
    return params


def _flat(tree: dict, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = json.dumps(v) if not isinstance(v, str) else v
    return out


def plots(out: Path) -> list[Path]:
    """The study's plots as PNG files."""
    return sorted(p for p in out.glob("*.png") if p.is_file())


def _fresh_events(folder: Path) -> Path:
    """``folder`` for new event files, without pedsl's earlier ones (never a symbolic link)."""
    refuse_symlink(folder)
    ensure_dir(folder)
    for old in folder.glob("events.out.tfevents.*"):
        if old.is_symlink() or not old.is_file():
            raise OutputError(f"'{old}' is not a regular file", file=str(old), hint="remove it")
        old.unlink()
    return folder


def _tensorboard_run(run: Path, label: str) -> None:
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(log_dir=str(_fresh_events(run / EVENTS))) as w:
        for rec in step_metrics(run):
            for key in ("loss", "val_loss", "lr", "grad_norm", "tokens_per_s"):
                if isinstance(rec.get(key), (int, float)):
                    w.add_scalar(f"train/{key}", rec[key], rec["step"])
        for tag, by_length in eval_metrics(run).items():  # x axis: the evaluation length in tokens
            for length, value in sorted(by_length.items()):
                w.add_scalar(tag, value, length)
        w.add_text("run", f"{label}: scheme {run_params(run, None)['scheme']}")


def _tensorboard_study(out: Path) -> None:
    from matplotlib.image import imread
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(log_dir=str(_fresh_events(out / EVENTS))) as w:
        for png in plots(out):
            w.add_image(f"report/{png.stem}", imread(str(png))[..., :3], 0, dataformats="HWC")
        if (out / "report.md").is_file():
            w.add_text("report", read_text(out / "report.md"))


def _mlflow_study(out: Path, runs: list[tuple[str, Path]], uri: str, artifacts: str | None) -> str:
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    name = f"pedsl:{out.resolve()}"
    exp = client.get_experiment_by_name(name)
    exp_id = exp.experiment_id if exp else client.create_experiment(name, artifact_location=artifacts)
    meta = (_json(out / "results.json") or {}).get("meta", {})
    parent = client.create_run(exp_id, run_name=out.name, tags={"pedsl.study": str(out.resolve())}).info.run_id
    client.log_batch(parent, params=[Param(k, str(v)[:6000]) for k, v in
                                     {"command": meta.get("command"), "commit": meta.get("git"),
                                      "study": meta.get("study", "default")}.items()])
    for label, run in runs:
        child = client.create_run(exp_id, run_name=label, tags={"mlflow.parentRunId": parent,
                                                                "pedsl.run": str(run.resolve())}).info.run_id
        params = [Param(k, v[:6000]) for k, v in run_params(run, meta.get("git")).items()]
        metrics = [Metric(f"train/{k}", float(rec[k]), 0, int(rec["step"])) for rec in step_metrics(run)
                   for k in ("loss", "val_loss", "lr", "grad_norm", "tokens_per_s") if isinstance(rec.get(k), (int, float))]
        metrics += [Metric(tag, v, 0, length) for tag, by in eval_metrics(run).items() for length, v in by.items()]
        for i in range(0, max(len(params), len(metrics), 1), 100):  # mlflow's batch limits
            client.log_batch(child, params=params[i:i + 100], metrics=metrics[i:i + 100])
        client.set_terminated(child)
    for f in [out / "report.md", out / "report.html", out / "results.json", *plots(out)]:
        if f.is_file():
            client.log_artifact(parent, str(f))
    client.set_terminated(parent)
    return parent


__all__ = ["TRACKERS", "eval_metrics", "require", "run_folders", "run_params", "step_metrics", "track_study"]

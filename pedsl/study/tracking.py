"""A study tracked in an experiment tracker (``pedsl compare --track tensorboard|mlflow``).

Live, while the study runs: :func:`start_study` opens the study's record (mlflow: its parent run,
found again when the same study is run again) and returns the :class:`pedsl.train.live.Spec` every
run reports to as it trains (:mod:`pedsl.train.live`: losses, learning rate, gradient norm and
throughput at every logged step); :func:`track_evaluation` adds a run's evaluation when the study
measures it (perplexity ratio, passkey and block accuracy by length; retrieval accuracy).

At the end, :func:`track_study` completes the record from the study's own files, so every study and
every executor is tracked alike, and a study can be tracked after the fact (the same command reuses
every run): a run trained without tracking gets its per-step metrics from metrics.jsonl, every run
its evaluation, and the study its report (report.md / report.html), plots (PNG) and results.json.

tensorboard: event files in ``RUN/tensorboard`` (per run; the evaluation in its own ``*.eval`` file,
replaced when written again) and ``DIR/tensorboard`` (the plots as images). mlflow: one parent run
for the study (the report and plots as artifacts) and one child run per run folder, in the store at
``--tracking-uri`` (default: a local store in the study folder, ``DIR/mlflow.db`` with the artifacts in
``DIR/mlartifacts``: a SQLite file, since mlflow 3 refuses new folder stores such as ``./mlruns``).

Both libraries are optional extras (``pip install 'pedsl[tensorboard]'``, ``'pedsl[mlflow]'``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Callable, Iterator

from pedsl.errors import ConfigError, OutputError
from pedsl.fsio import ensure_dir, read_text, refuse_symlink
from pedsl.study.common import git_commit
from pedsl.study.stores import check_store, is_local_database
from pedsl.train import live
from pedsl.train.live import EVENTS

TRACKERS = {"tensorboard": ("tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow")}  # name: (module, extra)
EVAL_SUFFIX = ".eval"  # the event file of a run's evaluation (replaced when written again)
TRAIN_SUFFIX = ".train"  # the event file of a run's steps exported from metrics.jsonl
Say = Callable[[str], None]


def require(tracker: str) -> None:
    """A one-line error naming the extra when the tracker's library is not installed (exit 1)."""
    module, extra = TRACKERS[tracker]
    if importlib.util.find_spec(module) is None:
        raise ConfigError(f"--track {tracker} needs the optional package '{module}', which is not installed",
                          hint=f"pip install 'pedsl[{extra}]'")


def start_study(tracker: str, out: str | Path, *, uri: str | None = None) -> live.Spec:
    """Open the study's record and return where its runs report (see the module docstring)."""
    require(tracker)
    out = Path(out)
    if tracker == "tensorboard":
        return live.Spec("tensorboard")
    from mlflow.exceptions import MlflowException

    store = check_store(uri) if uri is not None else _local_store(out)
    # a database store's artifacts default to ./mlruns of the current folder: they go in the study's
    artifacts = (ensure_dir(out) / "mlartifacts").resolve().as_uri() if is_local_database(store) else None
    refusals: tuple[type[Exception], ...] = (MlflowException, OSError, *_db_errors())
    try:
        return _mlflow_parent(out, store, artifacts)
    except refusals as exc:
        raise _store_error(store, exc) from None


def _db_errors() -> tuple[type[Exception], ...]:
    """SQLAlchemy's errors (mlflow's database stores raise them as they are: a DatabaseError on a file
    that is not a database)."""
    try:
        from sqlalchemy.exc import SQLAlchemyError
    except ImportError:
        return ()
    return (SQLAlchemyError,)


def _local_store(out: Path) -> str:
    ensure_dir(out)
    return f"sqlite:///{(out / 'mlflow.db').resolve()}"


def _store_error(uri: str, exc: Exception) -> OutputError:
    return OutputError(f"mlflow could not record the study in '{uri}': {(str(exc).strip() or type(exc).__name__).splitlines()[0]}",
                       hint="check --tracking-uri (e.g. sqlite:///mlflow.db or http://host:5000)")


def track_study(tracker: str, out: str | Path, *, uri: str | None = None, say: Say = lambda m: None,
                spec: live.Spec | None = None) -> str:
    """Complete the study's record in ``tracker`` (opened by :func:`start_study`, or now when ``spec``
    is None); returns where it went (a folder or the mlflow parent run id)."""
    out = Path(out)
    spec = spec or start_study(tracker, out, uri=uri)
    runs = list(run_folders(out))
    if tracker == "tensorboard":
        for label, run in runs:
            if not _train_events(run):
                _tensorboard_run(run, label)
            track_evaluation(run, spec)
        _tensorboard_study(out)
        say(f"tensorboard: {len(runs)} runs -> tensorboard --logdir {out}")
        return str(out)
    from mlflow.exceptions import MlflowException

    try:
        _mlflow_study(out, runs, spec)
    except MlflowException as exc:
        raise _store_error(str(spec.uri), exc) from None
    say(f"mlflow: study run {spec.parent} with {len(runs)} child runs in {spec.uri} "
        f"(mlflow ui --backend-store-uri {spec.uri})")
    return str(spec.parent)


def track_evaluation(run: Path, spec: live.Spec | None = None) -> None:
    """Record the evaluation of ``run`` (eval.json, retrieval.json) in the tracker the runs report to
    (``spec``, default: this process's): tensorboard replaces the run's ``*.eval`` event file, mlflow
    logs the curves to the run's child unless it holds these very values already."""
    spec = spec or live.current()
    curves = eval_metrics(run)
    if spec is None or not curves:
        return
    if spec.kind == "tensorboard":
        from torch.utils.tensorboard import SummaryWriter

        with SummaryWriter(log_dir=str(_fresh_events(run / EVENTS, EVAL_SUFFIX)), filename_suffix=EVAL_SUFFIX) as w:
            for tag, by_length in curves.items():  # x axis: the evaluation length in tokens
                for length, value in sorted(by_length.items()):
                    w.add_scalar(tag, value, length)
        return
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=spec.uri)
    child = live.find_child(client, spec, run)
    key = hashlib.sha256(json.dumps(curves, sort_keys=True).encode()).hexdigest()[:16]
    if child is None or client.get_run(child).data.tags.get("pedsl.eval") == key:
        return
    metrics = [Metric(tag, v, 0, length) for tag, by in curves.items() for length, v in by.items()]
    for i in range(0, len(metrics), 100):  # mlflow's batch limit
        client.log_batch(child, metrics=metrics[i:i + 100])
    client.set_tag(child, "pedsl.eval", key)


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
    params.update(live.flat(cfg or {}, "config."))
    return params


def plots(out: Path) -> list[Path]:
    """The study's plots as PNG files."""
    return sorted(p for p in out.glob("*.png") if p.is_file())


def _fresh_events(folder: Path, suffix: str) -> Path:
    """``folder`` for a new event file, without pedsl's earlier ones ending in ``suffix`` (never a
    symbolic link)."""
    refuse_symlink(folder)
    ensure_dir(folder)
    for old in folder.glob("events.out.tfevents.*"):
        if not old.name.endswith(suffix):
            continue
        if old.is_symlink() or not old.is_file():
            raise OutputError(f"'{old}' is not a regular file", file=str(old), hint="remove it")
        old.unlink()
    return folder


def _train_events(run: Path) -> list[Path]:
    """The run's event files of its training (live or exported), not of its evaluation."""
    return [p for p in (run / EVENTS).glob("events.out.tfevents.*") if not p.name.endswith(EVAL_SUFFIX)]


def _tensorboard_run(run: Path, label: str) -> None:
    """A run trained without tracking: its per-step metrics from metrics.jsonl."""
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(log_dir=str(_fresh_events(run / EVENTS, TRAIN_SUFFIX)), filename_suffix=TRAIN_SUFFIX) as w:
        for rec in step_metrics(run):
            for key in live.STEP_KEYS:
                if isinstance(rec.get(key), (int, float)):
                    w.add_scalar(f"train/{key}", rec[key], rec["step"])
        w.add_text("run", f"{label}: scheme {run_params(run, None)['scheme']}")


def _tensorboard_study(out: Path) -> None:
    from matplotlib.image import imread
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(log_dir=str(_fresh_events(out / EVENTS, ""))) as w:
        for png in plots(out):
            w.add_image(f"report/{png.stem}", imread(str(png))[..., :3], 0, dataformats="HWC")
        if (out / "report.md").is_file():
            w.add_text("report", read_text(out / "report.md"))


def _mlflow_parent(out: Path, uri: str, artifacts: str | None) -> live.Spec:
    """The study's parent run (the one of an earlier start of this study, or a new one), RUNNING."""
    from mlflow.entities import Param
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    name = f"pedsl:{out.resolve()}"
    exp = client.get_experiment_by_name(name)
    exp_id = exp.experiment_id if exp else client.create_experiment(name, artifact_location=artifacts)
    found = client.search_runs([exp_id], filter_string=f"tags.`pedsl.study` = '{out.resolve()}'",
                               order_by=["attributes.start_time DESC"], max_results=1)
    # a study tracked after the fact: the commit it ran from; one starting now: this checkout's
    commit = (_json(out / "results.json") or {}).get("meta", {}).get("git") or git_commit()
    if found:
        parent = found[0].info.run_id
        client.update_run(parent, status="RUNNING")
    else:
        parent = client.create_run(exp_id, run_name=out.name, tags={"pedsl.study": str(out.resolve())}).info.run_id
        client.log_batch(parent, params=[Param("commit", str(commit))])
    return live.Spec("mlflow", uri=uri, experiment=exp_id, parent=parent, commit=commit)


def _mlflow_study(out: Path, runs: list[tuple[str, Path]], spec: live.Spec) -> None:
    """Complete the study's mlflow record: a child for every run trained without tracking, every run's
    evaluation, the report and plots on the parent."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    parent = spec.parent
    assert parent is not None  # the mlflow Spec of a study (start_study) names its parent run
    client = MlflowClient(tracking_uri=spec.uri)
    meta = (_json(out / "results.json") or {}).get("meta", {})
    client.set_tag(parent, "pedsl.command", str(meta.get("command"))[:5000])
    client.set_tag(parent, "pedsl.kind", str(meta.get("study", "default")))
    for label, run in runs:
        if live.find_child(client, spec, run) is None:  # trained before the study was tracked
            child = live.child_run(client, spec, run, label, run_params(run, meta.get("git") or spec.commit))
            metrics = [Metric(f"train/{k}", float(rec[k]), 0, int(rec["step"])) for rec in step_metrics(run)
                       for k in live.STEP_KEYS if isinstance(rec.get(k), (int, float))]
            for i in range(0, len(metrics), 100):  # mlflow's batch limit
                client.log_batch(child, metrics=metrics[i:i + 100])
            client.set_terminated(child)
        track_evaluation(run, spec)
    for f in [out / "report.md", out / "report.html", out / "results.json", *plots(out)]:
        if f.is_file():
            client.log_artifact(parent, str(f))
    client.set_terminated(parent)


__all__ = ["TRACKERS", "eval_metrics", "require", "run_folders", "run_params", "start_study", "step_metrics",
           "track_evaluation", "track_study"]

"""The loop every study shares: reuse the run or train it, then evaluate, score and analyze it.

A study names its schemes (:func:`resolve_schemes`), opens its folder (:func:`study_dir`) and, for
every run, calls :func:`train_scheme` (or :func:`train_or_reuse` for a config it built itself) and
then :func:`measure` with the study's :class:`Measures`. Each step writes its JSON next to the run
(RUN/eval.json, RUN/retrieval.json, RUN/analysis.json) and is skipped when that file was written
for the same weights (step and scheme hash) and the same settings (:func:`reusable`), so rerunning
an interrupted study continues it. ``pedsl compare`` (one seed), ``--seeds``, the retrieval,
extension and frequency studies all train through here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, TypeGuard

import torch

from pedsl.config import TrainConfig
from pedsl.errors import ConfigError, OutputError, PedslError
from pedsl.fsio import check_path
from pedsl.lang.library import looks_like_path, scheme_file
from pedsl.scheme_config import train_config
from pedsl.study.analyze import analyze_run
from pedsl.study.common import make_dir, open_run, read_json
from pedsl.study.eval_run import EVAL_VERSION, evaluate_run
from pedsl.study.measures import Measures
from pedsl.study.progress import STUDY_WEIGHTS, Eta
from pedsl.study.retrieval.score import VERSION as RETRIEVAL_VERSION
from pedsl.study.retrieval.score import retrieval_run
from pedsl.study.tracking import track_evaluation
from pedsl.train import checkpoint as ck
from pedsl.train import live, rundir, train
from pedsl.train.recipe import from_scheme, load_scheme
from pedsl.train.schemefiles import attention_files

Say = Callable[[str], None]


def resolve_schemes(names: list[str], default: tuple[str, ...] = ()) -> list[tuple[str, Path]]:
    """Scheme names (from the library) or .pe paths (``default`` when none) -> [(run name, path)]."""
    out: list[tuple[str, Path]] = []
    for item in list(names) or list(default):
        p = scheme_file(item)  # a path as given, or the library's <item>.pe (did-you-mean otherwise)
        if not p.is_file():
            raise ConfigError(f"scheme file '{item}' does not exist", file=item)
        out.append((p.stem if looks_like_path(item) else item, p))
    names_seen: set[str] = set()
    for name, _ in out:
        if name in names_seen:
            raise ConfigError(f"scheme '{name}' is named twice", hint="compare each scheme once")
        names_seen.add(name)
    return out


def study_dir(out: str | Path) -> Path:
    """The study directory with its runs/ folder created (OutputError when that fails, or when
    ``out`` is a non-empty folder that is not a study: never overwrite)."""
    out = Path(out)
    check_path(out)
    if out.is_dir() and not (out / "runs").is_dir() and any(out.iterdir()):
        shown = ", ".join(sorted(p.name for p in out.iterdir())[:5])
        raise OutputError(f"'{out}' is not empty and is not a pedsl compare study (it holds {shown})",
                          file=str(out), hint="choose a new or empty --out")
    make_dir(out / "runs")
    return out


def given(sets: dict | None = None, /, **settings: Any) -> dict[str, Any]:
    """The settings that were given (None: not given, the preset or the study decides), then the
    ``--set`` values (a ``--set`` of a setting an option also gives is refused by the CLI unless equal)."""
    return {**{k: v for k, v in settings.items() if v is not None}, **(sets or {})}


def train_scheme(name: str, path: Path, run: Path, overrides: dict, say: Say, quiet: bool) -> dict:
    """Train (or reuse / resume) the scheme file ``path`` into ``run``; returns its DONE.json."""
    scheme = load_scheme(path)
    return train_or_reuse(name, train_config(scheme, path, overrides=overrides), scheme, run, say, quiet)


def train_or_reuse(name: str, cfg: TrainConfig, scheme, run: Path, say: Say, quiet: bool) -> dict:
    """Train ``cfg`` into ``run``, resume it, or reuse it when finished with the same settings."""
    if not cfg.threads:  # keep the study's thread count (set once, from the load before anything ran)
        cfg = cfg.model_copy(update={"threads": torch.get_num_threads()})
    done = read_json(run / "DONE.json")
    saved = None
    if (run / "config.yaml").exists():
        try:
            saved = TrainConfig.from_yaml(run / "config.yaml")
        except PedslError:
            saved = None
    same = saved is not None and saved.digest() == cfg.digest()
    attention = from_scheme(cfg, scheme)  # its hash covers every file of the resolved scheme
    has_ckpt = bool(ck.list_checkpoints(run / "checkpoints"))
    if same and (done or has_ckpt):  # an import that changed since: say which file, never reuse
        try:
            rundir.verify_scheme(run, attention_files(attention), what="reuse")
        except PedslError as err:
            raise OutputError(err.diagnostics[0].message,
                              hint=f"use another --out for the changed scheme, or delete '{run}' to retrain it") from None
    same = same and rundir.recorded_hash(run) == attention.source_hash
    if done and same and done.get("steps") == cfg.steps:
        say(f"{name}: reusing the finished run {run}")
        return done
    if run.exists() and any(run.iterdir()) and not same and (has_ckpt or done):
        raise OutputError(f"'{run}' holds a run of '{name}' with other settings (scheme, preset, seed or data)",
                          hint="use another --out for a different study, or delete that run directory")
    if done and same and done.get("steps") != cfg.steps:
        raise OutputError(f"'{run}' was trained for {done.get('steps')} steps, this study asks for {cfg.steps}",
                          hint="use another --out (the learning-rate schedule depends on the step budget)")
    resume = same and has_ckpt
    say(f"{name}: {'resuming' if resume else 'training'} {cfg.steps} steps "
        f"(preset {cfg.preset}, context {cfg.context}, seed {cfg.seed}) -> {run}")
    return train(cfg, run, attention=attention, resume=resume, quiet=quiet)


def reusable(old: dict | None, done: dict, **settings: Any) -> TypeGuard[dict]:
    """Whether a saved result ``old`` was measured on the weights of ``done`` (step and scheme hash)
    with the same ``settings`` (compared with ``old["settings"]``)."""
    if not old or old.get("step") != done.get("steps") or old.get("scheme_hash") != done.get("scheme_hash"):
        return False
    s = old.get("settings", {})
    return all(s.get(k) == v for k, v in settings.items())


def progress_bar(measures: Measures, runs: int, say: Say, label: str) -> Eta:
    """The time-left estimate of a study of ``runs`` runs."""
    return Eta({p: STUDY_WEIGHTS[p] * runs for p in measures.parts()}, say, label)


def measure(run: Path, done: dict, m: Measures, label: str, eta: Eta, say: Say) -> dict:
    """Evaluate, score retrieval (when the study does) and analyze the trained ``run``, each step
    reused when its JSON matches; returns ``{"eval", "retrieval", "analysis", "config"}`` (config: the
    run's TrainConfig)."""
    cfg = TrainConfig.from_yaml(run / "config.yaml")
    context = cfg.context
    lens, alens = m.eval_lengths(context), m.analysis_lengths(context)
    opened: list = []

    def loaded():
        if not opened:
            opened.append(open_run(run))
        return opened[0]

    def step(kind: str, saved: dict | None, fits: bool, compute: Callable[[], dict], doing: str) -> dict:
        if fits and saved is not None:  # fits only when saved is a result
            say(f"{label}: reusing {kind}.json")
            eta.skip(STUDY_WEIGHTS[kind], kind=kind)
            return saved
        say(f"{label}: {doing}")
        res = compute()
        eta.done(STUDY_WEIGHTS[kind], f"{kind} of {label}", kind=kind)
        return res

    ev = read_json(run / "eval.json")
    ev = step("eval", ev, reusable(ev, done, version=EVAL_VERSION, lengths=lens, windows=m.windows,
                                   tasks=list(m.tasks)),
              lambda: evaluate_run(run, lengths=lens, tasks=list(m.tasks), windows=m.windows, say=say,
                                   loaded=loaded()), f"evaluating at lengths {lens}")
    rt = None
    if m.retrieval:
        ret = m.retrieval
        rlens = m.retrieval_lengths(context)
        rt = read_json(run / "retrieval.json")
        rt = step("retrieval", rt, reusable(rt, done, version=RETRIEVAL_VERSION, lengths=rlens,
                                            depths=ret["depths"], samples=ret["samples"]),
                  lambda: retrieval_run(run, rlens, depths=ret["depths"], samples=ret["samples"], say=say,
                                        loaded=loaded()), f"scoring retrieval at lengths {rlens}")
    an = read_json(run / "analysis.json")
    fits = an is not None and bool(an) and an.get("step") == done.get("steps") and an.get("scheme_hash") == done.get("scheme_hash") \
        and an.get("lengths") == alens
    an = step("analysis", an, fits, lambda: analyze_run(run, lengths=alens, say=say, loaded=loaded()),
              f"analyzing at lengths {alens}")
    if live.current() is not None:  # the study is tracked: its evaluation now, as measured
        track_evaluation(run)
    return {"eval": ev, "retrieval": rt, "analysis": an, "config": cfg}


def train_and_measure(name: str, path: Path, run: Path, overrides: dict, m: Measures, *, label: str, eta: Eta,
                      say: Say, quiet: bool) -> dict:
    """One run of a study: trained (or reused), then measured; ``{"train", "eval", "retrieval", "analysis",
    "config"}``."""
    reused = (run / "DONE.json").exists()  # then train_scheme reuses it or refuses (other settings)
    done = train_scheme(name, path, run, overrides, say, quiet)
    if reused:
        eta.skip(STUDY_WEIGHTS["train"], kind="train")
    else:
        eta.done(STUDY_WEIGHTS["train"], f"trained {label}", kind="train")
    return {"train": done, **measure(run, done, m, label, eta, say)}


__all__ = ["given", "measure", "progress_bar", "resolve_schemes", "reusable", "study_dir",
           "train_and_measure", "train_or_reuse", "train_scheme"]

"""Every option of every command either changes what is computed or written, or is refused (exit 2,
naming it) - in every study mode of ``compare``; options that only change presentation are listed
once, with the reason. The commands and their options come from walking ``pedsl.cli``'s click
tree, so an option added without an entry here fails ``test_every_option_is_classified``, and an
entry claiming that an option acts fails ``test_option_acts`` when its two values give the same run.

"Acts" is checked on the real command: it runs twice with the first value (the two outcomes must be
equal, so the comparison is not fooled by clocks or temporary names) and once with the second (its
outcome must differ). An outcome is the exit code, stdout, stderr, every file written, and the
arguments of the calls that do the work - training (``pedsl.train.loop.train``), evaluation,
analysis, the retrieval and frequency measures, the extension study's evaluations. A run stops at
the first such call (``STOPS``) instead of doing the work: those arguments are what the work would
compute. Runs a study must have trained first are trained once per module (tiny models, 1 step)
and copied into each probe.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path
from typing import Any

import click
import pytest

from compiler_helpers import patch_save_figure

ROOT_TOKEN = "<ROOT>"

# Options that cannot change what is computed or written (listed once, for every command).
PRESENTATION = {
    "--help": "prints the command's help and exits before anything runs",
    "--version": "prints pedsl's version and exits before anything runs",
    "--quiet": "hides progress messages; the same work runs and the same files and results are written",
    "--threads": "torch's CPU thread count: how fast the same work runs, not what it computes "
                 "(the study also records it in run metadata; it is not part of any result)",
    "--jobs": "compare (every study) and profile --compare: how many runs train side by side (worker processes); "
              "the same runs, results and report (bit for bit with --threads pinned: test_study_jobs, "
              "test_study_jobs_studies); profile refuses it without --compare",
    "--executor": "compare (every study) and profile --compare: where the same runs train (this machine's workers, "
                  "Ray, Slurm); the same results (test_study_cluster)",
}

# Options whose effect is files this sweep cannot compare (stamped with the wall-clock time), each with
# the test that reads what they write back.
TESTED_ELSEWHERE = {
    "--track": "compare: records the study live in tensorboard event files or an mlflow store, both stamped "
               "with wall-clock times (two equal runs write different bytes); test_study_tracking reads them back "
               "with EventAccumulator and MlflowClient (a run still training included), test_study_jobs through "
               "the command",
}

# Options that change nothing by design, listed once with the reason.
ACCEPTED = {
    "--stdio": "pedsl lsp: names the server's only transport; editors' LSP clients pass it (vscode-languageclient "
               "appends --stdio), so refusing it would break them",
}


@dataclasses.dataclass(frozen=True)
class Acts:
    """Appending ``a`` or ``b`` to the mode's arguments (or ``base``) gives different outcomes.
    ``run``: kinds of work calls that really run instead of stopping (e.g. training, to reach the
    evaluation an option sets)."""

    a: tuple[str, ...]
    b: tuple[str, ...]
    run: tuple[str, ...] = ()
    base: tuple[str, ...] | None = None
    fresh: bool = False  # compare: start from an empty study (the option sets training: both sides train)
    fails: str = ""  # the sides ("a", "b") whose outcome is a reported error (the option turns it into a run)


@dataclasses.dataclass(frozen=True)
class Refused:
    """Appending ``args`` to the mode's arguments (or ``base``) is a usage error naming the option."""

    args: tuple[str, ...]
    base: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Selects:
    """The option chooses the mode itself: every mode it selects is swept with it in its arguments."""

    why: str


def _sets(*items: str) -> tuple[str, ...]:
    return tuple(x for item in items for x in ("--set", item))


TINY = _sets("d_model=16", "n_layers=1", "n_heads=1", "head_dim=16", "eval_batches=1", "max_bytes=65536",
             "eval_every=1", "log_every=1")
QUIET = ("-q", "--threads", "1")

# ------------------------------------------------------------------ the modes of compare

COMPARE_DEFAULT = ("compare", "rope", "--out", "{study}", "--steps", "1", *TINY, *_sets("batch_size=1", "context=16"),
                   *QUIET)
COMPARE_SEEDS = (*COMPARE_DEFAULT, "--seeds", "0,1")
COMPARE_RETRIEVAL = ("compare", "--study", "retrieval", "rope", "--out", "{study}", "--steps", "1", *TINY,
                     *_sets("batch_size=1"),
                     "--set", "context=128", *QUIET)
COMPARE_LAYERS = ("compare", "--study", "layers", "rope", "--out", "{study}", "--steps", "1", *TINY,
                  *_sets("batch_size=1"), "--set", "context=128", *QUIET)
COMPARE_EXTENSION = ("compare", "--study", "extension", "pi", "--out", "{study}", "--steps", "1", *TINY,
                     *_sets("batch_size=1"),
                     "--set", "context=16", *QUIET)
COMPARE_EXTENSION_SEEDS = (*COMPARE_EXTENSION, "--seeds", "0,1")
COMPARE_BIAS = ("compare", "--study", "bias", "alibi", "--out", "{study}", "--steps", "1", *TINY,
                *_sets("batch_size=1", "context=16"), *QUIET)
COMPARE_FREQUENCY = ("compare", "--study", "frequency", "--out", "{study}", *QUIET)
COMPARE_GRID = ("compare", "--study", "grid", "rope", "--out", "{study}", "--steps", "1", *TINY,
                *_sets("batch_size=1", "context=16", "sizes=4"), *QUIET)

COMPARE_COUNTING = ("compare", "--study", "counting", "rope", "--out", "{study}", "--steps", "1", *TINY,
                    *_sets("batch_size=1", "context=16", "evals=1x1"), *QUIET)

EVAL = ("eval", "ppl", "retrieval", "zero_shot", "analyze", "measure", "grid", "counting")  # every kind but training

# compare's executor and tracking options: the executor's settings are refused without their executor,
# --track exports the finished study (so every piece of work runs)
CLUSTER_AND_TRACKING = {
    "--address": Refused(("--address", "auto")),
    "--gpus-per-run": Refused(("--gpus-per-run", "1")),
    "--partition": Refused(("--partition", "gpu")),
    "--time": Refused(("--time", "10")),
    "--tracking-uri": Refused(("--tracking-uri", "sqlite:///x.db")),
}


def _compare_common(eval_kind: str = "eval") -> dict:
    """What every training-and-evaluation mode of compare does with the shared options."""
    return {
        **CLUSTER_AND_TRACKING,
        "--preset": Acts((), ("--preset", "small"), fresh=True),
        "--steps": Acts((), ("--steps", "2"), fresh=True),
        "--out": Acts((), ("--out", "{root}/other"), fresh=True),
        "--lengths": Acts(("--lengths", "16"), ("--lengths", "16,32")),
        "--windows": Acts(("--windows", "1"), ("--windows", "2")),
        "--data": Acts((), ("--data", "stdlib:0.5,copy:0.5"), fresh=True),
        "--set": Acts((), _sets("warmup=3"), fresh=True),
        "--quick": (Acts((), ("--quick",)),
                    Refused(("--quick", "--lengths", "16", "--windows", "1", "--analyze-max", "16"))),
        "--study": Selects("compare's study modes are each swept below"),
    }


def _per_seed_study(other_data: tuple[str, ...]) -> dict:
    """The studies that train each scheme once per seed on their own generated task and measure it
    themselves (grid, counting): ``other_data`` another task of theirs."""
    return {
        **CLUSTER_AND_TRACKING,
        "--preset": Acts((), ("--preset", "small"), fresh=True),
        "--steps": Acts((), ("--steps", "2"), fresh=True),
        "--out": Acts((), ("--out", "{root}/other"), fresh=True),
        "--windows": Acts(("--windows", "1"), ("--windows", "2")),
        "--data": Acts((), other_data, fresh=True),
        "--set": Acts((), _sets("warmup=3"), fresh=True),
        "--quick": (Acts((), ("--quick",)), Refused(("--quick", "--windows", "1"))),
        "--seed": Acts((), ("--seed", "3"), fresh=True),
        "--seeds": Acts((), ("--seeds", "3,1"), fresh=True),
        "--lengths": Refused(("--lengths", "16")),
        "--analyze-max": Refused(("--analyze-max", "64")),
        "--study": Selects("compare's study modes are each swept"),
    }


SEEDED_COMPARE = {
    **_compare_common(),
    "--seed": Refused(("--seed", "3")),
    "--seeds": Acts((), ("--seeds", "3,1"), fresh=True),
    "--analyze-max": Acts(("--lengths", "16,32", "--analyze-max", "16"), ("--lengths", "16,32", "--analyze-max", "32"),
                          run=("train", "eval", "retrieval")),
}

COMPARE_MODES = {
    "default": (COMPARE_DEFAULT, {
        **_compare_common(),
        "--seed": Acts((), ("--seed", "3"), fresh=True),
        "--seeds": Selects("two or more seeds select the seeded study (mode 'seeds'); one seed acts like --seed"),
        "--analyze-max": Acts(("--lengths", "16,32", "--analyze-max", "16"),
                              ("--lengths", "16,32", "--analyze-max", "32"), run=("train", "eval")),
    }),
    "seeds": (COMPARE_SEEDS, SEEDED_COMPARE),
    "retrieval": (COMPARE_RETRIEVAL, {
        **SEEDED_COMPARE,
        "--quick": Acts((), ("--quick",)),  # its smaller depths and samples are always its own
        "--lengths": Acts(("--lengths", "128"), ("--lengths", "128,256")),
        "--seed": Acts((), ("--seed", "3"), fresh=True),
        "--seeds": Acts((), ("--seeds", "4,5"), fresh=True),
        "--analyze-max": Acts(("--lengths", "128,256", "--analyze-max", "128"),
                              ("--lengths", "128,256", "--analyze-max", "256"), run=("train", "eval", "retrieval")),
    }),
    "bias": (COMPARE_BIAS, {  # seeds 0, 1, 2 unless given: --seed and --seeds both choose them
        **SEEDED_COMPARE,
        "--seed": Acts((), ("--seed", "3"), fresh=True),
        "--seeds": Acts((), ("--seeds", "4,5"), fresh=True),
    }),
    "layers": (COMPARE_LAYERS, {
        **SEEDED_COMPARE,
        "--quick": Acts((), ("--quick",)),  # its smaller depths, samples and retrieval lengths are always its own
        "--lengths": Acts(("--lengths", "128"), ("--lengths", "128,256")),
        "--seed": Acts((), ("--seed", "3"), fresh=True),
        "--seeds": Acts((), ("--seeds", "4,5"), fresh=True),
        "--analyze-max": Acts(("--lengths", "128,256", "--analyze-max", "128"),
                              ("--lengths", "128,256", "--analyze-max", "256"), run=("train", "eval", "retrieval")),
    }),
    "extension": (COMPARE_EXTENSION, {
        **_compare_common(),
        "--seed": Acts((), ("--seed", "3"), fresh=True),
        "--seeds": Selects("two or more seeds select the seeded extension study (mode 'extension-seeds')"),
        "--analyze-max": Refused(("--analyze-max", "64")),
        "--quick": (Acts((), ("--quick",)), Refused(("--quick", "--lengths", "16", "--windows", "1"))),
    }),
    "extension-seeds": (COMPARE_EXTENSION_SEEDS, {
        **_compare_common(),
        "--seed": Refused(("--seed", "3")),
        "--seeds": Acts((), ("--seeds", "3,1"), fresh=True),
        "--analyze-max": Refused(("--analyze-max", "64")),
        "--quick": (Acts((), ("--quick",)), Refused(("--quick", "--lengths", "16", "--windows", "1"))),
    }),
    "frequency": (COMPARE_FREQUENCY, {
        **CLUSTER_AND_TRACKING,
        "--steps": Acts((), ("--steps", "2")),
        "--out": Acts((), ("--out", "{root}/other")),
        "--seeds": Acts((), ("--seeds", "7,8,9")),
        "--set": Acts((), _sets("task=lag")),
        "--quick": (Acts((), ("--quick",)),
                    Refused(("--quick", "--steps", "2", "--set", "widths=[8, 16]", "--seeds", "1"))),
        "--study": Selects("compare's study modes are each swept"),
        "--preset": Refused(("--preset", "small")),
        "--lengths": Refused(("--lengths", "64")),
        "--windows": Refused(("--windows", "2")),
        "--seed": Refused(("--seed", "3")),
        "--data": Refused(("--data", "stdlib")),
        "--analyze-max": Refused(("--analyze-max", "64")),
    }),
    "grid": (COMPARE_GRID, _per_seed_study(("--data", "grid_copy"))),
    "counting": (COMPARE_COUNTING, _per_seed_study(("--data", "select_last"))),
}

# ------------------------------------------------------------------ the other commands

TRAIN_TINY = (*TINY, "--context", "16", "--steps", "1", "--batch-size", "1", *QUIET)
TRAIN_SCHEME = ("train", "rope", "--out", "{root}/run_new", *TRAIN_TINY)
TRAIN_YAML = ("train", "{yaml}", "--out", "{root}/run_new", *TRAIN_TINY)
TRAIN_INIT = ("train", "--init-from", "{run}", "--out", "{root}/ft", "--steps", "1", *QUIET)
TRAIN_SHARED = {
    "--out": Acts((), ("--out", "{root}/elsewhere")),
    "--steps": Acts((), ("--steps", "2")),
    "--context": Acts((), ("--context", "32")),
    "--batch-size": Acts((), ("--batch-size", "2")),
    "--lr": Acts((), ("--lr", "0.01")),
    "--seed": Acts((), ("--seed", "3")),
    "--data": Acts((), ("--data", "copy")),
    "--device": Acts((), ("--device", "cpu")),
    "--backend": Acts((), ("--backend", "reference")),
    "--compile": Acts((), ("--compile",)),
    "--set": Acts((), _sets("warmup=3")),
    "--param": Acts((), ("-P", "base=500")),
    "--resume": Acts((), ("--resume",)),
    "--force-new": Acts((), ("--force-new",)),
    "--shard": Refused(("--shard", "fsdp")),  # one process here; under torchrun: test_train_fsdp
}
TRAIN_FROM_SCHEME = {
    **TRAIN_SHARED,
    "--preset": Acts((), ("--preset", "small")),
    "--init-from": Refused(("--init-from", "{run}")),
    "--scheme": Refused(("--scheme", "pi")),
}

EVAL_CMD = ("eval", "{run}", "--lengths", "16", "--windows", "1", *QUIET)
ANALYZE = ("analyze", "{run}", "--lengths", "16", *QUIET)
ANALYZE_DEFAULT_LENGTHS = ("analyze", "{run}", *QUIET)
PROFILE = ("profile", "stdlib", "--out", "{root}/prof", "--max-bytes", "20000", "--max-distance", "16",
           "--granularities", "1", *QUIET)
PROFILE_BLOCKS = ("profile", "blocks", "--out", "{root}/prof", "--max-bytes", "20000", "--max-distance", "16",
                  "--granularities", "1", *QUIET)
PROFILE_COMPARE = (*PROFILE_BLOCKS, "--suggest", "{root}/s.pe", "--compare", "{root}/cmp")
DIFF = ("diff", "rope", "pi")
DIFF_NUMERIC = ("diff", "rope", "pi", "--numeric", "--lmax", "16")
DIFF_SAMPLED = ("diff", "rope", "acc_random_qk", "--numeric", "--lmax", "16", "--samples", "2")

# command -> mode -> (arguments, {option: spec or specs})
SPEC: dict[str, dict[str, tuple[tuple[str, ...], dict[str, Any]]]] = {
    "": {"": (("check", "{two}"), {
        "--allow-import-root": (Acts(("check", "{tree}/x/outside.pe"),
                                     ("--allow-import-root", "{tree}/lib", "check", "{tree}/x/outside.pe"), base=()),
                                Refused(("--allow-import-root", "{tree}/lib", "schema"), base=())),
    })},
    "check": {"": (("check", "{two}"), {
        "--strict": Acts((), ("--strict",), base=("check", "{warns}")),
        "--json": Acts((), ("--json",)),
        "--param": Acts((), ("-P", "base=0.5")),
        "--quiet": (Acts(("--json",), ("--json", "--quiet"), base=("check", "{warns}")),),
    })},
    "fmt": {"": (("fmt", "{ugly}"), {
        "--check": Acts((), ("--check",)),
        "--diff": Acts((), ("--diff",)),
    })},
    "show": {"": (("show", "{two}"), {
        "--scheme": Acts((), ("--scheme", "other")),
        "--param": Acts((), ("-P", "base=500")),
        "--json": Acts((), ("--json",)),
    })},
    "schema": {"": (("schema",), {})},
    "list": {"": (("list",), {})},
    "graph": {"": (("graph", "{two}"), {
        "--scheme": Acts((), ("--scheme", "other")),
        "-P": Acts((), ("-P", "rotated=0.5"), base=("graph", "rope_partial")),
        "--format": Acts((), ("--format", "json")),
        "--backend": Acts((), ("--backend", "reference")),
        "--no-grad": Acts((), ("--no-grad",), base=("graph", "alibi", "--backend", "flex"), fails="a"),
    })},
    "compile": {"": (("compile", "{two}", "-o", "{root}/out"), {
        "--out": Acts((), ("-o", "{root}/out2")),
        "--scheme": Acts((), ("--scheme", "other")),
        "-P": Acts((), ("-P", "base=500")),
        "--backend": Acts((), ("--backend", "reference")),
        "--heads": Acts((), ("--heads", "2")),
        "--head-dim": Acts((), ("--head-dim", "16")),
        "--d-model": Acts((), ("--d-model", "64")),
    })},
    "train": {
        "scheme": (TRAIN_SCHEME, TRAIN_FROM_SCHEME),
        "yaml": (TRAIN_YAML, {**TRAIN_FROM_SCHEME, "--preset": Refused(("--preset", "small"))}),
        "init-from": (TRAIN_INIT, {
            **TRAIN_SHARED,
            "--context": Acts((), ("--context", "32")),
            "--param": Acts((), ("-P", "base=500")),
            "--preset": Refused(("--preset", "small")),
            "--init-from": Selects("it selects the fine-tune mode (swept here)"),
            "--scheme": Acts((), ("--scheme", "pi")),
        }),
    },
    "eval": {"": (EVAL_CMD, {
        "--lengths": Acts((), ("--lengths", "16,32")),
        "--tasks": Acts((), ("--tasks", "ppl")),
        "--windows": Acts((), ("--windows", "2")),
        "--out": Acts((), ("--out", "{root}/e.json")),
        "--scheme": Acts((), ("--scheme", "pi")),
        "--param": Acts((), ("-P", "base=500")),
        "--json": Acts((), ("--json",), run=EVAL + ("train",)),
    })},
    "analyze": {"": (ANALYZE, {
        "--lengths": Acts((), ("--lengths", "16,32")),
        "--window": Acts((), ("--window", "4")),
        "--samples": Acts((), ("--samples", "2")),
        "--max-length": (Refused(("--max-length", "64")),
                         Acts(("--max-length", "16"), ("--max-length", "32"), base=ANALYZE_DEFAULT_LENGTHS)),
        "--out": Acts((), ("--out", "{root}/a.json")),
        "--scheme": Acts((), ("--scheme", "pi")),
        "--param": Acts((), ("-P", "base=500")),
    })},
    "profile": {"": (PROFILE, {
        "--out": Acts((), ("--out", "{root}/prof2")),
        "--suggest": Acts((), ("--suggest", "{root}/s.pe")),
        "--train-length": Acts((), ("--train-length", "256")),
        "--law-c": Acts((), ("--law-c", "2")),
        "--max-bytes": Acts((), ("--max-bytes", "30000")),
        "--max-distance": Acts((), ("--max-distance", "32")),
        "--granularities": Acts((), ("--granularities", "1,2")),
        "--vocab": Acts((), ("--vocab", "16"), base=(*PROFILE, "--granularities", "2")),
        "--width-fraction": Acts((), ("--width-fraction", "0.5")),
        "--block-len": (Refused(("--block-len", "8")), Acts((), ("--block-len", "8"), base=PROFILE_BLOCKS)),
        "--block-offset": (Refused(("--block-offset", "2")),
                           Acts((), ("--block-offset", "2"), base=PROFILE_BLOCKS)),
        "--seed": Acts((), ("--seed", "3")),
        "--compare": Acts((), ("--compare", "{root}/cmp"), base=(*PROFILE_BLOCKS, "--suggest", "{root}/s.pe")),
        "--steps": (Refused(("--steps", "3")), Acts((), ("--steps", "3"), base=PROFILE_COMPARE)),
        # where --compare's runs train: refused without --compare, and without their executor
        "--address": (Refused(("--address", "auto")), Refused(("--address", "auto"), base=PROFILE_COMPARE)),
        "--gpus-per-run": (Refused(("--gpus-per-run", "1")), Refused(("--gpus-per-run", "1"), base=PROFILE_COMPARE)),
        "--partition": (Refused(("--partition", "gpu")), Refused(("--partition", "gpu"), base=PROFILE_COMPARE)),
        "--time": (Refused(("--time", "10")), Refused(("--time", "10"), base=PROFILE_COMPARE)),
        "--json": Acts((), ("--json",)),
    })},
    "diff": {"": (DIFF, {
        "--scheme": (Acts((), ("--scheme", "other"), base=("diff", "{two}", "{two2}")),
                     Refused(("--scheme", "two"), base=("diff", "{two}:two", "{two}:other"))),
        "--param": Acts((), ("-P", "base=500")),
        "-A": Acts((), ("-A", "base=500")),
        "-B": Acts((), ("-B", "base=500")),
        "--json": Acts((), ("--json",)),
        "--json-schema": (Acts((), ("--json-schema",), base=("diff",)), Refused(("--json-schema",))),
        "--numeric": Acts((), ("--numeric", "--lmax", "16")),
        "--plot": Acts((), ("--plot", "{root}/p.png", "--lmax", "16")),
        "--lmax": (Refused(("--lmax", "8")), Acts((), ("--lmax", "8"), base=DIFF_NUMERIC)),
        "--samples": (Refused(("--samples", "3")), Refused(("--samples", "3"), base=DIFF_NUMERIC),
                      Acts((), ("--samples", "3"), base=DIFF_SAMPLED)),
        "--seed": (Refused(("--seed", "3")), Refused(("--seed", "3"), base=DIFF_NUMERIC),
                   Acts((), ("--seed", "3"), base=DIFF_SAMPLED)),
    })},
    "explain": {"": (("explain", "{two}"), {
        "--scheme": (Acts((), ("--scheme", "other")), Refused(("--scheme", "other"), base=("explain", "{two}:two"))),
        "--param": Acts((), ("-P", "base=500")),
        "--context": Acts((), ("--context", "4096")),
    })},
    "import-hf": {"": (("import-hf", "{hf}"), {
        "--out": Acts((), ("-o", "{root}/imported.pe")),
        "--name": Acts((), ("--name", "mine")),
    })},
    "export-hf": {"": (("export-hf", "rope"), {
        "--scheme": Acts((), ("--scheme", "other"), base=("export-hf", "{two}")),
        "-P": Acts((), ("-P", "base=500")),
        "--config": Acts((), ("--config",)),
    })},
    "lsp": {"": (("lsp",), {})},  # a server over stdin: its one option is in ACCEPTED
    # a build into the machine's torch extensions folder, timed: what each option does is tested with a private
    # folder in compiler_tests/compiler/test_kernel_cache.py (test_pedsl_kernels_reports_and_checks and the
    # hung / failed build tests); here the combinations --check refuses
    "kernels": {"": (("kernels", "--check"), {
        "--check": Refused(("--check",), base=("kernels", "--rebuild")),
        "--rebuild": Refused(("--rebuild",)),
        "--timeout": Refused(("--timeout", "60")),
    })},
    "export": {"": (("export", "{llama}", "--hf", "{root}/hf_out"), {
        "--hf": Acts((), ("--hf", "{root}/hf_out2")),
    })},
}
SPEC["compare"] = {mode: COMPARE_MODES[mode] for mode in COMPARE_MODES}

# ------------------------------------------------------------------ inputs the commands read

TWO = '''scheme two "rope with its own base" {
  param base: float (> 1) = 10000.0
  layout halves
  qk: rotate(geometric(base) * position)
}

scheme other "rope over half the channels" {
  param base: float (> 1) = 10000.0
  layout halves
  channels {
    rot = fraction(0.5)
    plain = rest
  }
  qk on rot: rotate(geometric(base) * position)
}
'''
TWO2 = TWO.replace('scheme two "rope with its own base" {\n  param base: float (> 1) = 10000.0',
                   'scheme two2 "rope with its own base" {\n  param base: float (> 1) = 500.0')
WARNS = ('scheme warns "an unused let" {\n  layout halves\n  let unused = 3.0\n'
         '  qk: rotate(geometric(10000.0) * position)\n}\n')
UGLY = 'scheme   ugly   "x" {\nlayout halves\n   qk: rotate(geometric(10000.0)*position)\n}\n'
HF = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
      "rope_theta": 10000.0, "max_position_embeddings": 128}

# --------------------------------------------------------------- the work calls a run stops at

STOPS = {  # kind -> (module, attribute) of the call that does that work
    "train": ("pedsl.train.loop", "train"),
    "eval": ("pedsl.study.eval_run", "evaluate_run"),
    "analyze": ("pedsl.study.analyze", "analyze_run"),
    "retrieval": ("pedsl.study.retrieval.score", "retrieval_run"),
    "measure": ("pedsl.study.frequency.run", "measure_run"),
    "zero_shot": ("pedsl.study.extension.run", "_evaluate"),
    "grid": ("pedsl.study.grid.measure", "measure_grid"),
    "counting": ("pedsl.study.counting.measure", "measure_counting"),
}
# where the studies' driver calls the same work (it imports the names at its top)
CALLED_FROM = {"train": ("pedsl.study.driver",), "eval": ("pedsl.study.driver",),
               "analyze": ("pedsl.study.driver",), "retrieval": ("pedsl.study.driver",)}


class _Stopped(BaseException):
    """Raised at a work call the probe does not run (BaseException: the CLI's catch-all lets it through)."""


def _plain(v: Any, root: str) -> Any:
    """A comparable form of a work call's argument: configs as their fields (less the thread count,
    a presentation setting), schemes as name, parameters and hash, paths relative to the probe."""
    from pydantic import BaseModel

    if isinstance(v, (str, Path)):
        return str(v).replace(root, ROOT_TOKEN)
    if isinstance(v, bool) or v is None or isinstance(v, (int, float)):
        return v
    if isinstance(v, dict):
        return {str(k): _plain(x, root) for k, x in v.items() if k not in ("threads", "say")}
    if isinstance(v, (list, tuple)):
        return [_plain(x, root) for x in v]
    if hasattr(v, "source_hash") and hasattr(v, "params"):
        return {"scheme": v.name, "params": _plain(dict(v.params), root), "hash": v.source_hash}
    if isinstance(v, BaseModel):
        return _plain(v.model_dump(mode="json"), root)
    return type(v).__name__


def _patch_work(monkeypatch, calls: list, run: tuple[str, ...], root: str) -> None:
    import importlib

    import pedsl.train

    for kind, (mod, attr) in STOPS.items():
        module = importlib.import_module(mod)
        real = getattr(module, attr)

        def call(*args, _kind=kind, _real=real, **kw):
            calls.append((_kind, _plain(list(args), root), _plain(kw, root)))
            if _kind not in run:
                raise _Stopped
            return _real(*args, **kw)

        monkeypatch.setattr(module, attr, call)
        for user in CALLED_FROM.get(kind, ()):
            monkeypatch.setattr(importlib.import_module(user), attr, call)
        if kind == "train":
            monkeypatch.setattr(pedsl.train, "train", call)  # `from pedsl.train import train`


VOLATILE = re.compile(r"\b\d+(\.\d+)? ?(s|ms)\b|\[\s*\d+s\]|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")
VOLATILE_KEYS = {"date", "wall_time_s", "cpu_time_s", "compute_time_s", "git", "threads"}


def _text(s: str, root: str) -> str:
    return VOLATILE.sub("<t>", s.replace(root, ROOT_TOKEN))


def _file(path: Path, root: str) -> Any:
    if path.suffix in (".png", ".svg", ".safetensors", ".pt"):
        return "<binary>"
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        return "<binary>"
    if path.suffix == ".json":
        def clean(v):
            if isinstance(v, dict):
                return {k: clean(x) for k, x in v.items() if k not in VOLATILE_KEYS}
            return [clean(x) for x in v] if isinstance(v, list) else v
        return clean(json.loads(_text(text, root)))
    return _text(text, root)


def _files(root: Path) -> dict[str, Any]:
    return {str(p.relative_to(root)): p for p in sorted(root.rglob("*")) if p.is_file()}


@dataclasses.dataclass
class Outcome:
    code: int
    out: str
    err: str
    files: dict
    calls: list

    def named(self) -> str:
        return f"exit {self.code}\n{self.err[-1500:]}"


def _fill(args: tuple[str, ...], root: Path, inputs: dict[str, Path]) -> list[str]:
    names = {"root": str(root), "study": str(root / "study"),
             **{k: str(root / (v.name if v.is_file() else k)) for k, v in inputs.items()}}
    return [a.format(**names) for a in args]


def run_probe(args: tuple[str, ...], root: Path, inputs: dict[str, Path], monkeypatch, run=(),
              template: Path | None = None) -> Outcome:
    """Run ``pedsl ARGS`` in the fresh folder ``root`` with its inputs copied in; the work calls not
    in ``run`` stop the run (their arguments are recorded)."""
    from click.testing import CliRunner

    from pedsl.cli import main

    root.mkdir(parents=True)
    text = " ".join(args)
    for key, src in inputs.items():
        if "{" + key + "}" in text:
            (shutil.copytree if src.is_dir() else shutil.copy)(src, root / (key if src.is_dir() else src.name))
    if template is not None and "{study}" in text:
        shutil.copytree(template, root / "study")
    before = {k: _file(p, str(root)) for k, p in _files(root).items()}
    calls: list = []
    with monkeypatch.context() as mp:
        mp.chdir(root)
        _patch_work(mp, calls, tuple(run), str(root))
        patch_save_figure(mp, _no_figure)
        with CliRunner().isolation() as streams:
            try:
                main(_fill(args, root, inputs))
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except _Stopped:
                code = -1
            out, err = streams[0].getvalue().decode(), streams[1].getvalue().decode()
    assert "Traceback" not in out + err and "internal error" not in out + err, (args, err)
    after = {k: _file(p, str(root)) for k, p in _files(root).items()}
    written = {k: v for k, v in after.items() if before.get(k, ...) != v}
    return Outcome(code, _text(out, str(root)), _text(err, str(root)), written, calls)


def _no_figure(fig, out, name):
    """The plots are drawn but not rendered to files (rendering is most of a small study's time)."""
    from pedsl.study.plots import plt

    plt.close(fig)
    return [f"{name}.png", f"{name}.svg"]


# ------------------------------------------------------------------ the tree and the specs


def _commands() -> list[tuple[str, click.Command]]:
    """Every command under ``pedsl.cli.cli``, walked recursively (a group's own options are ``""``)."""
    from pedsl.cli import cli

    out: list[tuple[str, click.Command]] = [("", cli)]

    def walk(group: click.Group, prefix: str) -> None:
        ctx = click.Context(group)
        for name in group.list_commands(ctx):
            cmd = group.get_command(ctx, name)
            path = f"{prefix} {name}".strip()
            out.append((path, cmd))
            if isinstance(cmd, click.Group):
                walk(cmd, path)

    walk(cli, "")
    return out


def option_name(p: click.Parameter) -> str:
    longs = [o for o in p.opts if o.startswith("--")]
    return (longs or p.opts)[0]


def _options(cmd: click.Command) -> list[click.Option]:
    return [p for p in cmd.get_params(click.Context(cmd)) if isinstance(p, click.Option)]


def _specs(value) -> tuple:
    return value if isinstance(value, tuple) else (value,)


def _cases(kind):
    for cmd, modes in SPEC.items():
        for mode, (base, options) in modes.items():
            for opt, value in options.items():
                for i, spec in enumerate(_specs(value)):
                    if isinstance(spec, kind):
                        yield pytest.param(cmd, mode, base, opt, spec, id=f"{cmd or 'pedsl'}-{mode or 'all'}-{opt}-{i}")


def test_every_option_is_classified():
    missing, stale = [], []
    for path, cmd in _commands():
        assert path in SPEC, f"command '{path}' is not in the sweep: add it to SPEC with its options"
        names = {option_name(p) for p in _options(cmd)}
        for mode, (_, options) in SPEC[path].items():
            for name in sorted(names - set(options) - set(PRESENTATION) - set(ACCEPTED) - set(TESTED_ELSEWHERE)):
                missing.append(f"pedsl {path} ({mode or 'its one mode'}): {name}")
            stale += [f"pedsl {path} ({mode}): {o} is no option of it" for o in set(options) - names]
    assert not missing, ("these options neither show that they act nor are refused; give each an Acts (two values, "
                         "different work) or a Refused spec in SPEC, or make the command refuse it:\n  "
                         + "\n  ".join(missing))
    assert not stale, "\n".join(stale)
    assert set(SPEC) == {path for path, _ in _commands()}, "SPEC names a command pedsl does not have"


def test_presentation_options_exist():
    every = {option_name(p) for _, cmd in _commands() for p in _options(cmd)}
    assert set(PRESENTATION) | set(ACCEPTED) | set(TESTED_ELSEWHERE) <= every


# ------------------------------------------------------------------ fixtures: inputs and trained runs

TEMPLATED = {"default", "seeds", "retrieval", "bias", "layers", "extension", "extension-seeds", "grid",
             "counting"}  # compare modes with a trained study


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, one_thread) -> dict[str, Path]:
    """The files and trained runs the commands read (trained once per module: tiny models, 1 step)."""
    from click.testing import CliRunner

    from pedsl.cli import main

    d = tmp_path_factory.mktemp("inputs")
    for sub in ("tree/lib", "tree/x"):  # a scheme importing from outside its folder tree
        (d / sub).mkdir(parents=True)
    (d / "tree/lib/base.pe").write_text(TWO.split("\n\n")[0].replace("scheme two", "scheme base") + "\n")
    (d / "tree/x/outside.pe").write_text('import "../lib/base.pe"\nscheme outside extends base {}\n')
    files = {"two": TWO, "two2": TWO2, "warns": WARNS, "ugly": UGLY}
    out = {k: d / f"{k}.pe" for k in files}
    for k, text in files.items():
        out[k].write_text(text)
    (d / "hf.json").write_text(json.dumps(HF))
    out.update(hf=d / "hf.json", tree=d / "tree")

    def cli(*args):
        with CliRunner().isolation():
            try:
                main([str(a) for a in args])
            except SystemExit as exc:
                assert not exc.code, (args, exc.code)

    cli("train", "rope", "--out", d / "run", *TRAIN_TINY)
    cli("train", "rope", "--out", d / "llama", *TRAIN_TINY, "--set", "arch=llama")
    cli("compile", "rope", "-o", d / "cfg")
    out.update(run=d / "run", llama=d / "llama", yaml=d / "cfg" / "train.yaml")
    return out


_TEMPLATES: dict[str, Path] = {}


@pytest.fixture
def template(inputs, tmp_path_factory, monkeypatch):
    """mode -> a study folder of that compare mode with its first runs trained (once per module)."""
    def get(mode: str) -> Path | None:
        if mode not in TEMPLATED:
            return None
        if mode not in _TEMPLATES:
            root = tmp_path_factory.mktemp(f"template-{mode}") / "t"
            res = run_probe(SPEC["compare"][mode][0], root, inputs, monkeypatch, run=("train",))
            assert res.code == -1 and res.calls and res.calls[-1][0] != "train", res.named()
            _TEMPLATES[mode] = root / "study"
        return _TEMPLATES[mode]
    return get


_OUTCOMES: dict[tuple, Outcome] = {}


def _outcome(args, spec: Acts, inputs, template, monkeypatch, tmp_path, tag: str, cmd: str, mode: str) -> Outcome:
    """The outcome of ``args`` (cached per module: the base arguments of a mode serve many options)."""
    key = (tuple(args), spec.run, spec.fresh)
    if key not in _OUTCOMES or tag != "a":
        res = run_probe(tuple(args), tmp_path / tag, inputs, monkeypatch, run=spec.run,
                        template=template(mode) if cmd == "compare" and not spec.fresh else None)
        if tag != "a":
            return res
        _OUTCOMES[key] = res
    return _OUTCOMES[key]


@pytest.mark.parametrize("cmd,mode,base,opt,spec", list(_cases(Acts)))
def test_option_acts(cmd, mode, base, opt, spec, inputs, template, monkeypatch, tmp_path):
    base = spec.base if spec.base is not None else base
    a = _outcome((*base, *spec.a), spec, inputs, template, monkeypatch, tmp_path, "a", cmd, mode)
    again = _outcome((*base, *spec.a), spec, inputs, template, monkeypatch, tmp_path, "again", cmd, mode)
    same = dataclasses.astuple(a) == dataclasses.astuple(again)
    assert same, f"the same arguments gave two outcomes: the comparison would see differences that are not the " \
        f"option's:\n{a}\n{again}"
    b = _outcome((*base, *spec.b), spec, inputs, template, monkeypatch, tmp_path, "b", cmd, mode)
    assert b.code != 2 or a.code == 2, f"{opt} {spec.b} is refused here:\n{b.named()}"
    for side, res in (("a", a), ("b", b)):  # an error is not the work an option changes, unless declared
        assert ("pedsl: error[" in res.err) == (side in spec.fails), f"side {side} failed:\n{res.named()}"
    same = dataclasses.astuple(a) == dataclasses.astuple(b)
    assert not same, (
        f"pedsl {cmd} ({mode or 'its one mode'}): {' '.join(spec.b)} changes nothing that is computed or written; "
        "make it act or refuse it (exit 2 naming it)")


@pytest.mark.parametrize("cmd,mode,base,opt,spec", list(_cases(Refused)))
def test_option_refused(cmd, mode, base, opt, spec, inputs, monkeypatch, tmp_path):
    base = spec.base if spec.base is not None else base
    res = run_probe((*base, *spec.args), tmp_path / "r", inputs, monkeypatch)
    assert res.code == 2 and opt in res.err, res.named()
    assert not res.calls, f"a refused option ran work first: {res.calls[:1]}"


# ------------------------------------------------------------------ --set keys and -P names

KEY_OPTIONS = {  # option (Python name) -> a misspelled item and the name the error must suggest
    "sets": ("stpes=2", "steps"),
    "params": ("bsae=3", "base"),
    "params_a": ("bsae=3", "base"),
    "params_b": ("bsae=3", "base"),
}


def _key_cases():
    for path, cmd in _commands():
        for p in _options(cmd):
            if p.name in KEY_OPTIONS:
                for mode, (base, _) in SPEC[path].items():
                    yield pytest.param(base, p.opts[0], *KEY_OPTIONS[p.name], id=f"{path}-{mode or 'all'}-{p.opts[0]}")


def test_key_options_are_all_swept():
    """Every option that takes NAME=VALUE items is one of KEY_OPTIONS (so the next one is swept too)."""
    for path, cmd in _commands():
        for p in _options(cmd):
            if p.metavar in ("KEY=VALUE", "NAME=VALUE") or "name=value" in (p.help or ""):
                assert p.name in KEY_OPTIONS, f"pedsl {path} {p.opts[0]} takes NAME=VALUE items: add it to KEY_OPTIONS"


@pytest.mark.parametrize("base,flag,item,suggestion", list(_key_cases()))
def test_a_key_nothing_reads_is_an_error_naming_it(base, flag, item, suggestion, inputs, monkeypatch, tmp_path):
    res = run_probe((*base, flag, item), tmp_path / "k", inputs, monkeypatch)
    key = item.split("=")[0]
    assert res.code in (1, 2) and f"'{key}'" in res.out + res.err, res.named()
    assert f"did you mean '{suggestion}'" in res.out + res.err, res.named()
    assert not res.calls, f"the run started before the key was checked: {res.calls[:1]}"


# ------------------------------------------------------------------ what the fixed options now do


def test_compile_d_model_reaches_train_yaml(tmp_path):
    import yaml

    from compiler_helpers import run_cli

    code, _, err = run_cli("compile", "rope", "-o", tmp_path, "--d-model", "96")
    assert code == 0, err
    assert yaml.safe_load((tmp_path / "train.yaml").read_text())["model"]["d_model"] == 96


def test_check_quiet_json_lists_errors_only(tmp_path):
    from compiler_helpers import run_cli

    (tmp_path / "w.pe").write_text(WARNS)
    (tmp_path / "e.pe").write_text("scheme e {\n  qk: rotate(nope * position)\n}\n")
    code, out, _ = run_cli("check", tmp_path / "w.pe", tmp_path / "e.pe", "--json")
    assert {d["severity"] for d in json.loads(out)} == {"warning", "error"}
    code, out, _ = run_cli("check", tmp_path / "w.pe", tmp_path / "e.pe", "--json", "-q")
    assert code == 1 and {d["severity"] for d in json.loads(out)} == {"error"}


def test_an_option_that_selects_a_mode_has_its_mode_swept():
    for cmd, modes in SPEC.items():
        for mode, (_, options) in modes.items():
            for opt, value in options.items():
                if isinstance(value, Selects):
                    selected = [m for m, (base, _) in modes.items() if m != mode and opt in base]
                    assert selected or opt in modes[mode][0], f"pedsl {cmd} {opt} ({mode}) selects no swept mode"

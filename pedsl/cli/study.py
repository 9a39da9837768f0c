"""``pedsl eval``, ``pedsl analyze`` and ``pedsl compare`` (see :mod:`pedsl.study`).

All three set ``torch.set_flush_denormal(True)`` (docs/semantics.md §6: the application owns it), run
under ``torch.no_grad`` and use the run's compiled backend. Errors (a missing or corrupt run
directory, bad lengths) are diagnostics with exit code 1, never tracebacks.
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import click
from click.core import ParameterSource

from pedsl import limits as L
from pedsl.cli.option_rules import check_set_keys, given, refuse_given, set_conflicts, train_set_keys
from pedsl.cli.executors import executor_options, make_executor
from pedsl.cli.options import key_values, output_path, param_values
from pedsl.errors import UsageError
from pedsl.study.common import open_run, parse_lengths, progress
from pedsl.torchenv import setup_torch

# The modules that evaluate, analyze and run studies import torch and matplotlib: each command
# imports its own inside, so `pedsl eval --help` and the other commands of this module stay light.

TASKS = ("ppl", "passkey", "blocks", "retrieval")


def _tasks(text: str | None) -> list[str] | None:
    if not text:
        return None
    out = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in out if t not in TASKS]
    if bad:
        raise UsageError(f"unknown task '{bad[0]}'", hint=f"--tasks takes a comma list of: {', '.join(TASKS)}")
    return out


def _output_writable(run_dir: str, out: str | None) -> None:
    """Refuse an output that pedsl.fsio would refuse (a symbolic link, or RUN_DIR itself one) before the
    work, not after it."""
    from pedsl.fsio import refuse_symlink

    refuse_symlink(Path(out).parent if out else Path(run_dir))
    if out:
        refuse_symlink(out)


def _sets(items: tuple[str, ...]) -> dict:
    return key_values(items, "--set", "batch_size=8")


def _swapped(run_dir: str, scheme: str | None, params: tuple[str, ...]):
    """The run opened under ``--scheme`` / ``-P`` (pedsl.train.swap), or None for its own scheme."""
    if scheme is None and not params:
        return None

    return open_run(run_dir, scheme=scheme, params=param_values(params))


def _run_options(output: str):
    """--scheme, -P and --threads of the commands that evaluate a trained run (eval, analyze)."""
    def wrap(f):
        f = click.option("--threads", type=click.IntRange(0, L.MAX_THREADS), default=0,
                         help="torch CPU threads (0: the idle cores, from the load average).")(f)
        f = click.option("-P", "--param", "params", multiple=True, metavar="NAME=VALUE",
                         help="Parameter of that scheme (of the run's own scheme without --scheme), "
                         "e.g. -P factor=4.")(f)
        return click.option("--scheme", "scheme", metavar="NAME|FILE.pe", default=None,
                            help="Evaluate the trained weights under another scheme (library name or .pe "
                            "file; the learned positional tensors must match). Writes "
                            f"RUN_DIR/{output}.<scheme>.json unless --out.")(f)
    return wrap


@click.command("eval")
@click.argument("run_dir", metavar="RUN_DIR")
@click.option("--lengths", default=None, help="Comma list of lengths in tokens (default: the scheme's eval "
              "block, or training length x 1..32).")
@click.option("--tasks", default=None, help="Comma list of ppl, passkey, blocks, retrieval (default: ppl, passkey, "
              "blocks; retrieval = the passkey, multikey and kv tasks of pedsl.data.tasks at 5 needle depths).")
@click.option("--windows", type=click.IntRange(1, L.MAX_BATCH), default=None,
              help="Windows (ppl) or samples (tasks) per length.")
@click.option("--out", "out", callback=output_path, type=click.Path(dir_okay=False), default=None, help="Output JSON (default RUN_DIR/eval.json).")
@_run_options("eval")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON instead of a table.")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
def eval_cmd(run_dir, lengths, tasks, windows, out, scheme, params, threads, as_json, quiet):
    """Perplexity (and its ratio to the training length) and retrieval accuracy vs length."""
    from pedsl.study.eval_run import eval_table, evaluate_run

    if windows is not None and windows < 1:
        raise UsageError("--windows must be at least 1")
    _output_writable(run_dir, out)
    setup_torch(threads)
    res = evaluate_run(run_dir, lengths=parse_lengths(lengths), tasks=_tasks(tasks), windows=windows, out=out,
                       say=progress(quiet), loaded=_swapped(run_dir, scheme, params))
    if as_json:
        click.echo(json.dumps(res, indent=1))
    else:
        click.echo(eval_table(res))


@click.command("analyze")
@click.argument("run_dir", metavar="RUN_DIR")
@click.option("--lengths", default=None, help="Comma list of lengths (default: training length x 1, 2, 4 ... up "
              "to --max-length).")
@click.option("--window", "window", type=click.IntRange(1, L.MAX_LENGTH), default=None,
              help="W of the far-mass instrument (default: eval config, 32).")
@click.option("--samples", type=click.IntRange(1, L.MAX_BATCH), default=1, show_default=True,
              help="Windows per length.")
@click.option("--max-length", type=click.IntRange(2, L.MAX_LENGTH), default=1024, show_default=True,
              help="Longest default length ((B, H, L, L) matrices are materialised).")
@click.option("--out", "out", callback=output_path, type=click.Path(dir_okay=False), default=None,
              help="Output JSON (default RUN_DIR/analysis.json).")
@_run_options("analysis")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
def analyze(run_dir, lengths, window, samples, max_length, out, scheme, params, threads, quiet):
    """Far attention mass, score decoherence, frequency energy and key/query geometry per layer and head."""
    from pedsl.study.analyze import analysis_table, analyze_run

    if samples < 1 or max_length < 2 or (window is not None and window < 1):
        raise UsageError("--samples and --window must be at least 1, --max-length at least 2")
    if lengths:
        refuse_given(["max_length"], "not used with --lengths (it caps the default lengths only)",
                     hint="drop --max-length, or drop --lengths to analyze the training length x 1, 2, 4 ... up to it")
    _output_writable(run_dir, out)
    setup_torch(threads)
    res = analyze_run(run_dir, lengths=parse_lengths(lengths), window=window, samples=samples,
                      max_length=max_length, out=out, say=progress(quiet), loaded=_swapped(run_dir, scheme, params))
    click.echo(analysis_table(res))


@click.command("compare")
@click.argument("schemes", nargs=-1, metavar="[SCHEMES...]")
@click.option("--preset", default="tiny", show_default=True, help="Model size: tiny, small or base.")
@click.option("--steps", type=click.IntRange(1, L.MAX_STEPS), default=None,
              help="Training steps per scheme (default: the preset's; "
              "150 with --quick).")
@click.option("--out", "out", callback=output_path, type=click.Path(file_okay=False), default="compare", show_default=True,
              help="Study directory (runs, report.md, report.html, plots).")
@click.option("--lengths", default=None, help="Comma list of evaluation lengths (default: training length x 1..32; "
              "any length works, e.g. up to 128x: perplexity runs one window at a time).")
@click.option("--windows", type=click.IntRange(1, L.MAX_BATCH), default=None,
              help="Windows / samples per length (default 8; 2 with --quick).")
@click.option("--seed", type=click.IntRange(0, L.MAX_SEED), default=None,
              help="Seed of every run (default: the preset's, 0).")
@click.option("--seeds", default=None, help="Comma list of seeds, e.g. 0,1,2: every scheme is trained once per "
              "seed and every number is reported as mean [min, max] (overrides --seed).")
@click.option("--data", default=None, help="stdlib (default), a local file/folder, or a weighted mixture such as "
              "stdlib:0.7,passkey:0.1,multikey:0.1,kv:0.1.")
@click.option("--analyze-max", type=click.IntRange(2, L.MAX_LENGTH), default=None,
              help="Longest analysis length (default 1024; 512 with --quick); past 2048 tokens far and sink mass "
              "are streamed over key blocks (no L x L matrix).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Any other training setting for every run.")
@click.option("--threads", type=click.IntRange(0, L.MAX_THREADS), default=0, help="torch CPU threads (0: the idle cores, from the load average).")
@click.option("--quick", is_flag=True, help="A smoke-test study: 150 steps, lengths to 16x, 2 windows.")
@click.option("--study", type=click.Choice(["default", "extension", "retrieval", "frequency", "grid", "bias",
                                                 "counting", "layers"]),
              default="default",
              show_default=True,
              help="extension: RoPE scaling (pi, ntk, dynamic_ntk, yarn, llama3, longrope; rerope, leaky_rerope, "
              "self_extend zero-shot only) applied to a trained RoPE, zero-shot and after a short fine-tune (SCHEMES: a subset of those methods). retrieval: learned "
              "retrieval vs length and needle depth, trained on the retrieval tasks plus copy rows (default SCHEMES: the "
              "default study's plus fox and path_fox). frequency: RoPE frequency "
              "use vs the dependency width of a synthetic task, and the fit of theta ~ c / W (no SCHEMES; "
              "--set task=topic|lag|blocks widths=[8,16] seeds=[0,1]; see pedsl.study.frequency). grid: resolution "
              "extrapolation on 2-D data: trained on 16x16 grids (--data grid_image or grid_copy), evaluated at "
              "16..64 a side (--set sizes=16,32), 3 seeds by default (default SCHEMES: raster 1-D RoPE, rope_2d, "
              "rope_mixed, M-RoPE-style sections, a 2-D distance bias; see pedsl.study.grid). bias: do FIRE and "
              "KERPLE extrapolate flatter than T5 and ALiBi? perplexity ratio at 1x..32x over seeds 0,1,2 (--seeds) "
              "at 300 steps, with a claims table (default SCHEMES: alibi, t5_bias, t5_bias_init, kerple_log, kerple_power, fire; "
              "see pedsl.study.bias). "
              "counting: the k-th last marker or sentence with segments of variable length (--data select_last, "
              "sentence_first or a mixture), evaluated with more and longer segments (--set evals=1x1,4x1,2x2,4x4), "
              "3 seeds by default (default SCHEMES: rope, nope, alibi, cope; see pedsl.study.counting). layers: "
              "per-layer schemes past the training length, 3 seeds by default: full RoPE, a sliding window, "
              "Gemma-3-style 5:1 local/global, Llama-4-style NoPE interleaving, each with and without a learned sink "
              "logit, and RoPE with a sink token, and RoPE-ID; perplexity to 32x, retrieval to 16x, far and sink "
              "attention mass (6 layers; see pedsl.study.layers).")
@executor_options
@click.option("--track", type=click.Choice(["tensorboard", "mlflow"]), default=None,
              help="Export the finished study to an experiment tracker: tensorboard (event files in each run folder "
              "and the study's) or mlflow (a parent run with one child per run; see --tracking-uri).")
@click.option("--tracking-uri", default=None, metavar="URI",
              help="The mlflow tracking store (default: a local store in the study folder, OUT/mlflow.db).")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
def compare(schemes, preset, steps, out, lengths, windows, seed, seeds, data, analyze_max, sets, threads, quick, study,
            track, tracking_uri, quiet, **executor):
    """Train, evaluate and analyze schemes with one budget; write report.md / report.html with plots.

    SCHEMES are names from the scheme library (schemes/) or .pe files. With none, the default
    study: rope, rope_id, alibi, acc_random_qk, acc_random_qkv, path. Finished runs in --out are
    reused, so rerunning an interrupted study continues it.
    """
    if steps is not None and steps < 1:
        raise UsageError("--steps must be at least 1")
    if windows is not None and windows < 1:
        raise UsageError("--windows must be at least 1")
    seed_list = _seeds(seeds)
    set_values = _compare_sets(study, sets, seed_list)
    if quick:
        _refuse_idle_quick(study, set_values)
    say = progress(quiet)
    started = time.perf_counter()
    ex = _executor(executor, threads, track, tracking_uri)
    if ex.serial:
        say(f"torch threads: {setup_torch(threads)}")

    def begin() -> None:  # once the arguments are checked, before the first run trains
        _begin_tracking(track, out, tracking_uri)

    if study == "extension":
        many = seed_list if seed_list and len(seed_list) > 1 else None
        seed = seed_list[0] if seed_list and not many else seed
        _extension(schemes, preset, steps, out, lengths, windows, seed, data, analyze_max, sets, quick, quiet,
                   say, seeds=many, ex=ex, begin=begin)
        return _track(track, out, tracking_uri, say)
    if study in PER_SEED_STUDIES:
        _per_seed_study(study, schemes, out, ex, begin, seed_list or ([seed] if seed is not None else None),
                        preset=preset, steps=steps, data=data, windows=windows, quick=quick, sets=set_values,
                        quiet=quiet, say=say, started=started, command=_command_line(click.get_current_context()))
        return _track(track, out, tracking_uri, say)
    if study == "frequency":
        _frequency(schemes, out, ex, begin, steps=steps, quick=quick, sets=set_values,
                   command=_command_line(click.get_current_context()), say=say)
        return _track(track, out, tracking_uri, say)
    common = {"preset": preset, "steps": steps, "data": data, "lengths": parse_lengths(lengths), "windows": windows,
              "quick": quick, "analyze_max": analyze_max, "sets": set_values}
    if study in ("retrieval", "bias", "layers") or (seed_list and len(seed_list) > 1):
        from pedsl.study.seeded.run import run_seeded

        name = None if study == "default" else study
        seeds_run = seed_list or ([seed] if seed is not None else None)
        begin()
        if not ex.serial:
            from pedsl.study import parallel

            parallel.prepare(parallel.seeded_units(name, list(schemes), out, seeds=seeds_run, **common), out, ex,
                             say=say, label="study")
        res = run_seeded(name, list(schemes), out, seeds=seeds_run, **common,
                         command=_command_line(click.get_current_context()), quiet=quiet, say=say, started=started)
        for title, header, rows in res["summary"][:2 if study == "bias" else 1]:  # bias: and its claims
            _echo_table(title, header, rows)
        click.echo(f"report: {Path(out) / 'report.html'} and {Path(out) / 'report.md'} "
                   f"({res['meta']['wall_time_s']:.0f} s)")
        return _track(track, out, tracking_uri, say)
    from pedsl.study.compare.report import tables
    from pedsl.study.compare.run import run_compare

    if seed_list:
        seed = seed_list[0]
    begin()
    if not ex.serial:
        from pedsl.study import parallel

        parallel.prepare(parallel.compare_units(list(schemes), out, seed=seed, **common), out, ex, say=say,
                         label="compare")
    res = run_compare(list(schemes), out, seed=seed, **common,
                      command=_command_line(click.get_current_context()), quiet=quiet, say=say, started=started)
    for title, header, rows, _ in tables(res["results"], res["meta"])[:1]:
        _echo_table(title, header, rows)
    click.echo(f"report: {Path(out) / 'report.html'} and {Path(out) / 'report.md'} "
               f"({res['meta']['wall_time_s']:.0f} s)")
    _track(track, out, tracking_uri, say)


def _executor(opts: dict, threads: int, track: str | None, tracking_uri: str | None):
    """The study's executor (--jobs, --executor and its options) and --track, checked before anything runs."""
    ex = make_executor(opts, threads)
    if tracking_uri is not None and track != "mlflow":
        raise UsageError("--tracking-uri applies to --track mlflow only", hint="add --track mlflow, or drop --tracking-uri")
    if track:
        from pedsl.study.tracking import require

        require(track)  # a missing extra: one line now, not after the study trained
    if tracking_uri is not None:
        from pedsl.study.stores import check_store

        check_store(tracking_uri)  # an unusable store: refused in seconds, before anything is written
    return ex


def _begin_tracking(track: str | None, out: str, uri: str | None) -> None:
    """Open the study's record in the tracker; from now on every run this process (or a worker it
    starts) trains reports to it live (:mod:`pedsl.train.live`)."""
    if track:
        from pedsl.study.driver import study_dir
        from pedsl.study.tracking import start_study
        from pedsl.train import live

        study_dir(out)  # refuse a folder that is not a study before the tracker writes into it
        live.use(start_study(track, out, uri=uri))


def _track(track: str | None, out: str, uri: str | None, say) -> None:
    """Complete the study's record: runs trained before it was tracked, evaluations, report, plots."""
    if track:
        from pedsl.study.tracking import track_study
        from pedsl.train import live

        try:
            track_study(track, out, uri=uri, say=say, spec=live.current())
        finally:
            live.use(None)


# compare options -> the --set keys of the same training setting
SET_BY_OPTION = {"preset": "preset", "steps": "steps", "seed": "seed", "data": "data,source,data.source"}


def _compare_sets(study: str, sets: tuple[str, ...], seed_list: list[int] | None) -> dict:
    """The --set values of a study, checked: keys some part of the study reads, none that a given
    option also sets differently, and seeds given one way only."""
    values = _sets(sets)
    known = train_set_keys()
    if study == "frequency":
        from pedsl.study.frequency.run import RUN_KEYS, STUDY_KEYS, listish

        known = (known - set(RUN_KEYS)) | set(STUDY_KEYS)
        refuse_given(["data", "lengths", "windows", "seed", "analyze_max", "preset"], "not used by --study frequency",
                     hint="it trains on its own synthetic task with its own model; set those with --set "
                     "(task=, widths=, seeds=, context=, d_model= ...)")
    if study == "grid":
        from pedsl.study.grid.run import STUDY_KEYS as GRID_KEYS

        known = known | set(GRID_KEYS)
        refuse_given(["lengths", "analyze_max"], "not used by --study grid",
                     hint="it evaluates whole grids: choose their sides with --set sizes=16,24,32 (it runs no analysis)")
    if study == "counting":
        from pedsl.study.counting.run import STUDY_KEYS as COUNTING_KEYS

        known = known | set(COUNTING_KEYS)
        refuse_given(["lengths", "analyze_max"], "not used by --study counting",
                     hint="it evaluates rows with more and longer segments: choose them with --set evals=1x1,4x1,2x2 "
                          "(RxS: rows R times the context, segments S times as long; it runs no analysis)")
    check_set_keys(values, known)
    set_conflicts(values, SET_BY_OPTION)
    if seed_list is not None:
        refuse_given(["seed"], "not used with --seeds (it gives the seed of every run)",
                     hint="drop --seed (or give --seeds one seed)")
        if study != "frequency" and "seed" in values:
            raise UsageError(f"--seeds {','.join(map(str, seed_list))} and --set seed={values['seed']} both set the "
                             "seed of every run", hint="drop --set seed")
    if study == "frequency" and seed_list is not None:
        if "seeds" in values and [int(s) for s in listish(values["seeds"])] != seed_list:
            raise UsageError(f"--seeds {','.join(map(str, seed_list))} and --set seeds={values['seeds']} name "
                             "different seeds", hint="give the seeds once (--seeds 0,1,2)")
        values["seeds"] = seed_list
    return values


# what --quick chooses in each study, as (option, --set key) pairs: given all, --quick has nothing left to do
QUICK_CHOOSES = {"default": (("steps", "steps"), ("lengths", None), ("windows", None), ("analyze_max", None)),
                 "bias": (("steps", "steps"), ("lengths", None), ("windows", None), ("analyze_max", None)),
                 "extension": (("steps", "steps"), ("lengths", None), ("windows", None)),
                 "frequency": (("steps", "steps"), (None, "widths"), ("seeds", "seeds")),
                 "grid": (("steps", "steps"), (None, "sizes"), ("windows", None)),
                 "counting": (("steps", "steps"), (None, "evals"), ("windows", None))}


def _refuse_idle_quick(study: str, sets: dict) -> None:
    chooses = QUICK_CHOOSES.get(study)  # the retrieval study's quick depths are always its own
    if chooses and all((opt and given(opt)) or (key and key in sets) for opt, key in chooses):
        raise UsageError("--quick: not used here: every setting it would choose is given",
                         hint="drop --quick (it picks a smaller budget only where none is given)")


def _echo_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    click.echo(title)
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)]
    click.echo("  ".join(h.rjust(w) for h, w in zip(header, widths)))
    for r in rows:
        click.echo("  ".join(c.rjust(w) for c, w in zip(r, widths)))


def _seeds(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        out = [int(p) for p in text.replace(",", " ").split()]
    except ValueError:
        raise UsageError(f"--seeds expects a comma list of whole numbers, got '{text}'", hint="e.g. --seeds 0,1,2") from None
    if any(not 0 <= x <= L.MAX_SEED for x in out):
        raise UsageError(f"--seeds '{text}': seeds are whole numbers from 0 to {L.MAX_SEED}")
    if not out or len(set(out)) != len(out):
        raise UsageError(f"--seeds '{text}' is empty or names a seed twice", hint="e.g. --seeds 0,1,2")
    return out


def _extension(schemes, preset, steps, out, lengths, windows, seed, data, analyze_max, sets, quick, quiet, say,
               seeds=None, ex=None, begin=lambda: None):
    from pedsl.study.extension.run import METHODS, run_extension

    if analyze_max is not None:
        raise UsageError("--analyze-max does not apply to --study extension (it runs no analysis)")
    bad = [s for s in schemes if s not in METHODS]
    if bad:
        raise UsageError(f"--study extension compares the RoPE scaling methods; '{bad[0]}' is not one of them",
                         hint=f"name a subset of: {', '.join(METHODS)} (or none for all)")
    kw = dict(methods=list(schemes) or None, preset=preset, steps=steps, data=data, lengths=parse_lengths(lengths),
              windows=windows, quick=quick, sets=_sets(sets), command=_command_line(click.get_current_context()),
              quiet=quiet, say=say)
    begin()
    if ex is not None and not ex.serial:
        from pedsl.study import parallel

        unit_kw = {k: v for k, v in kw.items() if k not in ("methods", "command", "quiet", "say")}
        for stage, units in zip(("base models", "swaps and fine-tunes"),
                                parallel.extension_units(out, methods=kw["methods"], seeds=seeds, seed=seed, **unit_kw)):
            parallel.prepare(units, out, ex, say=say, label=f"extension: {stage}")
    if seeds:
        from pedsl.study.extension.seeds import run_extension_seeds
        from pedsl.study.extension.seeds_report import summary as seeds_summary

        res = run_extension_seeds(out, seeds=seeds, **kw)
        _echo_table(f"Extension study over seeds {','.join(map(str, seeds))}: perplexity ratio to each seed's base "
                    "RoPE at its training length, mean [min, max]", *seeds_summary(res["results"]))
        ext = Path(out) / "extension"
        click.echo(f"report: {ext / 'report.html'} and {ext / 'report.md'} ({res['meta']['wall_time_s']:.0f} s)")
        return
    res = run_extension(out, seed=seed, **kw)
    from pedsl.study.extension.report import summary

    _echo_table("Extension study: perplexity ratio to the base RoPE at its training length (and block accuracy)",
                *summary(res["results"]))
    ext = Path(out) / "extension"
    click.echo(f"report: {ext / 'report.html'} and {ext / 'report.md'} ({res['meta']['wall_time_s']:.0f} s)")


# the studies that train every scheme once per seed on a generated task and measure it themselves
PER_SEED_STUDIES = {"grid": ("pedsl.study.grid", "run_grid", "grid_units"),
                    "counting": ("pedsl.study.counting", "run_counting", "counting_units")}


def _per_seed_study(study, schemes, out, ex, begin, seeds, **kw) -> None:
    """``--study grid`` / ``--study counting``: its runs on the executor first (--jobs), then the study,
    which reuses them and writes the report; prints the first table."""
    import importlib

    package, run_name, units_name = PER_SEED_STUDIES[study]
    run_mod, report_mod = (importlib.import_module(f"{package}.{m}") for m in ("run", "report"))
    run_mod.settings(data=kw["data"], quick=kw["quick"], windows=kw["windows"], sets=kw["sets"])  # before any run
    begin()
    if not ex.serial:
        from pedsl.study import parallel

        units = getattr(parallel, units_name)(list(schemes), out, seeds=seeds, **{
            k: v for k, v in kw.items() if k not in ("say", "started", "command", "quiet")})
        parallel.prepare(units, out, ex, say=kw["say"], label=f"{study} study")
    res = getattr(run_mod, run_name)(list(schemes), out, seeds=seeds, **kw)
    for t in report_mod.tables(res["results"], res["meta"])[:1]:
        _echo_table(t.title, t.header, t.rows)
    for name, why in res["skipped"].items():
        click.echo(f"left out: {name} ({why})")
    click.echo(f"report: {Path(out) / 'report.html'} and {Path(out) / 'report.md'} "
               f"({res['meta']['wall_time_s']:.0f} s)")


def _frequency(schemes, out, ex, begin, **kw) -> None:
    """``--study frequency``: run the study (its runs first on ``ex`` unless serial), print what it ran
    (task, widths, seeds) and the fit table."""
    from pedsl.study.frequency.report import report
    from pedsl.study.frequency.run import run_frequency_study

    if schemes:
        raise UsageError("--study frequency trains rope.pe itself and takes no SCHEMES",
                         hint="drop the scheme names, or drop --study")
    begin()
    if not ex.serial:
        from pedsl.study import parallel

        parallel.prepare(parallel.frequency_units(out, steps=kw["steps"], quick=kw["quick"], sets=kw["sets"]), out, ex,
                         say=kw["say"], label="frequency")
    res = run_frequency_study(out, **kw)
    text = report(res).split("\n")
    meta = res["meta"]
    click.echo(f"frequency study: task {meta['task']}, widths {meta['widths']}, seeds {meta['seeds']}")
    click.echo("\n".join(text[5:9 + bool(res["fit_learned"]) + bool(res.get("fit_peak"))]))
    click.echo(f"report: {Path(out) / 'frequency.md'} ({res['meta']['wall_time_s']:.0f} s)")


def _command_line(ctx: click.Context) -> str:
    """The exact command, rebuilt from the options given on the command line (not the defaults)."""
    words = ["pedsl", ctx.info_name or "compare"]
    for p in ctx.command.params:
        if ctx.get_parameter_source(p.name) != ParameterSource.COMMANDLINE:
            continue
        value = ctx.params[p.name]
        if isinstance(p, click.Argument):
            words += [str(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
        elif isinstance(p, click.Option) and p.is_flag:
            if value:
                words.append(p.opts[0])
        else:
            for v in value if p.multiple else [value]:
                words += [p.opts[0], str(v)]
    return " ".join(shlex.quote(w) for w in words)

"""The options that send a study's runs to an executor (``--jobs``, ``--executor`` and its settings),
shared by ``pedsl compare`` and ``pedsl profile --compare``, and the :class:`~pedsl.study.parallel.Executor`
they describe (checked before anything runs). No torch here: the study modules load on use."""

from __future__ import annotations

import click

from pedsl.cli.options import jobs as parse_jobs
from pedsl.errors import UsageError

EXECUTOR_KEYS = ("jobs_text", "executor_kind", "address", "gpus_per_run", "partition", "time_min")


def executor_options(f):
    """Add the executor options to a click command (its function takes them as keyword arguments:
    :data:`EXECUTOR_KEYS`)."""
    for option in reversed([
        click.option("--jobs", "jobs_text", default=None, metavar="N|auto",
                     help="Runs trained side by side, each in its own worker process (default 1; auto: one per idle "
                     "core); the CPU threads are split between them (--threads pins the count per run). The report "
                     "is written once every run is done; a killed worker's run resumes from its last checkpoint. "
                     "With --executor ray or slurm: the most runs in flight (default: no limit)."),
        click.option("--executor", "executor_kind", type=click.Choice(["local", "ray", "slurm"]), default="local",
                     show_default=True, help="Where the runs go: local worker processes (--jobs), Ray tasks or Slurm "
                     "jobs (through submitit); on a cluster the study folder must be on a filesystem every node sees."),
        click.option("--address", default=None, metavar="ADDR", help="--executor ray: the Ray cluster to join "
                     "(default: a local Ray started for the study)."),
        click.option("--gpus-per-run", type=click.FloatRange(0, 1024), default=0,
                     help="--executor ray or slurm: GPUs per run."),
        click.option("--partition", default=None, help="--executor slurm: the Slurm partition."),
        click.option("--time", "time_min", type=click.IntRange(1, 10**6), default=None, metavar="MINUTES",
                     help="--executor slurm: the time limit of each run's job, in minutes."),
    ]):
        f = option(f)
    return f


def given_executor(opts: dict) -> list[str]:
    """The executor options given (not at their defaults), as flags."""
    flags = {"jobs_text": "--jobs", "executor_kind": "--executor", "address": "--address",
             "gpus_per_run": "--gpus-per-run", "partition": "--partition", "time_min": "--time"}
    defaults = {"executor_kind": "local", "gpus_per_run": 0}
    return [flags[k] for k in EXECUTOR_KEYS if opts.get(k) not in (None, defaults.get(k))]


def make_executor(opts: dict, threads: int):
    """The executor the options describe; each option that its executor does not read is a usage error,
    and a missing extra (ray, submitit) a one-line error naming it."""
    from pedsl.study.parallel import Executor

    kind = opts["executor_kind"]
    jobs = parse_jobs(opts["jobs_text"]) if opts["jobs_text"] is not None else None
    for flag, value, needs in (("--address", opts["address"], ("ray",)), ("--partition", opts["partition"], ("slurm",)),
                               ("--time", opts["time_min"], ("slurm",)),
                               ("--gpus-per-run", opts["gpus_per_run"] or None, ("ray", "slurm"))):
        if value is not None and kind not in needs:
            raise UsageError(f"{flag} applies to --executor {' or '.join(needs)} only",
                             hint=f"add --executor {needs[0]}, or drop {flag}")
    if kind != "local":
        from pedsl.study.cluster import check_ray_address, require

        require(kind)
        if kind == "ray":
            check_ray_address(opts["address"])  # a bad address refused in seconds, before the study starts
    return Executor(kind=kind, jobs=jobs, threads=threads, address=opts["address"], gpus=opts["gpus_per_run"],
                    partition=opts["partition"], time_min=opts["time_min"])


__all__ = ["EXECUTOR_KEYS", "executor_options", "given_executor", "make_executor"]

"""A study's runs on a cluster: each run a Ray task (``--executor ray``) or a Slurm job through
submitit (``--executor slurm``). Same units as the local executor (:mod:`pedsl.study.executor`),
same progress line, same rule on failures: a run whose process dies (killed, pre-empted, out of
memory) is started once more and resumes from its last checkpoint; a pedsl error is reported.

The run folders must be on a filesystem every node sees (the study folder is passed as a path);
pedsl must be installed on every node. Ray: a local Ray is started on demand (and stopped at the
end), ``address`` joins an existing cluster; each task asks for ``threads`` CPUs and ``gpus`` GPUs.
Slurm: one job per run (``cpus_per_task`` = threads, ``gpus_per_node`` = gpus), logs in
``DIR/slurm``; ``cluster="local"`` runs them as local processes (submitit's local executor, for tests
and a first try).
"""

from __future__ import annotations

import importlib.util
import logging
import socket
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

from pedsl.errors import ConfigError, UsageError, clip, quoted
from pedsl.study.executor import StudyProgress, Unit, call, failure
from pedsl.train import live

Say = Callable[[str], None]
EXTRAS = {"ray": ("ray", "ray"), "slurm": ("submitit", "slurm")}  # executor: (module, extra)


def require(executor: str) -> None:
    """A one-line error naming the extra when the executor's library is not installed (exit 1)."""
    module, extra = EXTRAS[executor]
    if importlib.util.find_spec(module) is None:
        raise ConfigError(f"--executor {executor} needs the optional package '{module}', which is not installed",
                          hint=f"pip install 'pedsl[{extra}]'")


# seconds the TCP probe of a Ray address waits before the address is refused (a closed GCS port made
# ray.init retry for minutes; an unreachable host or a missing cluster took up to 34 s)
RAY_CONNECT_TIMEOUT = 3.0


def check_ray_address(address: str | None, timeout: float = RAY_CONNECT_TIMEOUT) -> None:
    """Refuse a Ray address before Ray is handed it: malformed (UsageError), or with nothing accepting a
    connection within ``timeout`` seconds - no cluster for ``auto``, a host that does not resolve, a port
    that is closed (ConfigError E981). None and ``local`` start a local Ray: nothing to probe."""
    if address is None or address == "local":
        return
    client = address.startswith("ray://")
    target = address[len("ray://"):] if client else address
    if target == "auto":
        try:
            from ray._private.services import canonicalize_bootstrap_address  # what ray.init resolves it with
            target = canonicalize_bootstrap_address(target) or target
        except ConnectionError:
            raise _unreachable(address, "no running Ray cluster was found (RAY_ADDRESS, or one started on this "
                                        "machine with `ray start`)") from None
        except (ImportError, ValueError):
            return  # a Ray without that helper: ray.init resolves it (and its errors are caught)
    host, port = _split_address(address, target)
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            grpc = _speaks_grpc(conn)
    except socket.gaierror:
        raise _unreachable(address, f"the host {quoted(host)} does not resolve") from None
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or type(exc).__name__).lower()
        raise _unreachable(address, f"nothing accepts a connection at {host}:{port} within {timeout:g} s "
                                    f"({why})") from None
    if not grpc:  # ray.init would wait for a GCS there for minutes
        raise _unreachable(address, f"what answers at {host}:{port} is not a Ray head (no gRPC answer within "
                                    f"{timeout:g} s)")


# An HTTP/2 client's connection preface and an empty SETTINGS frame: a gRPC server (Ray's GCS, the Ray
# client server) answers with a SETTINGS frame of its own (frame type 4, the 4th byte of its header).
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def _speaks_grpc(conn: socket.socket) -> bool:
    try:
        conn.sendall(_H2_PREFACE)
        head = b""
        while len(head) < 9:
            chunk = conn.recv(9 - len(head))
            if not chunk:
                return False
            head += chunk
    except OSError:
        return False
    return head[3] == 4


def _split_address(address: str, target: str) -> tuple[str, int]:
    """(host, port) of ``host:port`` / ``[v6]:port``; UsageError for anything else."""
    try:
        parts = urlsplit("//" + target)
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    if not host or port is None or parts.path or parts.query or parts.fragment or parts.username:
        raise UsageError(f"--address {quoted(address)} is not a Ray address", code="E990",
                         hint="write HOST:PORT (the head's GCS port, 6379 by default), ray://HOST:PORT (Ray client, "
                              "10001), or auto (the cluster of this machine)")
    return host, port


def _unreachable(address: str, why: str) -> ConfigError:
    return ConfigError(f"--executor ray: cannot join the Ray cluster at {quoted(address)}: {why}", code="E981",
                       hint="start the cluster (ray start --head) or check the address; leave --address out to "
                            "start a local Ray for the study")


def _ray_task(fn: Callable[..., Any], kwargs: dict[str, Any], threads: int, label: str,
              tracking: live.Spec | None = None) -> str | None:
    return call(fn, kwargs, threads, lambda msg: print(f"[{label}] {msg}", file=sys.stderr, flush=True), tracking)


def run_ray(units: list[Unit], *, threads: int, say: Say, label: str = "study", address: str | None = None,
            gpus: float = 0, jobs: int | None = None, retries: int = 1, num_cpus: int | None = None) -> None:
    """Every unit a Ray task (``threads`` CPUs, ``gpus`` GPUs each), at most ``jobs`` at a time (None:
    as many as the cluster fits); returns when all are done (TrainError naming the failed runs)."""
    require("ray")
    import ray

    ours = not ray.is_initialized()
    if ours:
        check_ray_address(address)
        try:
            ray.init(address=address, num_cpus=None if address else num_cpus, include_dashboard=False,
                     logging_level=logging.ERROR, log_to_driver=True)
        except (ConnectionError, TimeoutError, ValueError, RuntimeError) as exc:  # answered, but not as Ray
            raise _unreachable(str(address), clip(str(exc).strip().splitlines()[0] if str(exc).strip()
                                                  else type(exc).__name__, 300)) from None
    say(f"{label}: Ray cluster with {ray.cluster_resources().get('CPU', 0):.0f} CPUs")
    task = ray.remote(_ray_task).options(num_cpus=threads, num_gpus=gpus, max_retries=retries)
    try:
        _drive(units, say, label, jobs,
               submit=lambda u: task.remote(u.fn, u.kwargs, threads, u.label, live.current()),
               wait=lambda refs: ray.wait(refs, num_returns=1)[0],
               result=lambda ref: _ray_result(ray, ref))
    finally:
        if ours:
            ray.shutdown()


def _ray_result(ray, ref) -> str | None:
    try:
        return ray.get(ref)
    except ray.exceptions.RayError as exc:  # the task's process died more often than retried
        return f"the Ray task failed: {str(exc).strip().splitlines()[0]}"


def run_slurm(units: list[Unit], *, threads: int, say: Say, folder: str | Path, label: str = "study",
              partition: str | None = None, time_min: int | None = None, gpus: int = 0, jobs: int | None = None,
              retries: int = 1, cluster: str | None = None, poll: float = 1.0) -> None:
    """Every unit a Slurm job through submitit (``cluster="local"``: submitit's local processes); at most ``jobs``
    submitted at a time (None: all); a job that dies is submitted once more."""
    require("slurm")
    import submitit

    try:
        ex = submitit.AutoExecutor(folder=str(folder), cluster=cluster or "slurm")  # never a silent local fallback
    except RuntimeError as exc:
        raise ConfigError(f"--executor slurm: no Slurm here ({exc})",
                          hint="run the study on a Slurm login node, or use --jobs N / --executor ray") from None
    params: dict[str, Any] = {"name": "pedsl", "cpus_per_task": threads, "tasks_per_node": 1, "nodes": 1}
    if time_min:
        params["timeout_min"] = time_min
    if gpus:
        params["gpus_per_node"] = gpus
    if partition:
        params["slurm_partition"] = partition
    ex.update_parameters(**params)
    tries: dict[int, int] = {}
    submitted: list = []

    def submit(u: Unit):
        try:
            job = ex.submit(call, u.fn, u.kwargs, threads,
                            lambda msg: print(f"[{u.label}] {msg}", file=sys.stderr), live.current())
        except (submitit.core.utils.UncompletedJobError, submitit.core.utils.FailedSubmissionError, OSError) as exc:
            _cancel(submitted)  # the jobs already queued would train on as orphans of a failed study
            raise _refused(exc) from None
        submitted.append(job)
        return job

    def wait(jobs_now: list) -> list:
        while True:
            done = [j for j in jobs_now if j.done()]
            if done:
                return done
            time.sleep(poll)

    def result(job) -> str | None:
        try:
            return job.result()
        except (submitit.core.utils.FailedJobError, submitit.core.utils.UncompletedJobError) as exc:
            return _Died(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)

    _drive(units, say, label, jobs, submit=submit, wait=wait, result=result, retries=retries, tries=tries)


def _refused(exc: Exception) -> ConfigError:
    """sbatch failed (non-zero exit: FailedJobError) or printed no job id (FailedSubmissionError)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    said = clip(lines[0], 300) if lines else type(exc).__name__
    return ConfigError(f"--executor slurm: the job could not be submitted ({said})", code="E981",
                       hint="check --partition and --time against the cluster (sinfo), and that sbatch works here; "
                            "or use --jobs N / --executor ray")


def _cancel(jobs: list) -> None:
    for job in jobs:
        try:
            job.cancel(check=False)
        except Exception:  # noqa: BLE001 - best effort: the failure being reported is the submission's
            pass


class _Died(str):
    """A job whose process died (not a pedsl error): submitted again while retries are left."""


def _drive(units: list[Unit], say: Say, label: str, jobs: int | None, *, submit: Callable[[Unit], Any],
           wait: Callable[[list], list], result: Callable[[Any], str | None], retries: int = 0,
           tries: dict[int, int] | None = None) -> None:
    """Submit the units (at most ``jobs`` in flight), collect their results, retry the ones that died."""
    tries = {} if tries is None else tries
    view = StudyProgress(len(units), jobs or len(units), say, label)
    flying: dict[Any, int]  # a submitted unit's Ray object ref -> its index
    pending, flying, errors = deque(range(len(units))), {}, {}
    while pending or flying:
        while pending and (jobs is None or len(flying) < jobs):
            i = pending.popleft()
            tries[i] = tries.get(i, 0) + 1
            flying[submit(units[i])] = i
            view.start(units[i].label)
        for handle in wait(list(flying)):
            i = flying.pop(handle)
            err = result(handle)
            if isinstance(err, _Died) and tries[i] <= retries:
                say(f"[{units[i].label}] the job died ({err}); submitting it again: the run resumes from its "
                    f"last checkpoint")
                view.requeue(units[i].label)
                pending.appendleft(i)
            elif err is not None:
                errors[i] = str(err)
                view.finish(units[i].label, ok=False)
            else:
                view.finish(units[i].label)
    if errors:
        raise failure(units, errors)


__all__ = ["EXTRAS", "check_ray_address", "require", "run_ray", "run_slurm"]

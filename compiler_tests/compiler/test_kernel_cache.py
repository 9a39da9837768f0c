"""The C++ kernels' build cache against what happens to it on real machines (pedsl/ops/cpu_kernels.py,
kernel_cache.py): a first build interrupted with Ctrl-C, torch's stale ``lock`` file, a builder killed with
SIGKILL, a truncated or foreign library at the cached path, a library that registers no ops, a compiler that
hangs or fails, another live builder; and ``pedsl kernels``. Each runs pedsl in a child process (a hang or a
SIGBUS must fail the test, not end pytest) in a private TORCH_EXTENSIONS_DIR, never the user's.

One real build per module (the fixture: Ctrl-C a few seconds into a first build, then the windowed ``train`` of
the report); the other cases copy that folder, so torch's builder only links again."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from compiler_helpers import ROOT

from pedsl.envswitch import SWITCHES, switch
from pedsl.ops import cpu_kernels as CK
from pedsl.ops import kernel_cache

BUILD_BOUND_S = 540  # a first build (20-60 s alone, ~100 s on a loaded two-core machine) and a tiny train
LINK_BOUND_S = 240  # linking the copied objects again


def _toolchain() -> bool:
    CK._ninja_on_path()
    return bool(shutil.which(os.environ.get("CXX", "c++")) and shutil.which("ninja"))


pytestmark = pytest.mark.skipif(not (switch(CK.SWITCH) and _toolchain()),
                                reason="no C++ compiler or ninja, or PEDSL_CPU_KERNELS off: these tests build them")

PROBE = """
import torch
from pedsl.compiler import band_dispatch
from pedsl.ops import cpu_kernels as CK, window_kernels as W
q = torch.randn(1, 2, 70, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
torch.testing.assert_close(band_dispatch.sliding_window_attention(q, q, q, 5), W.banded_attention(q, q, q, 5, None))
print("loaded" if CK.state().loaded else "torch paths", "|", CK.state().reason)
"""


def _env(ext: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    env.update(PYTHONPATH=str(ROOT), TORCH_EXTENSIONS_DIR=str(ext), **extra)
    return env


def _run(args: list[str], ext: Path, timeout: float, **extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=_env(ext, **extra),
                          timeout=timeout, cwd=ROOT, check=False)


def _probe(ext: Path, timeout: float = LINK_BOUND_S) -> subprocess.CompletedProcess:
    return _run(["-c", PROBE], ext, timeout)


def _in_folder(folder: Path) -> list[int]:
    """The pids of processes working in ``folder`` (ninja and the compilers run there)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and Path(os.readlink(proc / "cwd")) == folder.resolve():
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def _wait_for(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A first build interrupted by Ctrl-C a few seconds in (the terminal's SIGINT to the whole foreground
    group), torch's lock file left as an interrupted build of older torch leaves it, then the report's
    windowed ``train``: it must build, say so at the default log level, and finish. The built folder."""
    ext = tmp_path_factory.mktemp("ext")
    folder = ext / CK.extension_name()
    first = subprocess.Popen([sys.executable, "-m", "pedsl", "kernels"], env=_env(ext), cwd=ROOT, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    assert _wait_for(lambda: (folder / "build.ninja").exists(), 120), "the first build never started"
    time.sleep(3)
    os.killpg(first.pid, signal.SIGINT)
    _, err = first.communicate(timeout=30)
    assert first.returncode == 130 and "building pedsl's CPU kernels" in err, err  # click: "aborted"
    assert _wait_for(lambda: not _in_folder(folder), 10), "the compilers outlived the interrupted build"
    assert kernel_cache.verify(folder, folder.name, CK.build_key()) is not None
    (folder / kernel_cache.TORCH_LOCK).touch()
    start = time.monotonic()
    train = _run(["-m", "pedsl", "train", "rope_local", "--preset", "tiny", "-q", "--steps", "2", "-P", "width=8",
                  "--out", str(ext / "run")], ext, BUILD_BOUND_S)
    assert train.returncode == 0, train.stderr
    assert "building pedsl's CPU kernels, once per machine, ~30 s" in train.stderr
    assert re.search(r"built pedsl's CPU kernels in \d+ s", train.stderr), train.stderr
    assert kernel_cache.verify(folder, folder.name, CK.build_key()) is None
    print(f"first build and train after Ctrl-C: {time.monotonic() - start:.0f} s")
    return folder


def _copy(built: Path, tmp_path: Path) -> tuple[Path, Path]:
    ext = tmp_path / "ext"
    shutil.copytree(built, ext / built.name, symlinks=True)
    return ext, ext / built.name


def _assert_rebuilt(proc: subprocess.CompletedProcess, folder: Path) -> None:
    assert proc.returncode == 0 and proc.stdout.startswith("loaded"), (proc.returncode, proc.stdout, proc.stderr)
    assert "building pedsl's CPU kernels" in proc.stderr and "built pedsl's CPU kernels in" in proc.stderr
    assert kernel_cache.verify(folder, folder.name, CK.build_key()) is None


def test_a_truncated_library_is_rebuilt_not_loaded(built, tmp_path):
    """A half-written library (a full disk, a half copy) crashed the loading process with SIGBUS: ninja called
    it up to date. Its bytes no longer match the stamp, so it is never loaded: it is linked again."""
    ext, folder = _copy(built, tmp_path)
    lib = kernel_cache.library_path(folder, folder.name)
    os.truncate(lib, lib.stat().st_size // 2)
    proc = _probe(ext)
    _assert_rebuilt(proc, folder)
    assert "truncated or replaced" in proc.stderr


def test_a_foreign_library_is_rebuilt_not_loaded(built, tmp_path):
    """Another library at the cached path ended the process with exit 3 (no ``pedsl_band.forward``)."""
    ext, folder = _copy(built, tmp_path)
    import torch

    foreign = Path(torch.__file__).parent / "lib" / "libshm.so"
    shutil.copyfile(foreign, kernel_cache.library_path(folder, folder.name))
    proc = _probe(ext)
    _assert_rebuilt(proc, folder)
    assert "truncated or replaced" in proc.stderr


def test_a_stamped_library_without_the_ops_is_not_used(built, tmp_path):
    """Even a library that matches its stamp is checked after loading: where an op is missing the callers take
    the torch paths, with a message, and the answer is the same."""
    ext, folder = _copy(built, tmp_path)
    import torch

    shutil.copyfile(Path(torch.__file__).parent / "lib" / "libshm.so", kernel_cache.library_path(folder, folder.name))
    kernel_cache.write_stamp(folder, CK.build_key(), folder.name)
    proc = _probe(ext)
    assert proc.returncode == 0 and proc.stdout.startswith("torch paths"), (proc.stdout, proc.stderr)
    assert "does not register pedsl_band.forward" in proc.stderr and "building" not in proc.stderr


def test_a_stale_torch_lock_is_broken(built, tmp_path):
    """torch's ``lock`` file left by an interrupted build made every later windowed call wait for ever: under
    pedsl's own builder lock nobody else is building, so it is removed and the library linked."""
    ext, folder = _copy(built, tmp_path)
    kernel_cache.library_path(folder, folder.name).unlink()
    (folder / kernel_cache.STAMP).unlink()
    (folder / kernel_cache.TORCH_LOCK).touch()
    _assert_rebuilt(_probe(ext), folder)
    assert not (folder / kernel_cache.TORCH_LOCK).exists()


def test_a_builder_killed_with_sigkill_leaves_nothing_stale(built, tmp_path):
    """SIGKILL of the process that builds (no handler runs): its build process finishes on its own, holding
    the builder lock until then, and the next process waits for it or finds the stamped library."""
    ext, folder = _copy(built, tmp_path)
    kernel_cache.library_path(folder, folder.name).unlink()
    (folder / kernel_cache.STAMP).unlink()
    first = subprocess.Popen([sys.executable, "-c", PROBE], env=_env(ext), cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    assert _wait_for(lambda: (folder / kernel_cache.TORCH_LOCK).exists() or first.poll() is not None, 120)
    first.kill()
    first.wait()
    proc = _probe(ext)
    assert proc.returncode == 0 and proc.stdout.startswith("loaded"), (proc.stdout, proc.stderr)
    assert kernel_cache.verify(folder, folder.name, CK.build_key()) is None


def _fake_compiler(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "fake-c++"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_a_hung_build_is_stopped_at_its_timeout(tmp_path):
    """A compiler that never returns: the build is stopped after --timeout with a message, its processes are
    killed, and the command says the torch paths serve (exit 1)."""
    pids = tmp_path / "pids"
    cxx = _fake_compiler(tmp_path, f"echo $$ >> {pids}\nexec sleep 600")
    start = time.monotonic()
    # 20 s: long enough that the compiler has started (ninja and torch's build set-up come first, seconds on a
    # loaded machine), so that there is a process to stop
    proc = _run(["-m", "pedsl", "kernels", "--timeout", "20"], tmp_path / "ext", 120, CXX=str(cxx))
    assert time.monotonic() - start < 100
    assert proc.returncode == 1 and "did not finish within 20 s" in proc.stderr, proc.stderr
    assert "the flash path" in proc.stdout
    assert pids.exists(), "the fake compiler never started within the timeout"
    for pid in map(int, pids.read_text().split()):
        assert _wait_for(lambda pid=pid: not Path(f"/proc/{pid}").exists(), 10), "the hung compiler was not stopped"


def test_a_failed_build_is_remembered_and_rebuild_tries_again(tmp_path):
    """A compiler error comes back on every try: it is stamped, the next run does not pay for the build again,
    and ``pedsl kernels --rebuild`` tries again."""
    cxx = _fake_compiler(tmp_path, "echo 'fake compiler: no such luck' >&2\nexit 1")
    ext = tmp_path / "ext"
    first = _run(["-m", "pedsl", "kernels"], ext, 120, CXX=str(cxx))
    assert first.returncode == 1 and "did not build" in first.stderr and "building" in first.stderr
    again = _run(["-m", "pedsl", "kernels"], ext, 120, CXX=str(cxx))
    assert again.returncode == 1 and "building" not in again.stderr and "an earlier build failed" in again.stdout
    retry = _run(["-m", "pedsl", "kernels", "--rebuild"], ext, 120, CXX=str(cxx))
    assert retry.returncode == 1 and "building pedsl's CPU kernels" in retry.stderr


def test_waiting_for_a_live_builder_is_bounded(built, tmp_path):
    """Another process holds the builder lock (it is building): wait, say so with its pid, and give up after
    the timeout with the torch paths instead of waiting for ever."""
    import fcntl

    ext, folder = _copy(built, tmp_path)
    (folder / kernel_cache.STAMP).unlink()
    fd = os.open(folder / kernel_cache.BUILDER_LOCK, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        proc = _run(["-m", "pedsl", "kernels", "--timeout", "4"], ext, 120)
    finally:
        os.close(fd)
    assert proc.returncode == 1, proc.stderr
    assert f"waiting for another process (pid {os.getpid()})" in proc.stderr
    assert "still building them after 4 s" in proc.stderr


def test_pedsl_kernels_reports_and_checks(built, tmp_path):
    """``pedsl kernels --check`` builds nothing: exit 0 and the kernels named where they are ready, exit 1 (and
    no folder created) where they are not; off, the torch paths; --check refuses the build's options."""
    ext, folder = _copy(built, tmp_path)
    ready = _run(["-m", "pedsl", "kernels", "--check"], ext, 120)
    assert ready.returncode == 0, ready.stderr
    for line in ("built:           yes (verified)", "loaded:          yes: pedsl_band.forward",
                 "sliding windows: the C++ band kernel", "FIRE:            the C++ MLP-bias kernel",
                 f"build folder:    {folder}", f"flags:           {' '.join(CK.CFLAGS)}"):
        assert line in ready.stdout
    empty = tmp_path / "empty"
    missing = _run(["-m", "pedsl", "kernels", "--check"], empty, 120)
    assert missing.returncode == 1 and "not ready" in missing.stderr and not empty.exists()
    assert "sliding windows: the flash path" in missing.stdout
    off = _run(["-m", "pedsl", "kernels"], empty, 120, PEDSL_CPU_KERNELS="Off")
    assert off.returncode == 0 and "PEDSL_CPU_KERNELS off" in off.stdout and not empty.exists()
    for extra in (["--rebuild"], ["--timeout", "9"]):
        refused = _run(["-m", "pedsl", "kernels", "--check", *extra], ext, 120)
        assert refused.returncode == 2 and extra[0] in refused.stderr

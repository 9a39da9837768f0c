"""The package as a user gets it: a wheel built from this checkout, installed into an empty folder,
run from a folder outside the checkout. The grammar and the scheme library travel inside the wheel,
so library names work (`explain rope`, `diff rope yarn`, `train rope`), and nothing reaches back
into the source tree (the benchmarks are not part of the package)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    dist, target = tmp / "dist", tmp / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(dist), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    wheel = next(dist.glob("pedsl-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "pedsl/grammars/pe.lark" in names and "pedsl/schemes/rope.pe" in names
    # the C++ kernels' sources, built on first use
    assert {f"pedsl/ops/{n}" for n in ("band_kernel.cpp", "mlp_kernel.cpp", "path_kernel.cpp", "cpu_kernels.h")} <= set(names)
    assert not any(n.startswith(("benchmarks/", "compiler_tests/")) for n in names)
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                        str(wheel)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    outside = tmp / "elsewhere"
    outside.mkdir()
    return target, outside


def _run(installed, *args):
    target, cwd = installed
    env = {**os.environ, "PYTHONPATH": str(target)}
    return subprocess.run([sys.executable, "-m", "pedsl", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_installed_package_is_the_one_that_runs(installed):
    target, cwd = installed
    r = subprocess.run([sys.executable, "-c", "import pedsl; print(pedsl.__file__)"], cwd=cwd,
                       env={**os.environ, "PYTHONPATH": str(target)}, capture_output=True, text=True)
    assert Path(r.stdout.strip()).is_relative_to(target), r.stdout


def test_library_names_work_from_an_installed_wheel(installed):
    r = _run(installed, "explain", "rope")
    assert r.returncode == 0 and "Rotary position embedding" in r.stdout, r.stderr
    r = _run(installed, "diff", "rope", "yarn")
    assert r.returncode == 1 and "edits" in r.stdout and not r.stderr, r.stderr  # 1: the schemes differ, as diff(1)
    out = installed[1] / "run"
    r = _run(installed, "train", "rope", "--steps", "3", "--threads", "1", "--out", str(out), "--set", "n_layers=1",
             "--set", "d_model=32", "--set", "n_heads=1", "--set", "context=32", "--set", "batch_size=4",
             "--set", "data.max_bytes=50000", "--set", "eval_batches=1")
    assert r.returncode == 0, r.stderr
    assert (out / "DONE.json").is_file() and "Traceback" not in r.stderr


def test_pygments_finds_the_pe_lexer_through_the_installed_entry_point(installed):
    target, cwd = installed
    scheme = target / "pedsl" / "schemes" / "rope.pe"
    r = subprocess.run([sys.executable, "-m", "pygments", "-l", "pe", "-f", "html", str(scheme)], cwd=cwd,
                       env={**os.environ, "PYTHONPATH": str(target)}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert '<span class="nb">geometric</span>' in r.stdout and 'class="err"' not in r.stdout

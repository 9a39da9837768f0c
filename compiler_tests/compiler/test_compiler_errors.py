"""Bad input to the compiler: clear errors that name what to change, never a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from compiler_helpers import SCHEMES
from pedsl.compiler import compile_scheme
from pedsl.errors import CompileError, ShapeError


def test_unknown_backend():
    with pytest.raises(CompileError) as e:
        compile_scheme(SCHEMES / "rope.pe", backend="cuda-magic")
    assert e.value.code == "E401" and "sdpa" in e.value.hint


def test_backend_that_cannot_run_the_scheme():
    with pytest.raises(CompileError) as e:
        compile_scheme(SCHEMES / "path.pe", backend="sdpa", d_model=16)
    assert e.value.code == "E402" and "blockwise" in e.value.hint


def test_flex_backward_on_cpu_is_refused():
    with pytest.raises(CompileError) as e:
        compile_scheme(SCHEMES / "alibi.pe", backend="flex", requires_grad=True)
    assert e.value.code == "E403"


def test_shapes_that_do_not_match_the_head_dimension():
    mod = compile_scheme(SCHEMES / "rope.pe", num_heads=4, head_dim=32)
    q = torch.randn(1, 4, 8, 16)
    with pytest.raises(ShapeError) as e:
        mod(q, q, q)
    assert "head_dim=16" in e.value.hint
    with pytest.raises(ShapeError):
        mod(torch.randn(4, 8, 32), torch.randn(4, 8, 32), torch.randn(4, 8, 32))


def test_missing_x_and_tokens():
    path = compile_scheme(SCHEMES / "path.pe", d_model=16)
    q = torch.randn(1, path.heads, 5, path.head_dim)
    with pytest.raises(ShapeError, match="x=\\(B, L, d_model\\)"):
        path(q, q, q)
    acc = compile_scheme(SCHEMES / "acc_random_qk.pe")
    q = torch.randn(1, acc.heads, 5, acc.head_dim)
    with pytest.raises(ShapeError, match="tokens"):
        acc(q, q, q)


def test_data_dependent_scheme_without_d_model():
    with pytest.raises(CompileError) as e:
        compile_scheme(SCHEMES / "fox.pe")
    assert "d_model" in e.value.message if hasattr(e.value, "message") else "d_model" in str(e.value)


@pytest.mark.parametrize("args,needle", [
    (["compile", "schemes/rope.pe", "-o", "/proc/nope/out"], "cannot create folder"),
    (["compile", "schemes/path.pe", "-o", "OUT", "--backend", "sdpa"], "cannot run scheme"),
    (["compile", "schemes/rope.pe", "-o", "OUT", "-P", "bsae=3"], "unknown parameter"),
    (["graph", "schemes/missing.pe"], "no such file"),
])
def test_cli_errors_are_diagnostics(args, needle, tmp_path):
    args = [a.replace("OUT", str(tmp_path / "o")) for a in args]
    res = subprocess.run([sys.executable, "-m", "pedsl", *args], capture_output=True, text=True,
                         cwd=SCHEMES.parent, timeout=120)
    assert res.returncode == 1, res.stderr
    assert needle in res.stderr
    assert "Traceback" not in res.stderr


def test_unwritable_output_keeps_existing_files(tmp_path):
    """A failed write leaves what was there before."""
    import os

    out = tmp_path / "o"
    out.mkdir()
    (out / "train.yaml").write_text("old\n")
    os.chmod(out, 0o500)
    try:
        if os.access(out, os.W_OK):  # root ignores permissions: nothing to test here
            return
        res = subprocess.run([sys.executable, "-m", "pedsl", "compile", "schemes/rope.pe", "-o", str(out)],
                             capture_output=True, text=True, cwd=SCHEMES.parent, timeout=120)
        assert res.returncode == 1 and "not writable" in res.stderr
        assert (out / "train.yaml").read_text() == "old\n"
    finally:
        os.chmod(out, 0o700)

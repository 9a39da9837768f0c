"""Hostile files, folders and config text: a folder that only looks like a run, outputs through
links, YAML alias bombs and deep nesting, duplicate keys, one reading of ``-P``, paths with ``{``,
run folders that lie about their scheme, non-finite results and deterministic JSON."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from compiler_helpers import run_cli
from pedsl.errors import ConfigError, OutputError
from pedsl.train import rundir
from pedsl.train.loop import train
from test_train_loop import helper, small_cfg

ROOT = Path(__file__).parent.parent
# nine levels of x9 (about 400 bytes, 9**9 items expanded): a YAML file, and the same on one line
BOMB = "".join(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}" if i else "x"] * 9) + "]\n" for i in range(9))
BOMB_FLOW = "[" + ", ".join(f"&l{i} [" + ", ".join([f"*l{i - 1}" if i else "x"] * 9) + "]" for i in range(9)) + "]"


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    monkeypatch.delenv("PEDSL_DEBUG", raising=False)


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): (b"<dir>" if p.is_dir() else p.read_bytes())
            for p in sorted(folder.rglob("*"))}


# ---------------------------------------------------------------------------------------------
# 1. a folder is a run only when pedsl proves it


def test_a_folder_that_looks_like_a_run_is_never_modified(tmp_path):
    user = tmp_path / "user"
    (user / "scheme").mkdir(parents=True)
    (user / "scheme.sha256").write_text("ab" * 32 + "\n")
    (user / "scheme" / "notes.txt").write_text("my notes\n")
    (user / "config.yaml").write_text("steps: 5\n")
    before = _tree(user)
    for resume in (False, True):
        with pytest.raises(OutputError, match="is not empty and is not a pedsl run folder"):
            train(small_cfg(steps=5), user, attention=helper.spec(), quiet=True, resume=resume)
        assert _tree(user) == before
    code, _, err = run_cli("train", "rope", "--out", user, "--steps", "1")
    assert code == 1 and "not a pedsl run folder" in err and _tree(user) == before


def test_a_run_carries_a_versioned_marker_and_resumes(tmp_path):
    run = tmp_path / "run"
    train(small_cfg(steps=5, checkpoint_every=5), run, attention=helper.spec(), quiet=True)
    assert json.loads((run / rundir.MARKER).read_text()) == {"pedsl": "run folder", "format": rundir.RUN_FORMAT}
    train(small_cfg(steps=10, checkpoint_every=5), run, attention=helper.spec(), quiet=True, resume=True)
    (run / rundir.MARKER).write_text(json.dumps({"pedsl": "run folder", "format": rundir.RUN_FORMAT + 1}))
    with pytest.raises(OutputError, match="run folder of a newer pedsl"):
        train(small_cfg(steps=15, checkpoint_every=5), run, attention=helper.spec(), quiet=True, resume=True)


def test_a_complete_run_from_before_the_marker_still_resumes_and_gets_the_marker(tmp_path):
    run = tmp_path / "run"
    train(small_cfg(steps=5, checkpoint_every=5), run, attention=helper.spec(), quiet=True)
    (run / rundir.MARKER).unlink()  # as the pedsl before the marker left it
    assert rundir.is_unmarked_run(run)
    train(small_cfg(steps=10, checkpoint_every=5), run, attention=helper.spec(), quiet=True, resume=True)
    assert rundir.marker_format(run) == rundir.RUN_FORMAT
    # the same folder with one more file under scheme/ is no longer provably a run: refused, untouched
    (run / rundir.MARKER).unlink()
    (run / "scheme" / "notes.txt").write_text("mine\n")
    before = _tree(run)
    with pytest.raises(OutputError, match="not a pedsl run folder"):
        train(small_cfg(steps=15, checkpoint_every=5), run, attention=helper.spec(), quiet=True, resume=True)
    assert _tree(run) == before


# ---------------------------------------------------------------------------------------------
# 2. nothing is written through a link


def test_diff_plot_goes_through_the_safe_writer(tmp_path):
    user = tmp_path / "user.png"
    user.write_text("precious\n")
    (tmp_path / "link.png").symlink_to(user)
    code, _, err = run_cli("diff", "rope", "alibi", "--plot", tmp_path / "link.png")
    assert code != 0 and "symbolic link" in err and user.read_text() == "precious\n"
    for bad, words in (("/dev/null", "without an extension"), (tmp_path / "x.txt", "'.txt' is not a figure format")):
        code, _, err = run_cli("diff", "rope", "alibi", "--plot", bad)
        assert code != 0 and words in err, err
    assert not (tmp_path / "x.txt").exists()
    code, _, err = run_cli("diff", "rope", "alibi", "--plot", tmp_path / "ok.svg")
    assert (tmp_path / "ok.svg").read_text().lstrip().startswith("<?xml"), err


@pytest.mark.parametrize("command", ["compile", "train"])
def test_an_output_folder_that_is_a_link_is_refused(tmp_path, command):
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    args = ("compile", "rope", "-o") if command == "compile" else ("train", "rope", "--steps", "1", "--out")
    code, _, err = run_cli(*args, tmp_path / "link")
    assert code == 1 and "symbolic link" in err, err
    assert list(target.iterdir()) == []


def test_no_module_writes_files_except_through_fsio():
    import re

    writers = re.compile(r"\.savefig\((?!buf)|open\([^)]*['\"][wa]b?['\"]|\.write_(text|bytes)\(|torch\.save\("
                         r"|save_file\(|json\.dump\(")
    found = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "pedsl").rglob("*.py")) if p.name != "fsio.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if writers.search(line)]
    assert found == []

"""Every command that takes a scheme file also takes a library name; compile's train.yaml works from any folder."""

from __future__ import annotations

import shutil

import pytest
import yaml

from compiler_helpers import run_cli
from compiler_helpers import SCHEMES
from pedsl.lang.library import is_library_name, library_dir, scheme_file
from train_helpers import TINY


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """A working folder outside the checkout, holding a folder named like a library scheme."""
    cwd = tmp_path / "work"
    (cwd / "rope").mkdir(parents=True)  # e.g. a run folder: it must not hide the library scheme
    monkeypatch.chdir(cwd)
    return cwd


@pytest.mark.parametrize("args, code", [
    (["explain", "rope"], 0),
    (["show", "rope"], 0),
    (["graph", "yarn"], 0),
    (["check", "rope"], 0),
    (["diff", "rope", "yarn"], 1),  # 1: the schemes differ
    (["diff", "rope", "rope"], 0),
])
def test_commands_take_library_names(elsewhere, args, code):
    got, out, err = run_cli(*args)
    assert got == code, out + err
    assert "E209" not in out + err


@pytest.mark.parametrize("args, code", [(["explain", "ropee"], 1), (["show", "yran"], 1), (["check", "yran"], 1),
                                        (["compile", "ropee", "-o", "o"], 1), (["train", "ropee"], 1),
                                        (["diff", "rope", "yran"], 2)])  # diff: 2 on any error, like diff(1)
def test_an_unknown_name_gets_a_did_you_mean(elsewhere, args, code):
    got, out, err = run_cli(*args)
    assert got == code, out + err
    assert "E209" in out + err and "did you mean" in out + err and "no scheme '" in out + err


def test_a_file_here_wins_over_the_library(elsewhere):
    (elsewhere / "yarn").write_text((SCHEMES / "rope.pe").read_text())  # a file named 'yarn' that holds rope
    assert scheme_file("yarn") == elsewhere.joinpath("yarn").relative_to(elsewhere)
    code, out, _ = run_cli("show", "yarn", "--scheme", "rope")
    assert code == 0 and "scheme: rope" in out
    assert scheme_file("rope") == library_dir() / "rope.pe"  # the folder 'rope' is not a file
    assert not is_library_name("rope.pe") and not is_library_name("sub/rope") and is_library_name("rope")


def test_compile_by_name_writes_a_train_yaml_that_names_the_library_scheme(elsewhere):
    code, out, err = run_cli("compile", "rope", "-o", "out")
    assert code == 0, out + err
    assert yaml.safe_load((elsewhere / "out" / "train.yaml").read_text())["scheme"] == "rope"
    assert (elsewhere / "out" / "rope.py").is_file()


@pytest.mark.slow
def test_train_yaml_from_compile_works_from_another_folder(tmp_path, monkeypatch):
    """compile a scheme file into out/, then train out/train.yaml (2 steps) from a sibling folder."""
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(SCHEMES / "rope_id.pe", src / "mine.pe")  # rope_id imports nothing
    monkeypatch.chdir(src)
    code, out, err = run_cli("compile", "mine.pe", "--scheme", "rope_id", "-o", "../out")
    assert code == 0, out + err
    assert yaml.safe_load((tmp_path / "out" / "train.yaml").read_text())["scheme"] == "../src/mine.pe"
    (tmp_path / "other").mkdir()
    monkeypatch.chdir(tmp_path / "other")
    code, out, err = run_cli("train", "../out/train.yaml", "--steps", "2", "--out", "run", *TINY)
    assert code == 0, out + err
    saved = yaml.safe_load((tmp_path / "other" / "run" / "config.yaml").read_text())
    assert saved["scheme"].endswith("mine.pe") and saved["steps"] == 2


@pytest.mark.slow
def test_train_takes_a_library_name(elsewhere):
    code, out, err = run_cli("train", "alibi", "--steps", "2", "--out", "run", *TINY)
    assert code == 0, out + err
    saved = yaml.safe_load((elsewhere / "run" / "config.yaml").read_text())
    assert saved["scheme"] == str(library_dir() / "alibi.pe")

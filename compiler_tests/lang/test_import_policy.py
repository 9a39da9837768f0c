"""Where `import` may read from: the folder tree of the file given, the scheme library, and roots
allowed explicitly (`pedsl --allow-import-root DIR`, PEDSL_IMPORT_PATH). Only regular .pe files; an
imported file that does not parse is named with a position, never quoted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from compiler_helpers import run_cli

from pedsl.errors import CheckError
from pedsl.lang import imports
from pedsl.lang.api import load

SECRET = "SECRET_TOKEN=hunter2"


def cli(*args: str) -> tuple[int, str]:
    code, out, err = run_cli(*args)
    return code, out + err


@pytest.fixture()
def tree(tmp_path):
    (tmp_path / "secret.txt").write_text(SECRET + "\n")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "base.pe").write_text('import "rope.pe"\nscheme base extends rope {}\n')
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "sub").mkdir()
    (tmp_path / "x" / "sub" / "mid.pe").write_text('import "rope.pe"\nscheme mid extends rope {}\n')
    return tmp_path


def _error(path: Path) -> CheckError:
    with pytest.raises(CheckError) as exc:
        load(path)
    return exc.value


def test_absolute_import_of_any_file_is_refused_and_not_quoted(tree):
    f = tree / "x" / "a.pe"
    f.write_text(f'import "{tree / "secret.txt"}"\nscheme a extends rope {{}}\n')
    err = _error(f)
    assert err.code == "E209" and "only .pe files" in err.render()
    assert SECRET not in err.render() and "hunter2" not in err.render()
    code, out = cli("check", str(f))
    assert code == 1 and "hunter2" not in out and "only .pe files" in out


def test_proc_environ_through_a_pe_link_is_refused(tree):
    os.environ["PEDSL_TEST_SECRET"] = "hunter2"
    try:
        (tree / "x" / "env.pe").symlink_to("/proc/self/environ")
        f = tree / "x" / "a.pe"
        f.write_text('import "env.pe"\nscheme a extends rope {}\n')
        code, out = cli("check", str(f))
        assert code == 1 and "hunter2" not in out and "only .pe files" in out
    finally:
        del os.environ["PEDSL_TEST_SECRET"]


def test_pe_file_that_does_not_parse_is_named_not_quoted(tree):
    (tree / "x" / "notes.pe").write_text(SECRET + "\n")
    f = tree / "x" / "a.pe"
    f.write_text('import "notes.pe"\nscheme a extends rope {}\n')
    code, out = cli("check", str(f))
    assert code == 1 and "hunter2" not in out and "SECRET" not in out
    assert "'notes.pe': it is not a valid .pe file (a syntax error at line 1, column 1)" in out
    assert f"pedsl check {tree / 'x' / 'notes.pe'}" in out


def test_import_outside_the_folder_tree_needs_an_explicit_root(tree, monkeypatch):
    f = tree / "x" / "child.pe"
    f.write_text('import "../lib/base.pe"\nscheme child extends base {}\n')
    err = _error(f)
    assert err.code == "E209" and "outside the folders imports may come from" in str(err)
    assert "--allow-import-root" in err.diagnostics[0].hint and "PEDSL_IMPORT_PATH" in err.diagnostics[0].hint
    code, out = cli("--allow-import-root", str(tree / "lib"), "check", str(f))
    assert code == 0, out
    code, out = cli("check", str(f))  # the option does not outlive its command
    assert code == 1 and "outside the folders" in out
    assert imports.EXTRA_IMPORT_ROOTS == []
    monkeypatch.setenv("PEDSL_IMPORT_PATH", str(tree / "lib"))
    assert load(f).name == "child"
    with imports.allow_import_roots(tree):
        monkeypatch.delenv("PEDSL_IMPORT_PATH")
        assert load(f).name == "child"
    assert _error(f).code == "E209"


def test_subfolders_and_the_library_are_allowed(tree):
    f = tree / "x" / "a.pe"
    f.write_text('import "sub/mid.pe"\nimport "alibi.pe"\nscheme a extends mid {}\n')
    assert load(f).name == "a"
    # from the subfolder's file, "../" stays inside the tree of the file given
    (tree / "x" / "sub" / "up.pe").write_text('import "../a.pe"\nscheme up extends a {}\n')
    g = tree / "x" / "top.pe"
    g.write_text('import "sub/up.pe"\nscheme top extends up {}\n')
    assert load(g).name == "top"


def test_a_link_leaving_the_tree_is_refused(tree):
    (tree / "x" / "base.pe").symlink_to(tree / "lib" / "base.pe")
    f = tree / "x" / "a.pe"
    f.write_text('import "base.pe"\nscheme a extends base {}\n')
    assert "outside the folders" in str(_error(f))


def test_non_regular_and_non_pe_imports(tree):
    f = tree / "x" / "a.pe"
    (tree / "x" / "fifo.pe").parent.mkdir(exist_ok=True)
    os.mkfifo(tree / "x" / "fifo.pe")
    f.write_text('import "fifo.pe"\nscheme a extends rope {}\n')
    assert "not a regular file" in str(_error(f))
    (tree / "x" / "data.txt").write_text("scheme z {}\n")
    f.write_text('import "data.txt"\nscheme a extends rope {}\n')
    assert "only .pe files" in str(_error(f))

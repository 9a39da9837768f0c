"""The front-end commands through the real entry point (pedsl.cli.main): check, fmt, show,
schema, list - exit codes, positioned diagnostics, never a traceback."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lang_helpers import BAD_FILES, FIXTURES, LIBRARY, ROOT, SCHEMES, expectation
from compiler_helpers import run_cli as run


def test_check_library_clean():
    code, out, err = run("check", "--strict", *LIBRARY)
    assert code == 0, out + err
    assert out == ""
    assert f"{len(LIBRARY)} files, 0 errors, 0 warnings: ok" in err


WARNS = "scheme w {\n  qk: rotate(geometric(10000) * position)\n  train {\n    context = 128\n  }\n}\n"


def test_check_warning_and_strict(tmp_path):
    f = tmp_path / "w.pe"
    f.write_text(WARNS)
    code, out, err = run("check", f)
    assert code == 0 and f"{f}:2:1: warning[W101]" not in out  # anchored at the scheme
    assert f"{f}:1:1: warning[W101]" in out and "1 warning" in err
    code, out, _ = run("check", "--strict", f)
    assert code == 1 and f"{f}:1:1: error[W101]" in out
    code, out, err = run("check", "--quiet", f)
    assert code == 0 and out == "" and err == ""


def test_check_json(tmp_path):
    f = tmp_path / "w.pe"
    f.write_text(WARNS)
    code, out, _ = run("check", "--json", f, BAD_FILES[0])
    assert code == 1
    data = json.loads(out)
    assert isinstance(data, list) and {d["severity"] for d in data} == {"warning", "error"}
    for d in data:
        assert set(d) >= {"severity", "code", "message", "file", "line", "col", "hint"}
        assert d["line"] >= 1 and d["col"] >= 1
    code, out, _ = run("check", "--json", *LIBRARY)
    assert code == 0 and json.loads(out) == []


@pytest.mark.parametrize("path", BAD_FILES, ids=lambda p: p.stem)
def test_check_bad_fixtures(path):
    exp = expectation(path)
    args = ["check", path]
    for k, v in (exp["params"] or {}).items():
        args += ["-P", f"{k}={v}"]
    code, out, err = run(*args)
    assert code == 1
    assert f":{exp['line']}:{exp['col']}: error[{exp['code']}]" in out, out
    if exp["hint"]:
        assert f"hint: {exp['hint']}" in out


def test_check_params(tmp_path):
    rope = SCHEMES / "rope.pe"
    assert run("check", rope, "-P", "train_length=256", "-P", "base=500000")[0] == 0
    code, out, _ = run("check", rope, "-P", "bsae=3")
    assert code == 1 and f"{rope}:3:1: error[E301]" in out and "did you mean 'base'?" in out
    code, out, _ = run("check", rope, "-P", "train_length=long")
    assert code == 1 and "error[E302]" in out
    code, out, _ = run("check", rope, "-P", "base=0.5")
    assert code == 1 and f"{rope}:4:22: error[E303]" in out
    code, out, err = run("check", rope, "-P", "base")
    assert code == 2 and "E991" in err and "name=value" in err


def test_check_several_files_keeps_going(tmp_path):
    code, out, err = run("check", BAD_FILES[0], SCHEMES / "rope.pe", BAD_FILES[1])
    assert code == 1
    assert str(BAD_FILES[0]) in out and str(BAD_FILES[1]) in out
    assert "3 files" in err


def _bad_inputs(tmp: Path) -> dict[str, Path]:
    files = {
        "empty": b"",
        "binary": bytes(range(256)) * 8,
        "random": os.urandom(4096),
        "huge": b"scheme a { qk: none }\n" * (10_000_000 // 21),
        "nested": b"scheme a {\n  let x = " + b"(" * 5000 + b"1" + b")" * 5000 + b"\n}\n",
        "nested_unary": b"scheme a {\n  let x = " + b"-" * 50000 + b"1\n}\n",
        "latin1": "# caf\u00e9\nscheme a { qk: none }\n".encode("latin-1"),
        "utf16": "scheme a { qk: none }\n".encode("utf-16"),
        "nul": b"scheme a {\x00}\n",
    }
    out = {}
    for name, data in files.items():
        p = tmp / f"{name}.pe"
        p.write_bytes(data)
        out[name] = p
    (tmp / "folder.pe").mkdir()
    out["folder"] = tmp / "folder.pe"
    out["missing"] = tmp / "missing.pe"
    return out


@pytest.mark.parametrize("kind", ["empty", "binary", "random", "huge", "nested", "nested_unary", "latin1", "utf16",
                                  "nul", "folder", "missing"])
def test_check_bad_inputs_positioned_and_fast(tmp_path, kind):
    path = _bad_inputs(tmp_path)[kind]
    t0 = time.process_time()  # CPU time (in-process run): a guard against blow-ups, robust to load
    code, out, err = run("check", path)
    elapsed = time.process_time() - t0
    assert code == 1
    first = out.splitlines()[0]
    assert first.startswith(f"{path}:") and ": error[E" in first, first
    line, col = first[len(str(path)) + 1:].split(":")[:2]
    assert int(line) >= 1 and int(col) >= 1
    assert elapsed < 3.0, f"{kind}: {elapsed:.2f}s"


def test_endless_and_escape_inputs(tmp_path):
    if Path("/dev/zero").exists():
        code, out, _ = run("check", "/dev/zero")
        assert code == 1 and out.startswith("/dev/zero:1:1: error[E209]") and "a device" in out  # never read
    code, out, _ = run("fmt", "-", input=b"\0" * 2_000_000)
    assert code == 1 and out.startswith("<stdin>:1:1: error[E102]")
    f = tmp_path / "esc.pe"
    f.write_bytes(b"scheme a {\x1b[31m}\n")
    code, out, _ = run("check", f)
    assert code == 1 and ":1:11: error[E101]" in out
    assert "\x1b" not in out and "    scheme a {?[31m}" in out  # no raw escape sequence reaches the terminal


def test_huge_file_is_refused_quickly(tmp_path):
    path = _bad_inputs(tmp_path)["huge"]
    assert path.stat().st_size >= 10_000_000
    from pedsl.lang.api import check

    t0 = time.process_time()
    try:
        check(path)
    except Exception as err:  # noqa: BLE001
        assert getattr(err, "code", None) == "E102"
    assert time.process_time() - t0 < 1.0


def test_subprocess_exit_codes(tmp_path):
    """The installed entry point (python -m pedsl): 0 clean, 1 bad input, 2 usage; no traceback."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    bad = _bad_inputs(tmp_path)

    def sub(*args):
        p = subprocess.run([sys.executable, "-m", "pedsl", *map(str, args)], capture_output=True, text=True,
                           env=env, timeout=60)
        assert "Traceback" not in p.stdout + p.stderr
        return p

    assert sub("check", SCHEMES / "rope.pe").returncode == 0
    for kind in ("huge", "random", "missing"):
        p = sub("check", bad[kind])  # the 60 s timeout guards against a hang; CPU bounds are in-process above
        assert p.returncode == 1 and f"{bad[kind]}:1:" in p.stdout
    assert sub("check").returncode == 2
    assert sub("check", "--no-such-option", SCHEMES / "rope.pe").returncode == 2
    assert sub("fmt", "--check", *LIBRARY).returncode == 0


# ------------------------------------------------------------------ fmt


UGLY = "# a comment\nscheme u \"U\" {param p:int=1;let y=p*2 # why\nqk:none\nallow unused}\n"
PRETTY = ('# a comment\nscheme u "U" {\n  param p: int = 1\n  let y = p * 2  # why\n  qk: none\n'
          "  allow unused\n}\n")


def test_fmt_in_place_atomic(tmp_path):
    f = tmp_path / "u.pe"
    f.write_text(UGLY)
    f.chmod(0o640)
    code, out, err = run("fmt", f)
    assert code == 0 and f.read_text() == PRETTY
    assert "reformatted 1 file" in err
    assert stat.S_IMODE(f.stat().st_mode) == 0o640  # permissions kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["u.pe"]  # no temporary left behind
    before = f.stat().st_mtime_ns
    time.sleep(0.01)
    assert run("fmt", f)[0] == 0
    assert f.stat().st_mtime_ns == before  # unchanged files are not rewritten


def test_fmt_through_a_symlink(tmp_path):
    real = tmp_path / "real.pe"
    real.write_text(UGLY)
    link = tmp_path / "link.pe"
    link.symlink_to(real)
    assert run("fmt", link)[0] == 0
    assert link.is_symlink() and real.read_text() == PRETTY


def test_fmt_check_and_diff(tmp_path):
    f = tmp_path / "u.pe"
    f.write_text(UGLY)
    code, out, err = run("fmt", "--check", f, SCHEMES / "rope.pe")
    assert code == 1 and f"would reformat {f}" in err and "rope.pe" not in err
    assert f.read_text() == UGLY
    code, out, err = run("fmt", "--diff", f)
    assert code == 0 and f.read_text() == UGLY
    assert out.startswith(f"--- {f}\n+++ {f} (formatted)\n") and "+  param p: int = 1" in out
    code, out, err = run("fmt", "--check", "--diff", f)
    assert code == 1 and "+  qk: none" in out
    assert run("fmt", "--check", *LIBRARY)[0] == 0


def test_fmt_stdin():
    code, out, err = run("fmt", "-", input=UGLY)
    assert code == 0 and out == PRETTY
    code, out, err = run("fmt", "--check", "-", input=UGLY)
    assert code == 1 and out == ""
    code, out, err = run("fmt", "-", input="scheme {\n")
    assert code == 1 and out.startswith("<stdin>:1:8: error[E111]")
    code, out, err = run("fmt", "-", input=b"scheme s { qk: none }\n\xff")
    assert code == 1 and out.startswith("<stdin>:2:1: error[E101]")


def test_check_stdin(tmp_path, monkeypatch):
    rope = Path(LIBRARY[0]).parent / "rope.pe"
    code, out, err = run("check", "-", input=rope.read_text())
    assert code == 0 and "1 file, 0 errors" in err
    code, out, err = run("check", "-", input="scheme x {\n  qk: rotate(w * positon)\n}\n")
    assert code == 1 and "<stdin>:2:18: error[E201]: unknown name 'positon'" in out and "did you mean 'position'" in out
    code, out, err = run("check", "-", input=b"\0" * 2_000_000)
    assert code == 1 and out.startswith("<stdin>:1:1: error[E102]")
    monkeypatch.chdir(rope.parent)  # imports on standard input resolve from the working directory
    variant = 'import "rope.pe"\nscheme r500 extends rope {\n  param base: float (> 1) = 500\n}\n'
    assert run("check", "-", input=variant)[0] == 0
    monkeypatch.chdir(tmp_path)  # elsewhere: the library's rope.pe
    assert run("check", "-", input=variant)[0] == 0
    code, out, _ = run("check", "-", input=variant.replace("rope.pe", "no_such.pe"))
    assert code == 1 and out.startswith("<stdin>:1:1: error[E209]") and "no_such.pe" in out


def test_fmt_bad_inputs(tmp_path):
    bad = _bad_inputs(tmp_path)
    for kind in ("binary", "huge", "nested", "folder", "missing"):
        code, out, err = run("fmt", bad[kind])
        assert code == 1 and out.startswith(f"{bad[kind]}:1:") or out.startswith(f"{bad[kind]}:2:"), (kind, out)
        assert ": error[E" in out
    syntax = FIXTURES / "bad" / "syntax_unexpected_token.pe"
    code, out, _ = run("fmt", "--check", syntax)
    assert code == 1 and ":3:14: error[E111]" in out


# ------------------------------------------------------------------ show, schema, list


def test_show_bad_inputs(tmp_path):
    bad = _bad_inputs(tmp_path)
    for kind, path in bad.items():
        code, out, err = run("show", path)
        assert code == 1 and out == "", kind
        first = err.splitlines()[0]
        assert first.startswith(f"{path}:") and ": error[E" in first, (kind, first)


def test_show_human():
    code, out, _ = run("show", SCHEMES / "rope_id.pe")
    assert code == 0
    assert out.startswith("scheme: rope_id\n")
    assert "  rot: channels 0-7, 16-23 (16; quarters(1, 3))" in out
    assert "phase: span(train_length, cycles = 2, period = 32) * position" in out
    assert "temperature: log_length(train_length)" in out
    assert "lengths: [128, 256, 512, 1024, 2048, 4096]" in out
    code, out, _ = run("show", SCHEMES / "alibi.pe")
    assert "extends: nope" in out and "slope: -slopes(heads)" in out


def test_show_json_params_and_scheme(tmp_path):
    from pedsl.lang.scheme import Scheme

    code, out, _ = run("show", "--json", SCHEMES / "pi.pe", "-P", "factor=8")
    assert code == 0
    data = json.loads(out)
    s = Scheme.model_validate(data)
    assert s.name == "pi" and s.params["factor"] == 8.0 and s.bases == ("rope",)
    code, out, _ = run("show", FIXTURES / "fmt" / "dense.pe", "--scheme", "b")
    assert code == 0 and "scheme: b" in out and "layout: interleaved" in out
    code, out, err = run("show", FIXTURES / "fmt" / "dense.pe", "--scheme", "c")
    assert code == 1 and "error[E215]" in err


def test_show_warnings_and_errors(tmp_path):
    f = tmp_path / "w.pe"
    f.write_text(WARNS)
    code, out, err = run("show", f)
    assert code == 0 and "warning[W101]" in err and "scheme: w" in out
    code, out, err = run("show", FIXTURES / "bad" / "unknown_name.pe")
    assert code == 1 and ":5:24: error[E201]" in err
    code, out, err = run("show", SCHEMES / "rope.pe", "-P", "bsae=1")
    assert code == 1 and "error[E301]" in err
    code, out, err = run("show", tmp_path / "missing.pe")
    assert code == 1 and "error[E209]" in err


def test_schema():
    code, out, _ = run("schema")
    assert code == 0
    data = json.loads(out)
    assert data["title"] == "Scheme" and "transports" in data["properties"]
    assert {"RotateTransport", "RotationSteps", "HouseholderSteps", "DistanceBias", "GateBias"} <= set(data["$defs"])


def test_list_library():
    code, out, _ = run("list")
    assert code == 0
    names = [line.split()[0] for line in out.splitlines()]
    assert names == sorted(p.stem for p in LIBRARY)
    assert any(line.startswith("rope_id ") and "[rope_id.pe]" in line for line in out.splitlines())


def test_list_dir(tmp_path):
    (tmp_path / "a.pe").write_text('scheme a "first" { qk: none }\nscheme b extends a { qk: none }\n')
    (tmp_path / "broken.pe").write_text("scheme {")
    code, out, err = run("list", tmp_path)
    assert code == 1
    assert "a  first  [a.pe]" in out and "b  (extends a)  [a.pe]" in out
    assert f"{tmp_path / 'broken.pe'}:1:8: error[E111]" in err
    assert run("list", tmp_path / "nope")[0] == 2


def test_help_lists_front_end_commands():
    code, out, _ = run("--help")
    assert code == 0
    for name in ("check", "fmt", "show", "schema", "list"):
        assert f"  {name}" in out

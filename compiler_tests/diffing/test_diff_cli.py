"""`pedsl diff`: exit codes 0/1/2, --json against its own JSON Schema, text output, --plot, no torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pedsl.cli import main
from pedsl.diffing.report import JSON_SCHEMA, validate
from compiler_helpers import ROOT

SCHEMES = ROOT / "schemes"


def run(*args: str, capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(["diff", *args])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def s(name: str) -> str:
    return str(SCHEMES / f"{name}.pe")


def test_exit_codes(capsys, tmp_path):
    assert run(s("rope"), s("rope"), capsys=capsys)[0] == 0
    assert run(s("rope"), s("pi"), capsys=capsys)[0] == 1
    doc_only = tmp_path / "rope2.pe"
    doc_only.write_text((SCHEMES / "rope.pe").read_text().replace("halves layout\"", "halves\""))
    code, out, _ = run(s("rope"), str(doc_only), capsys=capsys)
    assert code == 0 and "equivalent" in out and "~ doc:" in out


@pytest.mark.parametrize("args,needle", [
    ((s("rope"),), "needs two schemes"),
    ((s("rope"), "nowhere.pe"), "no such file"),
    ((s("rope"), s("pi"), "-P", "bogus=1"), "neither rope nor pi has a parameter 'bogus'"),
    ((s("rope"), s("pi"), "-P", "base=abc"), "is float"),
    ((s("rope"), s("pi"), "-P", "nonsense"), "name=value"),
    ((s("rope") + ":nothere", s("rope")), "no scheme named 'nothere'"),
    ((s("rope"), s("rope"), "--lmax", "0"), "--lmax"),
    ((s("rope"), s("pi"), "--plot", "/nonexistent/dir/x.png"), "cannot write the figure"),
])
def test_errors_exit_2_with_a_diagnostic(capsys, args, needle):
    code, out, err = run(*args, capsys=capsys)
    assert code == 2
    assert needle in err
    assert "Traceback" not in err + out


def test_bad_syntax_exits_2(capsys, tmp_path):
    bad = tmp_path / "bad.pe"
    bad.write_text("scheme bad {\n  qk: rotate(\n}\n")
    code, _, err = run(s("rope"), str(bad), capsys=capsys)
    assert code == 2 and "bad.pe:" in err and "Traceback" not in err


@pytest.mark.parametrize("a,b,extra", [
    ("rope", "pi", ()), ("path", "path_fox", ()), ("rope", "rope_id", ("--numeric",)),
    ("alibi", "rope_id_alibi", ("--numeric",)), ("rope", "rope", ("--numeric",)), ("nope", "fox", ()),
])
def test_json_validates_against_its_schema(capsys, a, b, extra):
    code, out, _ = run(s(a), s(b), "--json", *extra, capsys=capsys)
    doc = json.loads(out)
    assert validate(doc) == []
    assert doc["equivalent"] == (code == 0)
    assert (doc["numeric"] is not None) == ("--numeric" in extra)


def test_json_schema_is_exported_and_the_checker_rejects_bad_documents(capsys):
    code, out, _ = run("--json-schema", capsys=capsys)
    assert code == 0 and json.loads(out) == JSON_SCHEMA
    _, out, _ = run(s("rope"), s("pi"), "--json", capsys=capsys)
    doc = json.loads(out)
    assert any("missing required property 'edits'" in e for e in validate({k: v for k, v in doc.items() if k != "edits"}))
    assert any("expected boolean" in e for e in validate({**doc, "equivalent": "no"}))
    assert any("unexpected property 'extra'" in e for e in validate({**doc, "extra": 1}))
    bad_edit = {**doc, "edits": [{"op": "rename", "path": "x", "semantic": True}]}
    assert any("is not one of" in e for e in validate(bad_edit))
    assert any("oneOf" in e for e in validate({**doc, "numeric": 3}))


def test_json_edits_and_params(capsys):
    _, out, _ = run(s("rope"), s("rope"), "-B", "base=500", "--json", "--numeric", capsys=capsys)
    doc = json.loads(out)
    assert doc["b"]["params"] == {"base": 500.0} and doc["a"]["params"] == {}
    assert doc["edits"] == [{"op": "update", "path": "params.base", "old": 10000.0, "new": 500.0, "semantic": True}]
    assert doc["numeric"]["largest"]["curve"] == "transport" and doc["numeric"]["largest"]["max_abs"] > 0.1


def test_sampling_noise_is_measured_and_named(capsys):
    """Sampled curves are one draw: the diff measures seed-to-seed noise and says when a difference is within it."""
    _, out, _ = run(s("rope"), s("pi"), "--json", "--numeric", capsys=capsys)
    assert json.loads(out)["numeric"]["noise"] is None  # exact tables: no noise
    _, out, _ = run(s("path"), s("path_fox"), "--json", "--numeric", capsys=capsys)
    n = json.loads(out)["numeric"]
    assert n["noise"]["transport"] > 0 and n["largest"]["curve"].startswith("bias")
    assert n["largest"]["max_abs"] > 10 * n["noise"][n["largest"]["curve"]]  # the gate: far above the noise
    # same initial distribution (N(0, 1) table vs N(0, 1) embedding): the difference is noise, and says so
    code, out, _ = run(s("acc_random_qk"), s("acc_learned_qk"), "--numeric", capsys=capsys)
    largest = next(line for line in out.splitlines() if "largest difference" in line)
    assert code == 1 and largest.endswith("within sampling noise") and "sampling noise (" in out
    code, out, _ = run(s("path"), s("path_fox"), "--numeric", capsys=capsys)
    largest = next(line for line in out.splitlines() if "largest difference" in line)
    assert "within sampling noise" not in largest


def test_shared_params_apply_where_declared(capsys):
    code, out, _ = run(s("rope"), s("pi"), "-P", "factor=8", "--json", capsys=capsys)
    doc = json.loads(out)
    assert code == 1 and doc["a"]["params"] == {} and doc["b"]["params"] == {"factor": 8.0}
    assert {"op": "insert", "path": "params.factor", "value": 8.0, "semantic": True} in doc["edits"]


def test_file_colon_name_and_scheme_option(capsys, tmp_path):
    two = tmp_path / "two.pe"
    body = (SCHEMES / "rope.pe").read_text()
    two.write_text(body + "\n" + body.replace("scheme rope ", "scheme rope_b ").replace("10000.0", "20000.0"))
    code, out, _ = run(f"{two}:rope", f"{two}:rope_b", capsys=capsys)
    assert code == 1 and "~ params.base: 10000.0 -> 20000.0" in out
    code, _, _ = run(str(two), str(two), "--scheme", "rope_b", capsys=capsys)
    assert code == 0


def test_text_reads_like_a_review(capsys):
    code, out, _ = run(s("rope"), s("pi"), "--numeric", capsys=capsys)
    assert code == 1
    for needle in ("4 edits, 2 changing the meaning", "+ params.factor = 4.0",
                   "~ transport[all].phase: geometric(base) * position -> geometric(base) * position / factor",
                   "What this means", "every period x4", "3 of 16 complete a cycle", "unchanged:",
                   "Numeric", "largest difference: transport"):
        assert needle in out, needle
    _, out, _ = run(s("rope"), s("rope_accumulated"), capsys=capsys)
    assert "lowers both to the same rotary tables" in out
    _, out, _ = run(s("rope"), s("rope"), "--numeric", capsys=capsys)
    assert "identical: every curve" in out


def test_plot_writes_a_png(capsys, tmp_path):
    png = tmp_path / "curves.png"
    code, out, _ = run(s("rope"), s("pi"), "--plot", str(png), capsys=capsys)
    assert code == 1 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"plot: {png}" in out


@pytest.mark.parametrize("pair", [("rope", "pi"), ("path", "path_fox"), ("acc_random_qk", "acc_learned_qkv")])
def test_numeric_diff_does_not_import_torch(pair):
    """import torch alone takes most of the 2 s a diff may use: static and data-dependent curves are numpy."""
    code = ("import sys\nfrom pedsl.cli import main\n"
            "try:\n    main(['diff', %r, %r, '--numeric'])\nexcept SystemExit as e:\n    rc = e.code\n"
            "assert rc == 1, rc\nassert 'torch' not in sys.modules\n") % (s(pair[0]), s(pair[1]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr

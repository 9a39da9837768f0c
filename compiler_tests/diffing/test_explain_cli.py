"""`pedsl explain`: every library scheme, the frequency table, cost, lints, errors, no torch."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import pedsl
from pedsl.cli import main
from pedsl.explain import cost_rows, explain_text
from pedsl.diffing.facts import scheme_facts
from compiler_helpers import ROOT

SCHEMES = ROOT / "schemes"
LIB = sorted(p.stem for p in SCHEMES.glob("*.pe"))
SECTIONS = ("Channels", "Frequencies", "Bias", "Temperature", "Value transport", "Lowered graph", "Cost", "Lint")


def run(*args: str, capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(["explain", *args])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


@pytest.mark.parametrize("name", LIB)
def test_every_library_scheme(name, capsys):
    code, out, err = run(str(SCHEMES / f"{name}.pe"), capsys=capsys)
    assert code == 0, err
    for section in SECTIONS:
        assert f"\n{section}" in out, section
    assert "backend: " in out and "Traceback" not in out + err


def test_rope_id_frequency_table():
    text = explain_text(pedsl.load(SCHEMES / "rope_id.pe"))
    rows = re.findall(r"^\s+(\d+)\s+(\d+), (\d+)\s+([\d.e+-]+)\s+([\d.e+-]+)\s+([\d.e+-]+)\s+(yes|no)$", text, re.M)
    assert len(rows) == 8
    assert [(int(a), int(b)) for _, a, b, *_ in rows] == [(k, k + 16) for k in range(8)]
    assert float(rows[0][4]) == pytest.approx(32) and float(rows[-1][4]) == pytest.approx(64)
    assert all(r[6] == "yes" for r in rows)
    assert "tau = 1 at 128, 1.143 at 256" in text
    assert "rot    quarters(1, 3): 16 channels (0-7, 16-23)" in text
    assert "plain  rest: 16 channels (8-15, 24-31): no transport" in text


def test_rope_table_wraps_only_fast_pairs():
    text = explain_text(pedsl.load(SCHEMES / "rope.pe"))
    assert "6 of 16 complete a cycle within the training length 128" in text
    assert text.count(" yes\n") + text.endswith(" yes") == 6


def test_cost_is_relative_to_plain_attention():
    def total(name):
        rows = cost_rows(scheme_facts(pedsl.load(SCHEMES / f"{name}.pe")), 128)
        return sum(r[1] for r in rows) / rows[0][1]

    assert total("nope") == 1.0
    assert 1.0 < total("rope") < 1.1
    assert total("path") > 1.5  # O(L D) transport per token, the same order as attention
    assert total("alibi") < 1.1  # one extra key channel


def test_lint_findings_are_listed(tmp_path, capsys):
    src = (SCHEMES / "rope.pe").read_text().replace("allow frayed_frequencies", "")
    f = tmp_path / "rope.pe"
    f.write_text(src)
    code, out, _ = run(str(f), capsys=capsys)
    assert code == 0 and "warning[W101]" in out
    _, out, _ = run(str(SCHEMES / "rope.pe"), capsys=capsys)
    assert out.rstrip().endswith("no findings")


def test_params_and_value_transport(capsys):
    code, out, _ = run(str(SCHEMES / "pi.pe"), "-P", "factor=8", capsys=capsys)
    assert code == 0 and "factor = 8.0" in out and "periods 50.27" in out
    _, out, _ = run(str(SCHEMES / "acc_random_qkv.pe"), capsys=capsys)
    assert "U = T on all" in out and "mixes within 2 .. 32 tokens" in out


def test_errors_are_diagnostics(capsys):
    code, _, err = run("nowhere.pe", capsys=capsys)
    assert code == 1 and "no such file" in err and "Traceback" not in err
    code, _, err = run(str(SCHEMES / "rope.pe"), "-P", "base=0.5", capsys=capsys)
    assert code == 1 and "base" in err


def test_explain_does_not_import_torch():
    code = ("import sys\nfrom pedsl.cli import main\n"
            "try:\n    main(['explain', %r])\nexcept SystemExit as e:\n    assert e.code == 0\n"
            "assert 'torch' not in sys.modules\n") % str(SCHEMES / "path_fox.pe")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr


def test_learned_step_cost_follows_what_the_steps_read():
    """A projection of x costs 2 d P / H per token; an embedding of the token is a lookup (P),
    whatever the source text says (a let named 'linear_ish' must not fool it)."""
    def steps_row(src):
        rows = cost_rows(scheme_facts(pedsl.load(src, heads=4, head_dim=16)), 128)
        return next(r for r in rows if r[0].startswith("accumulated SO(2)"))

    x_row = steps_row(SCHEMES / "acc_learned_qkv.pe")
    tok_row = steps_row(SCHEMES / "acc_learned_qk.pe")
    aliased = steps_row("scheme t { let linear_ish = embedding(token, to = pair)\n"
                        "  qk: accumulate(rotation(0.1 * linear_ish)) }")
    assert "projection of x" in x_row[3] and "table lookup" in tok_row[3] and "table lookup" in aliased[3]
    P, d, H = 8, 64, 4
    assert x_row[1] - tok_row[1] == pytest.approx(2.0 * d * P / H - P + (4 - 2) * 3 * 16)  # qkv rotates 4 tensors

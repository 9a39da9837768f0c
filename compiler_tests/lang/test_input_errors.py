"""Inputs that passed `pedsl check` (or reached a command) and then ended in an internal error (exit 3):
a long name, a deeply nested scheme, an integer of hundreds of digits. Each is now either a positioned
diagnostic or a scheme that compiles to a module equal to the in-process one."""

from __future__ import annotations

import pytest

from compiler_helpers import assert_generated_module_matches, first_error, run_cli
from pedsl import limits
from pedsl.compiler import compile_scheme
from pedsl.compiler.codegen import MAX_CODE_NESTING, code_nesting, generate
from pedsl.lang.api import check, load

ROPE = "qk: rotate(geometric(10000) * position)"


def scheme(body: str, doc: str = "x") -> str:
    return f'scheme s "{doc}" {{\n  param base: float = 10000.0\n{body}\n}}\n'


def let_chain(n: int, step: str = "abs({prev})", start: str = "position") -> str:
    """n lets, each a function of the previous one."""
    lines = [f"  let a0 = {start}"] + [f"  let a{i} = " + step.format(prev=f"a{i - 1}") for i in range(1, n + 1)]
    return "\n".join(lines)


# ------------------------------------------------------------------ names


@pytest.mark.parametrize("text,col", [
    ("scheme " + "s" * 300 + " { " + ROPE + " }\n", 8),
    ("scheme s { let " + "w" * 101 + " = geometric(10000)\n qk: rotate(geometric(10000) * position) }\n", 16),
    ("scheme s { param " + "p" * 200 + ": float = 1.0\n " + ROPE + " }\n", 18),
])
def test_a_name_over_the_limit_is_a_positioned_diagnostic(text, col):
    d = first_error(text)
    assert (d.code, d.line, d.col) == ("E104", 1, col), d.render()
    assert f"the limit is {limits.MAX_NAME}" in d.message


def test_a_scheme_name_of_300_characters_through_the_cli(tmp_path):
    f = tmp_path / "long.pe"
    f.write_text("scheme " + "s" * 300 + " { " + ROPE + " }\n")
    for cmd in (["check", f], ["compile", f, "-o", tmp_path / "out"], ["show", f]):
        code, out, err = run_cli(*cmd)
        assert code == 1 and "E104" in out + err, (cmd, out + err)
    assert not (tmp_path / "out").exists()


def test_a_name_at_the_limit_compiles(tmp_path):
    name = "s" * limits.MAX_NAME
    f = tmp_path / "long.pe"
    f.write_text(f"scheme {name} {{ {ROPE} }}\n")
    code, out, err = run_cli("compile", f, "-o", tmp_path / "out")
    assert code == 0, out + err
    assert (tmp_path / "out" / f"{name}.py").is_file()


# ------------------------------------------------------------------ numbers


BIG = "9" * 400


@pytest.mark.parametrize("text,number", [
    (f"scheme s {{ param big: int = {BIG}\n {ROPE} }}\n", BIG),
    (f"scheme s {{ qk: rotate(geometric({BIG}) * position) }}\n", BIG),
    (f"scheme s {{ {ROPE}\n temperature = 1 + {'1' * 5000} }}\n", "1" * 5000),  # past int()'s 4300 digits
    (f"scheme s {{ param big: float = -1{'0' * 309}\n {ROPE} }}\n", "1" + "0" * 309),  # just past the float range
])
def test_an_integer_literal_beyond_the_float_range_is_a_positioned_diagnostic(text, number):
    before = text[: text.index(number)]
    d = first_error(text)
    assert (d.code, d.line, d.col) == ("E113", before.count("\n") + 1, len(before.rsplit("\n", 1)[-1]) + 1), d.render()
    assert "too large for a float" in d.message and len(d.message) < 200


def test_the_largest_integer_literal_a_float_holds_is_read():
    n = int(1.7976931348623157e308)
    sch = load(f"scheme s {{ param big: float = {n}\n {ROPE} }}\n")
    assert sch.params["big"] == 1.7976931348623157e308


@pytest.mark.parametrize("cmd", ["check", "show", "export-hf", "compile"])
@pytest.mark.parametrize("value", [BIG, "-" + BIG, "9" * 5000])
def test_a_huge_integer_through_P_is_a_diagnostic(cmd, value, tmp_path):
    extra = ["-o", str(tmp_path / "out")] if cmd == "compile" else []
    code, out, err = run_cli(cmd, "rope", "-P", f"base={value}", *extra)
    assert code == 1 and "E302" in out + err, out + err
    assert "characters" in out + err and len(out + err) < 2000  # the value is cut, not printed whole


def test_a_huge_integer_through_P_for_an_int_parameter(tmp_path):
    f = tmp_path / "s.pe"
    f.write_text("scheme s { param k: int = 1\n qk: rotate(geometric(10000) * position * k) }\n")
    for value in (BIG, "9" * 5000):
        code, out, err = run_cli("check", f, "-P", f"k={value}")
        assert code == 1 and "E302" in out + err, out + err
    code, out, err = run_cli("check", "rope", "-P", f"heads={BIG}")
    assert code == 1 and "E302" in out + err, out + err


def test_a_huge_integer_through_P_on_train_writes_nothing(tmp_path):
    code, out, err = run_cli("train", "rope", "-P", f"base={BIG}", "--out", tmp_path / "run", "--steps", "1")
    assert code == 1 and "E302" in out + err, out + err
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ nesting


@pytest.mark.parametrize("doc", ['a \\" b', 'ends in a backslash \\\\', '\\\\\\" still inside'])
@pytest.mark.parametrize("depth", [120, 5000])
@pytest.mark.parametrize("opener", ["(", "abs("])
def test_the_nesting_guard_reads_escapes_in_strings(doc, depth, opener):
    """An escaped quote (or an escaped backslash before the closing quote) in a description does not
    switch the bracket guard off for the rest of the file."""
    text = scheme(f"  qk: rotate({opener * depth}position{')' * depth} * geometric(base))", doc=doc)
    d = first_error(text)
    assert (d.code, d.line) == ("E103", 3), d.render()
    assert "nested more than 64" in d.message


def test_a_hash_after_an_escaped_backslash_is_a_comment():
    """The comment finder reads escapes as the grammar does: '"a\\\\" # c' is a string, then a comment."""
    from pedsl.lang.parser import parse_module

    mod = parse_module('scheme s "a\\\\" { ' + ROPE + ' } # c "quoted"\n')
    assert [c.text for c in mod.comments] == ['# c "quoted"']


# Shapes near the depth the checker accepts (it stops at about 200 levels, fewer where the stack is already
# deep): each passes `pedsl check`, so each must compile.
DEEP = {
    "let_chain_100_abs": scheme(let_chain(100) + "\n  qk: rotate(a100 * geometric(base))"),
    "let_chain_150_abs": scheme(let_chain(150) + "\n  qk: rotate(a150 * geometric(base))"),
    "plus_chain_190": scheme("  qk: rotate((" + " + ".join(["position"] * 190) + ") / 190 * geometric(base))"),
    "minus_chain_199": scheme("  qk: rotate(" + "- " * 199 + "position * geometric(base))"),
    "let_chain_bias": scheme(let_chain(150, start="distance") + "\n  bias = -0.01 * a150"),
    "let_chain_temperature": scheme("  qk: rotate(geometric(base) * position)\n"
                                    + let_chain(90, "sqrt(abs({prev}))", start="log_length(64)")
                                    + "\n  temperature = a90\n  train {\n    context = 64\n  }"),
    "let_chain_gate": scheme(let_chain(150, step="{prev} - 0.001", start="log_sigmoid(linear(x, to = head))")
                             + "\n  bias = accumulate(a150)"),
    "nested_calls_in_brackets": scheme("  qk: rotate(" + "abs(" * 62 + "position" + ")" * 62 + " * geometric(base))"),
}


@pytest.mark.parametrize("name", sorted(DEEP))
def test_every_scheme_that_checks_compiles_to_an_equal_module(name, tmp_path):
    text = DEEP[name]
    assert check(text) is not None  # passes the checker
    mod = compile_scheme(text, d_model=24)
    src = generate(mod.scheme, mod.plan, d_model=24 if mod.needs_x else None)
    assert max(code_nesting(line) for line in src.splitlines()) <= MAX_CODE_NESTING + 8
    assert_generated_module_matches(mod, src, tmp_path / f"deep_{name}.py")


def test_the_100_let_chain_compiles_through_the_cli(tmp_path):
    f = tmp_path / "lets.pe"
    f.write_text(DEEP["let_chain_100_abs"])
    assert run_cli("check", f)[0] == 0
    code, out, err = run_cli("compile", f, "-o", tmp_path / "out")
    assert code == 0, out + err
    assert (tmp_path / "out" / "s.py").is_file()


def test_a_shallow_scheme_is_generated_without_locals():
    """Binding sub-expressions to locals is for deep schemes only: the library's modules stay one line per value."""
    mod = compile_scheme("scheme s { qk: rotate(abs(abs(position)) * geometric(10000)) }\n")
    src = generate(mod.scheme, mod.plan)
    assert "e1 = " not in src and "torch.abs(_t(torch.abs(_t(pos5, dev)), dev))" in src


def test_code_nesting_skips_string_literals():
    assert code_nesting("f(a['x)]'], \"((\", b)") == 2
    assert code_nesting("'\\'(('") == 0
    assert code_nesting("f(x)  # ((((\ng((y))") == 2

"""`pedsl compile` output cannot be injected: scheme text is data, generated names never clash.

Every generated module is imported in one fresh interpreter (with a sentinel file that any
injected code would create) and compared with the in-process module on a small input.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler_helpers import run_cli
from pedsl.compiler import compile_scheme
from pedsl.compiler.codegen import generate, module_file_name
from pedsl.compiler.pysafe import THIRD_PARTY, Names, comment, literal, module_file_stem, text_block
from pedsl.lang.statements import KEYWORDS

IMPORTER = r"""
def import_and_run(cases):
    import importlib, importlib.util, os, sys
    import torch
    out = []
    for c in cases:
        if c["by_name"]:  # as a user would: the folder first on sys.path, `import <stem>`
            sys.path.insert(0, c["folder"])
            try:
                m = importlib.import_module(c["stem"])
            finally:
                sys.path.pop(0)
            if os.path.realpath(m.__file__) == os.path.realpath(c["path"]):
                del sys.modules[c["stem"]]
        else:
            spec = importlib.util.spec_from_file_location(c["alias"], c["path"])
            m = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(m)
        io = torch.load(c["io"], weights_only=True)
        o = m.Module().double()(io["q"], io["k"], io["v"])
        out.append({"file": str(m.__file__), "doc": m.__doc__, "source": getattr(m, "SCHEME_SOURCE", None),
                    "err": float((o - io["o"]).abs().max())})
    return out
"""
#: A fresh interpreter: which top-level modules importing torch loads, then every case imported and run.
SUBPROCESS = ("import json, sys\nbefore = {m.split('.')[0] for m in sys.modules}\nimport torch\n"
              "loaded = sorted({m.split('.')[0] for m in sys.modules} - before)\n" + IMPORTER
              + "print(json.dumps({'loaded': loaded, 'cases': import_and_run(json.loads(sys.argv[1]))}))\n")


def _pe_string(text: str) -> str:
    """``text`` as a .pe string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _scheme(name: str, doc: str | None = None, groups=("a", "b"), comment_text: str = "", extends: str = "",
            label: str = "") -> str:
    g1, g2 = groups
    doc_part = f" {_pe_string(doc)}" if doc is not None else ""
    label_param = f"  param label: str = {_pe_string(label)}\n" if label else ""
    return (f"# {comment_text}\n"
            f"scheme {name}{extends}{doc_part} {{  # {comment_text}\n"
            f"{label_param}"
            "  layout halves\n"
            f"  channels {{\n    {g1} = quarters(1, 2)  # {comment_text}\n    {g2} = rest\n  }}\n"
            f"  qk on {g1}: rotate(geometric(10000.0) * position)\n"
            f"  qk on {g2}: rotate(geometric(500.0) * position * 0.5)\n"
            "  bias = -slopes(heads) * distance\n"
            "}\n")


class Batch:
    """Generated modules waiting to be imported together in one subprocess."""

    def __init__(self, root: Path):
        self.root = root
        self.cases: list[dict] = []
        self.sentinel = root / "PWNED"

    def add(self, pe: Path, *, by_name: bool = False, scheme: str | None = None) -> dict:
        mod = compile_scheme(pe, scheme=scheme, num_heads=2, head_dim=8)
        src = generate(mod.scheme, mod.plan)
        ast.parse(src)
        n = len(self.cases)
        folder = self.root / f"m{n}"
        folder.mkdir()
        path = folder / module_file_name(mod.scheme)
        path.write_text(src, encoding="utf-8")
        g = torch.Generator().manual_seed(n)
        q, k, v = (torch.randn(1, mod.heads, 6, mod.head_dim, generator=g, dtype=torch.float64) for _ in range(3))
        torch.save({"q": q, "k": k, "v": v, "o": mod.double()(q, k, v).detach()}, folder / "io.pt")
        case = {"path": str(path), "folder": str(folder), "stem": path.stem, "alias": f"generated_{n}",
                "io": str(folder / "io.pt"), "by_name": by_name, "scheme": mod.scheme}
        self.cases.append(case)
        return case

    def run(self, fresh_interpreter: bool = False) -> list[str]:
        """Import every case (here, or in one new interpreter), check it matches; the modules torch loaded there."""
        cases = [{k: v for k, v in c.items() if k != "scheme"} for c in self.cases]
        loaded = []
        if fresh_interpreter:
            res = subprocess.run([sys.executable, "-c", SUBPROCESS, json.dumps(cases)], capture_output=True, text=True,
                                 cwd=self.root, timeout=300)
            assert res.returncode == 0, res.stderr[-3000:]
            reply = json.loads(res.stdout)
            results, loaded = reply["cases"], reply["loaded"]
        else:
            namespace: dict = {}
            exec(IMPORTER, namespace)  # noqa: S102 - the importer above, run in this process
            results = namespace["import_and_run"](cases)
        assert not self.sentinel.exists(), "importing a generated module ran code from the scheme"
        for case, r in zip(self.cases, results):
            assert Path(r["file"]).resolve() == Path(case["path"]).resolve(), (case["stem"], r["file"])
            assert r["err"] < 1e-10, (case["stem"], r["err"])
            sch = case["scheme"]
            assert r["doc"].startswith(f"{sch.name}: {sch.doc or 'a positional-encoding scheme'}\n")
            assert r["source"] == sch.source.rstrip("\n") + "\n"
        return loaded


def _payload(sentinel: Path) -> str:
    return f'RoPE """ \'\'\';__import__("pathlib").Path({str(sentinel)!r}).touch()\nclass Evil:\n    x = """'


def test_description_cannot_run_code_on_import(tmp_path):
    """The issue's payload, compiled through the CLI, then imported by name."""
    batch = Batch(tmp_path)
    pe = tmp_path / "evil.pe"
    pe.write_text(_scheme("evil", _payload(batch.sentinel), comment_text='"""; import os #'), encoding="utf-8")
    code, out, err = run_cli("compile", pe, "-o", tmp_path / "out")
    assert code == 0, out + err
    text = (tmp_path / "out" / "evil.py").read_text()
    tree = ast.parse(text)
    # the general forward's classes and the module's own class Evil, and no second class Evil
    from pedsl.compiler import compile_scheme
    from pedsl.compiler.embedded import Carried, embedded_section

    mod = compile_scheme(pe)  # the sections its module carries: the general forward's, and the kernels' it runs
    general = [s.name for s in ast.parse("".join(embedded_section(m) for m in Carried.of(mod.plan).modules())).body
               if isinstance(s, ast.ClassDef)]
    native = ["Kernels"] if Carried.of(mod.plan).kernels_class() else []  # the C++ kernels' class, where carried
    assert [s.name for s in tree.body if isinstance(s, ast.ClassDef)] == general + native + ["Evil"]
    assert ast.get_docstring(tree).startswith("evil: " + _payload(batch.sentinel))
    batch.add(pe, by_name=True)
    batch.run()


def test_description_from_an_imported_base_cannot_run_code(tmp_path):
    batch = Batch(tmp_path)
    (tmp_path / "base.pe").write_text(_scheme("evil", _payload(batch.sentinel)), encoding="utf-8")
    child = tmp_path / "child.pe"
    child.write_text('import "base.pe"\n\nscheme child extends evil {\n}\n', encoding="utf-8")
    case = batch.add(child, by_name=True)
    assert case["scheme"].doc == _payload(batch.sentinel)  # inherited: the child file looks clean
    batch.run()


def test_backslashes_and_triple_quotes_in_comments_and_descriptions(tmp_path):
    batch = Batch(tmp_path)
    texts = ['back\\slash', 'ends with a backslash \\', '"""', "'''", 'a """ b \'\'\' c \\" d', "\\n \\x00 \\u1234 {x}",
             "tab\tand é and \U0001F600"]
    for i, t in enumerate(texts):
        pe = tmp_path / f"s{i}.pe"
        pe.write_text(_scheme(f"s{i}", t, comment_text=t.replace("\n", " "), label=t), encoding="utf-8")
        batch.add(pe)
    batch.run()


def test_groups_differing_only_in_case_keep_their_own_channels(tmp_path):
    """a_b and A_B once shared the generated constants A_B_FIRST/SECOND (the module computed another function)."""
    batch = Batch(tmp_path)
    pe = tmp_path / "ab.pe"
    pe.write_text(_scheme("ab", "two groups", groups=("a_b", "A_B")), encoding="utf-8")
    batch.add(pe)
    pe2 = tmp_path / "clash.pe"  # a group named like another group's generated constant
    pe2.write_text(_scheme("clash", groups=("x", "x_first")), encoding="utf-8")
    batch.add(pe2)
    batch.run()


NAMES = ["none", "f", "f64", "grp", "class", "torch", "nn", "math", "Module", "value_error", "two_pi", "heads",
         "os", "sys", "json", "numpy", "pedsl", "_t", "_axis", "annotations", "match"]


def test_scheme_names_that_clash_with_python_or_the_module(tmp_path):
    batch = Batch(tmp_path)
    for name in NAMES:
        pe = tmp_path / f"{name}.pe"
        pe.write_text(_scheme(name, f"named {name}"), encoding="utf-8")
        case = batch.add(pe, by_name=True)
        stem = case["stem"]
        assert importlib.util.find_spec(stem) is None, f"{stem}.py would shadow an installed module"
    batch.run()


def test_compile_command_names_the_file_so_it_imports(tmp_path):
    pe = tmp_path / "grp.pe"
    pe.write_text(_scheme("grp", "a stdlib name"), encoding="utf-8")
    code, out, err = run_cli("compile", pe, "-o", tmp_path / "out")
    assert code == 0, out + err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["eval.yaml", "grp_scheme.py", "train.yaml"]


def test_names_allocator_is_injective_and_avoids_reserved_names():
    names = Names({"HEADS", "F64"})
    hints = ["A_B", "a_b", "A_B", "A_B_2", "class", "None", "F64", "print", "1x", "", "a-b", "a b", "__init__",
             "HEADS", "é", "__x", "___"]
    got = [names.new(h) for h in hints]
    assert len(set(got)) == len(got)
    import builtins
    import keyword

    for g in got:
        assert g.isidentifier() and not keyword.iskeyword(g) and not keyword.issoftkeyword(g)
        assert g not in dir(builtins) and g not in {"HEADS", "F64"} and not g.startswith("__")


def test_literals_and_comments_are_data():
    for value in ['"""', "'''", "\\", "a\nb\rc\x0cd\u2028e", 1e308 * 10, -1e308 * 10, float("nan"), (1.5,), [1, 2],
                  {"k": "v'\""}, None, True]:
        text = literal(value)
        back = eval(text, {"__builtins__": {"float": float}})  # noqa: S307 - the point is that it is a literal
        assert back == value or (value != value and back != back)
    for text in ["a\nimport os", "x\r\ny", "é \u2028 \x0b", '"""']:
        line = comment(text)
        assert "\n" not in line and "\r" not in line and line.isascii() and line.isprintable()
        assert next(tokenize.generate_tokens(iter([line]).__next__)).type == tokenize.COMMENT
    block = text_block("first '''\nsecond \"\"\" \\\n")
    assert ast.literal_eval(block) == "first '''\nsecond \"\"\" \\\n"
    assert module_file_stem("grp") == "grp_scheme" and module_file_stem("rope") == "rope"
    assert module_file_stem("class") == "class_scheme" and module_file_stem("Torch") == "Torch_scheme"


# ------------------------------------------------------------------------------------------------
# The property: random descriptions, comments, string parameters, scheme and group names.
# ------------------------------------------------------------------------------------------------
_TEXT_CHARS = st.characters(blacklist_categories=("Cs", "Cc"))
_FRAGMENTS = ['"""', "'''", "\\", "\\n", "\n", "#", "{", "}", "\t", "__import__('os')", "\nclass X:\n    y = 1\n",
              "');print('x", "\\N{", "\\x", "\x0b"]
_IDENT = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True).filter(lambda s: s not in KEYWORDS)
_INTERESTING = st.sampled_from(["none", "f", "f64", "grp", "class", "torch", "nn", "math", "F", "C2", "L", "q",
                                "HEADS", "ALL_FIRST", "a_b", "A_B", "self", "Module", "print", "_rotate", "__x",
                                "__init__"])


def _texts(payload: str):
    return st.lists(st.one_of(st.text(_TEXT_CHARS, max_size=8), st.sampled_from(_FRAGMENTS + [payload])),
                    max_size=5).map("".join)


def test_generated_modules_parse_import_cleanly_and_match(tmp_path):
    batch = Batch(tmp_path)
    payload = f"\n__import__('pathlib').Path({str(batch.sentinel)!r}).touch()\n"

    @settings(max_examples=25, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(name=st.one_of(_INTERESTING, _IDENT), doc=st.one_of(st.none(), _texts(payload)),
           note=_texts(payload).map(lambda s: s.replace("\n", " ").replace("\x0b", " ")),
           label=_texts(payload), g1=st.one_of(_INTERESTING, _IDENT), g2=st.one_of(_INTERESTING, _IDENT))
    def collect(name, doc, note, label, g1, g2):
        if g1 == g2 or len(batch.cases) >= 25:
            return
        pe = tmp_path / f"case{len(batch.cases)}.pe"
        pe.write_text(_scheme(name, doc, groups=(g1, g2), comment_text=note, label=label), encoding="utf-8")
        case = batch.add(pe, scheme=name)
        assert case["scheme"].doc == (doc or "") and case["scheme"].params.get("label", "") == label

    collect()
    assert len(batch.cases) >= 10
    loaded = batch.run(fresh_interpreter=True)
    # the file naming avoids every third-party module that importing torch loads
    assert "torch" in loaded and {m for m in loaded if not m.startswith("__")} - set(sys.stdlib_module_names) <= THIRD_PARTY


@pytest.mark.parametrize("bug", ["spliced docstring", "name bound twice"])
def test_validation_refuses_a_broken_module(bug, monkeypatch):
    """The generated text is parsed before it is returned: a generator bug is an internal error, not a file."""
    from pedsl.compiler import codegen

    mod = compile_scheme('scheme s "a \\"\\"\\" b" { layout halves\n qk: rotate(geometric(100.0) * position) }')
    if bug == "spliced docstring":  # what codegen did before: text between triple quotes
        monkeypatch.setattr(codegen, "text_block", lambda text, indent="": '"""' + text + '"""')
    else:
        real = codegen.embedded_section
        monkeypatch.setattr(codegen, "embedded_section",
                            lambda m: "Module = 1\n" if m == "compiler.kernels_template" else real(m))
    with pytest.raises(RuntimeError, match="codegen produced"):
        generate(mod.scheme, mod.plan)

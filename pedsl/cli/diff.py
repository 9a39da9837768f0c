"""``pedsl diff`` and ``pedsl explain``.

``pedsl diff A.pe B.pe [--scheme NAME | A.pe:NAME B.pe:NAME] [-P n=v] [-A n=v] [-B n=v]
[--json] [--numeric] [--plot FILE]``: the edits between the two resolved schemes, what
they mean, and (``--numeric``) their score kernels compared on the same random inputs.
Exit code 0 when the schemes are equivalent, 1 when they differ, 2 on any error (like
``diff``). Nothing here imports torch (``--numeric`` included: see pedsl.diffing.sample).

``pedsl explain FILE [--scheme NAME] [-P n=v]``: a readable summary of one scheme.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click

from pedsl.cli.option_rules import given, refuse_given
from pedsl.cli.options import raw_params as parse_params
from pedsl.diffing import numeric as N, report
from pedsl.diffing.edits import Edit, Insert, Keep, Move, Remove, Update, diff as diff_schemes
from pedsl.diffing.facts import scheme_facts
from pedsl.diffing.summary import same_meaning_note, summarize
from pedsl.errors import EvalError, PedslError, UsageError, did_you_mean
from pedsl.explain import explain_text
from pedsl.fsio import figure_format
from pedsl.lang.api import load, load_with_warnings
from pedsl.limits import MAX_LENGTH, MAX_SEED, check_tensor


def _fail(err: PedslError) -> None:
    for d in err.diagnostics:
        click.echo(d.render(), err=True)
    click.get_current_context().exit(2)


def split_target(arg: str) -> tuple[str, str | None]:
    """'file.pe:NAME' -> ('file.pe', 'NAME'); a plain path (even one containing ':') stays whole."""
    if ":" in arg and not Path(arg).exists():
        path, _, name = arg.rpartition(":")
        if name.isidentifier() and path:
            return path, name
    return arg, None


def _parse(items) -> dict[str, str]:
    return parse_params(items)


def load_side(target: str, scheme: str | None, shared: dict, own: dict, label: str):
    """Resolve one side: shared -P values apply where the scheme declares them, -A/-B ones always."""
    path, name = split_target(target)
    name = name or scheme
    try:
        plain = load(Path(path), scheme=name)
        params = {k: v for k, v in shared.items() if k in plain.params}
        params.update(own)
        sch = load(Path(path), params=params or None, scheme=name) if params else plain
    except PedslError as err:
        for i, d in enumerate(err.diagnostics):
            if d.file is None:
                err.diagnostics[i] = dataclasses.replace(d, file=path)
        raise
    return sch, path, {k: sch.params[k] for k in params if k in sch.params}


@click.command()
@click.argument("a", required=False)
@click.argument("b", required=False)
@click.option("--scheme", "scheme_name", metavar="NAME",
              help="The scheme in both files (or write A.pe:NAME B.pe:NAME).")
@click.option("-P", "--param", "params", multiple=True, metavar="NAME=VALUE",
              help="Override a parameter on each side that declares it (repeatable).")
@click.option("-A", "params_a", multiple=True, metavar="NAME=VALUE", help="Override a parameter of A only.")
@click.option("-B", "params_b", multiple=True, metavar="NAME=VALUE", help="Override a parameter of B only.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (see --json-schema).")
@click.option("--json-schema", "json_schema", is_flag=True, help="Print the JSON Schema of --json and exit.")
@click.option("--numeric", is_flag=True, help="Compare the score kernels vs distance on the same random inputs.")
@click.option("--plot", metavar="FILE", help="Draw both schemes' curves to FILE (implies --numeric).")
@click.option("--lmax", default=256, show_default=True, type=click.IntRange(1, 8192), help="Largest distance.")
@click.option("--samples", default=8, show_default=True, type=click.IntRange(1, 1024), help="Random unit vectors.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(0, MAX_SEED), help="Seed for vectors, data and learned parameters.")
def diff(a, b, scheme_name, params, params_a, params_b, as_json, json_schema, numeric, plot, lmax, samples, seed):
    """Show what scheme B changes relative to scheme A: edits, meaning, numbers.

    A and B are resolved first (imports, extends, -P), so layout, comments and
    let-names never show. --numeric compares, for d = 0..LMAX, the mean over
    unit vectors u of <u, T(j -> j+d) u> (the logit contribution of a key whose
    content matches the query, d tokens back), the bias per head and the
    temperature. Data-dependent schemes are sampled at initialisation (the
    compiled module's expressions and initial distributions, in numpy) with the
    same seeded x, tokens and per-site learned parameters on both sides; a second
    seed measures the sampling noise, and differences within it are marked.

    Exit code 0 when the schemes are equivalent (at most the name, doc or lint
    allowances differ), 1 when they differ, 2 on an error.
    """
    if json_schema:
        _refuse_beside_json_schema(a, b)
        click.echo(json.dumps(report.JSON_SCHEMA, indent=2))
        return 0
    if not a or not b:
        raise click.UsageError("pedsl diff needs two schemes: pedsl diff A.pe B.pe (or A.pe:NAME B.pe:NAME)")
    if not (numeric or plot):
        refuse_given(["lmax", "samples", "seed"], "not used without --numeric or --plot (they set the numeric "
                     "comparison)", hint="add --numeric, or drop them")
    if scheme_name is not None and split_target(a)[1] and split_target(b)[1]:
        raise UsageError(f"--scheme {scheme_name}: both sides already name their scheme ({a}, {b})",
                         hint="drop --scheme, or the :NAME of the files")
    try:
        shared, own_a, own_b = _parse(params), _parse(params_a), _parse(params_b)
        sa, path_a, pa = load_side(a, scheme_name, shared, own_a, "A")
        sb, path_b, pb = load_side(b, scheme_name, shared, own_b, "B")
        unused = [k for k in shared if k not in sa.params and k not in sb.params]
        if unused:
            raise UsageError(f"-P {unused[0]}: neither {sa.name} nor {sb.name} has a parameter '{unused[0]}'",
                             code="E992", hint=" ".join(filter(None, [
                                 did_you_mean(unused[0], [*sa.params, *sb.params]),
                                 "parameters of A: " + (", ".join(sa.params) or "none")
                                 + "; of B: " + (", ".join(sb.params) or "none")])))
        doc = build(sa, sb, path_a, path_b, pa, pb, numeric=numeric or bool(plot), plot=plot,
                    lmax=lmax, samples=samples, seed=seed,
                    sampling_given=tuple(f"--{n}" for n in ("samples", "seed") if given(n)))
    except PedslError as err:
        _fail(err)
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    else:
        kinds = {"insert": Insert, "remove": Remove, "move": Move, "update": Update, "keep": Keep}
        edits: list[Edit] = []
        for e in doc["edits"]:
            cls = kinds[e["op"]]
            if cls is Move:
                edits.append(Move(e["path"], e["new_path"]))
            elif cls is Update:
                edits.append(Update(e["path"], e["old"], e["new"]))
            else:
                edits.append(cls(e["path"], e["value"]))
        summary = [(s["topic"], s["before"], s["after"]) for s in doc["summary"]]
        click.echo(report.render_text(_label(path_a, sa), _label(path_b, sb), edits, summary, doc["note"],
                                      doc["numeric"]))
    click.get_current_context().exit(0 if doc["equivalent"] else 1)


def _refuse_beside_json_schema(a, b) -> None:
    """--json-schema prints the schema and nothing else: anything given beside it would be ignored."""
    ctx = click.get_current_context()
    others = [p.name for p in ctx.command.params if p.name != "json_schema" and isinstance(p, click.Option)]
    if a or b:
        raise UsageError("--json-schema prints the schema of --json and takes no schemes", hint="drop A and B")
    refuse_given(others, "not used with --json-schema (it prints the schema of --json only)",
                 hint="drop them, or drop --json-schema")


def _label(path: str, s) -> str:
    return f"{path}:{s.name}"


def build(sa, sb, path_a, path_b, pa, pb, *, numeric=False, plot=None, lmax=256, samples=8, seed=0,
          sampling_given: tuple[str, ...] = ()) -> dict:
    """The JSON document of a diff (what --json prints; the text report renders it). ``sampling_given``:
    the sampling options the user gave (refused when neither side is sampled)."""
    edits = diff_schemes(sa, sb)
    fa, fb = scheme_facts(sa), scheme_facts(sb)
    summary = summarize(fa, fb, edits)
    num = numeric_section(sa, sb, lmax=lmax, samples=samples, seed=seed, plot=plot,
                          sampling_given=sampling_given) if numeric else None
    return report.to_json({"file": path_a, "scheme": sa.name, "params": pa},
                          {"file": path_b, "scheme": sb.name, "params": pb},
                          edits, summary, same_meaning_note(fa, fb), num)


def score_dependent(s) -> list[str]:
    """What of scheme ``s`` depends on the scores, which no curve over distances shows."""
    out = []
    if s.contextual is not None:
        out.append(f"{s.name}: contextual = {s.contextual.source()} (its positions are counted from the scores)")
    if s.normalize != "softmax":
        out.append(f"{s.name}: normalize = {s.normalize} (its weights are no softmax of the logits)")
    return out


def numeric_section(sa, sb, *, lmax: int, samples: int, seed: int, plot: str | None,
                    sampling_given: tuple[str, ...] = ()) -> dict:
    if plot:
        figure_format(plot)  # a bad --plot path fails before the curves are computed
    for s in (sa, sb):  # the sampled inputs: (samples, lmax + STARTS, heads * head_dim) float64
        too_big = check_tensor("diff --numeric", samples * (lmax + N.STARTS) * s.heads * s.head_dim, 8,
                               f"{samples} samples x {lmax + N.STARTS} positions x {s.heads * s.head_dim} "
                               f"channels of {s.name}, float64")
        if too_big:
            raise UsageError(too_big, code="E994", hint="lower --samples or --lmax")
    try:
        ca = N.curves(sa, lmax=lmax, samples=samples, seed=seed)
        cb = N.curves(sb, lmax=lmax, samples=samples, seed=seed)
    except PedslError:
        raise
    except (RuntimeError, ValueError) as exc:
        raise EvalError(f"the numeric comparison failed: {exc}", code="E993",
                        hint="run without --numeric, or report this with the two files") from None
    if sampling_given and not (ca.method.startswith("sampled") or cb.method.startswith("sampled")):
        raise UsageError(f"{', '.join(sampling_given)}: not used here: {sa.name} and {sb.name} are static, so their "
                         "curves are exact tables, not samples", hint="drop them (they matter for data-dependent "
                         "or learned schemes)")
    rows = N.compare(ca, cb)
    out = {
        "lmax": lmax, "samples": samples, "seed": seed, "method_a": ca.method, "method_b": cb.method,
        "largest": vars(N.largest(rows)), "curves": [vars(r) for r in rows],
        "noise": N.seed_noise([(sa, ca), (sb, cb)], lmax=lmax, samples=samples, seed=seed),
        "transport_a": [float(v) for v in ca.transport], "transport_b": [float(v) for v in cb.transport],
        "plot": None, "not_in_curves": score_dependent(sa) + score_dependent(sb),
    }
    if plot:
        N.plot(ca, cb, plot, (sa.name + " (A)", sb.name + " (B)"))  # through pedsl.fsio: OutputError
        out["plot"] = plot
    return out


@click.command()
@click.argument("file")
@click.option("--scheme", "scheme_name", metavar="NAME", help="The scheme to explain (or write FILE:NAME).")
@click.option("-P", "--param", "params", multiple=True, metavar="NAME=VALUE", help="Override a scheme parameter.")
@click.option("--context", type=click.IntRange(1, MAX_LENGTH), default=None,
              help="Context length for the cost estimate (default: the training length).")
def explain(file, scheme_name, params, context):
    """Summarise what one scheme does: channels, frequencies, bias, temperature, graph, cost, lints."""
    path, name = split_target(file)
    if name and scheme_name is not None:
        raise UsageError(f"--scheme {scheme_name}: '{file}' already names its scheme",
                         hint="drop --scheme, or the :NAME of the file")
    try:
        overrides = _parse(params)
        scheme, warnings = load_with_warnings(Path(path), overrides or None, name or scheme_name)
        text = explain_text(scheme, warnings, context=context, file=path)
    except PedslError as err:  # like check/show: a diagnostic and exit code 1 (usage errors: 2)
        for i, d in enumerate(err.diagnostics):
            if d.file is None:
                err.diagnostics[i] = dataclasses.replace(d, file=path)
        raise
    click.echo(text)
    return 0

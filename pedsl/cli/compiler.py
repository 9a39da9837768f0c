"""`pedsl graph` and `pedsl compile`: what the compiler decided, and its output files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click
import networkx as nx

from pedsl.cli.options import output_path, raw_params
from pedsl.compiler import compile_graph
from pedsl.compiler.codegen import generate, module_file_name
from pedsl.compiler.graph import lower
from pedsl.compiler.passes import Options, optimize
from pedsl.compiler.plan import plan_lines, plan_to_json, site_name
from pedsl.errors import CompileError
from pedsl.fsio import atomic_write_text, ensure_dir
from pedsl.lang.api import load
from pedsl.lang.exprs import to_source
from pedsl.lang.frequencies import axis_frequencies
from pedsl.lang.layers import layer_map_lines
from pedsl.lang.library import is_library_name
from pedsl.lang.types import Ty
from pedsl.limits import MAX_D_MODEL, MAX_HEAD_DIM, MAX_HEADS
from pedsl.scheme_config import eval_config, train_config

BACKEND_CHOICES = ("auto", "sdpa", "flex", "blockwise", "masked", "reference")


def _scheme_and_shapes(file: str, scheme: str | None, params: dict, heads, head_dim, d_model):
    """The resolved scheme with the model shapes of its training config (so compile matches train)."""
    sch = load(file, params=params or None, scheme=scheme)
    cfg = train_config(sch, file, params=params)
    heads = heads or cfg.model.n_heads
    head_dim = head_dim or cfg.model.head_dim
    d_model = d_model or cfg.model.d_model
    sch = load(file, params=params or None, scheme=scheme, heads=heads, head_dim=head_dim)
    return sch, cfg, d_model


_PASS_STATE = ("note", "kernel")  # what the passes decide lives in the plan; nodes show only what they compute


def _plan_notes(plan) -> dict[str, str]:
    """One line per graph node the plan has a decision for (the transport, bias and temperature nodes)."""
    out = {site_name("transport", t.group): f"{t.kind}, table {t.table}, kernel {t.kernel}" for t in plan.transports}
    out.update({b.site.name: f"{b.kind}, carried as {b.carried}" for b in plan.biases})
    if plan.temperature is not None:
        out[plan.temperature.site.name] = f"{plan.temperature.table}, carried as {plan.temperature.carried}"
    return out


def graph_to_json(g) -> dict:
    def clean(v):
        if hasattr(v, "model_dump"):
            return to_source(v)
        if isinstance(v, tuple):
            return list(v)
        if isinstance(v, Ty):
            return v.to_json()
        return v

    plan = g.graph["plan"]
    return {
        "scheme": g.graph.get("scheme"),
        "backend": plan.backend,
        "plan": plan_to_json(plan),
        "nodes": [{"id": n, **{k: clean(v) for k, v in d.items() if k not in _PASS_STATE}}
                  for n, d in g.nodes(data=True)],
        "edges": [[a, b] for a, b in g.edges()],
    }


def _dot_string(s: object) -> str:
    """A DOT quoted-string body: backslashes and quotes escaped, newlines as DOT's centred ``\\n``."""
    return "\\n".join(part.replace("\\", "\\\\").replace('"', '\\"') for part in str(s).split("\n"))


def graph_to_dot(g) -> str:
    notes = _plan_notes(g.graph["plan"])
    lines = [f'digraph "{_dot_string(g.graph.get("scheme"))}" {{', "  rankdir=LR;",
             '  node [shape=box, fontname="monospace"];']
    for n, d in g.nodes(data=True):
        label = str(d.get("label", n)) + ("\n" + notes[n] if n in notes else "")
        shape = ' shape=ellipse' if d.get("op") == "input" else ""
        lines.append(f'  "{_dot_string(n)}" [label="{_dot_string(label)}"{shape}];')
    for a, b in g.edges():
        lines.append(f'  "{_dot_string(a)}" -> "{_dot_string(b)}";')
    lines.append(f'  label="backend: {_dot_string(g.graph["plan"].backend)}";')
    lines.append("}")
    return "\n".join(lines)


def graph_to_text(g) -> str:
    """The lowering plan, then the dataflow graph it was decided on."""
    out = plan_lines(g.graph["plan"]) + ["", f"dataflow graph of {g.graph.get('scheme')}:"]
    notes = _plan_notes(g.graph["plan"])
    for n in nx.topological_sort(g):
        d = g.nodes[n]
        preds = ", ".join(g.predecessors(n))
        line = f"  {n:28s} {d.get('label', '')}"
        if preds:
            line += f"   <- {preds}"
        out.append(line)
        if n in notes:
            out.append(f"  {'':28s}   = {notes[n]}")
    return "\n".join(out)


@click.command("graph")
@click.argument("file", type=str)
@click.option("--scheme", "scheme", default=None, help="Which scheme of the file (default: the one named like it).")
@click.option("-P", "params", multiple=True, help="Override a parameter: -P name=value.")
@click.option("--format", "fmt", type=click.Choice(["text", "dot", "json"]), default="text", show_default=True)
@click.option("--backend", type=click.Choice(BACKEND_CHOICES), default="auto", show_default=True)
@click.option("--no-grad", is_flag=True, help="Lower for inference (FlexAttention allowed on CPU).")
def graph(file, scheme, params, fmt, backend, no_grad):
    """Print the lowering plan (what the compiler decided and why) and the dataflow graph after the passes."""
    sch = load(file, params=raw_params(params) or None, scheme=scheme)
    if sch.layers is not None:
        _layered_graph(sch, fmt, Options(backend=backend, requires_grad=not no_grad))
        return
    g = optimize(lower(sch), Options(backend=backend, requires_grad=not no_grad))
    if fmt == "json":
        click.echo(json.dumps(graph_to_json(g), indent=2))
    elif fmt == "dot":
        click.echo(graph_to_dot(g))
    else:
        click.echo("\n".join([graph_to_text(g), *axis_frequency_lines(sch)]))


def axis_frequency_lines(sch) -> list[str]:
    """A multi-axis scheme's static rotation frequencies per group and axis: for each axis, the pairs that
    read it and their angular frequency along it (rad per position); [] for one axis."""
    per_group = axis_frequencies(sch)
    if not per_group:
        return []
    out = ["", "frequencies per axis (pair: rad per position along the axis; pairs that do not read it left out):"]
    for group, per_axis in per_group.items():
        for axis, freqs in per_axis.items():
            read = [f"{k}: {w:.4g}" for k, w in enumerate(freqs) if w != 0]
            out.append(f"  [{group}] {axis}: " + (", ".join(read) if read else "no pair"))
    return out


def _layered_graph(sch, fmt: str, options: Options) -> None:
    """A layers scheme: its layer map, then the graph of each part."""
    graphs = {name: optimize(lower(part), options) for name, part in sch.layers.parts.items()}
    if fmt == "json":
        count = sch.layers.count
        click.echo(json.dumps({"scheme": sch.name, "rules": [r.text for r in sch.layers.rules], "count": count,
                               "layers": list(sch.layers.assign(count)) if count else None,
                               "parts": {n: graph_to_json(g) for n, g in graphs.items()}}, indent=2))
    elif fmt == "dot":
        click.echo("\n".join(graph_to_dot(g) for g in graphs.values()))
    else:
        text = [f"layers of {sch.name}", *layer_map_lines(sch.layers)]
        for name, g in graphs.items():
            text += ["", f"part {name}:", graph_to_text(g)]
        click.echo("\n".join(text))


@click.command("compile")
@click.argument("file", type=str)
@click.option("-o", "--out", "out", required=True, type=str, callback=output_path, help="Output folder.")
@click.option("--scheme", "scheme", default=None, help="Which scheme of the file.")
@click.option("-P", "params", multiple=True, help="Override a parameter: -P name=value.")
@click.option("--backend", type=click.Choice(BACKEND_CHOICES), default="auto", show_default=True)
@click.option("--heads", type=click.IntRange(1, MAX_HEADS), default=None,
              help="Attention heads (default: the training preset's).")
@click.option("--head-dim", type=click.IntRange(2, MAX_HEAD_DIM), default=None,
              help="Head dimension (default: the training preset's).")
@click.option("--d-model", type=click.IntRange(2, MAX_D_MODEL), default=None,
              help="Model width (default: the training preset's): train.yaml's d_model, and the "
              "module's input width for schemes that read x.")
def compile_cmd(file, out, scheme, params, backend, heads, head_dim, d_model):
    """Write OUT/<scheme>.py (a standalone torch module) and OUT/train.yaml, OUT/eval.yaml."""
    p = raw_params(params)
    sch, cfg, d_model = _scheme_and_shapes(file, scheme, p, heads, head_dim, d_model)
    g = compile_graph(sch, backend=backend)
    if g.graph["backend"] == "reference" and backend != "reference":  # pragma: no cover - defensive
        raise CompileError("no fast backend can run this scheme")
    code = generate(sch, g.graph["plan"], d_model=d_model if sch.needs_x else None)
    model = cfg.model.model_copy(update={"n_heads": sch.heads, "head_dim": sch.head_dim, "d_model": d_model})
    train_cfg = cfg.model_copy(update={"scheme": _scheme_reference(file, out), "backend": backend, "model": model})
    eval_cfg = eval_config(sch, context=train_cfg.context)
    out_dir = ensure_dir(out)
    files = {
        out_dir / module_file_name(sch): code,
        out_dir / "train.yaml": _yaml_header(sch, "training") + train_cfg.to_yaml(),
        out_dir / "eval.yaml": _yaml_header(sch, "evaluation") + eval_cfg.to_yaml(),
    }
    for path, text in files.items():
        atomic_write_text(path, text)
    click.echo(f"compiled {sch.name} (backend {g.graph['backend']}) -> " + ", ".join(str(p) for p in files))


def _scheme_reference(file: str, out: str) -> str:
    """How train.yaml names the scheme so it works from any folder: a library name as given, a path
    relative to the YAML's folder (``pedsl train`` resolves it against that folder)."""
    if is_library_name(file):
        return file
    return Path(os.path.relpath(os.path.abspath(file), os.path.abspath(out))).as_posix()


def _yaml_header(sch, what: str) -> str:
    return (f"# {what} config for scheme {sch.name} (sha256 {sch.source_hash[:16]}), written by `pedsl compile`;\n"
            f"# read by `pedsl {'train' if what == 'training' else 'eval'}`.\n")

"""`pedsl import-hf`, `pedsl export-hf` and `pedsl export`: Hugging Face interop (:mod:`pedsl.hf`)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from pedsl.cli.options import output_path, raw_params
from pedsl.errors import UsageError
from pedsl.fsio import atomic_write_text
from pedsl.hf.convert import export_rope, import_config
from pedsl.hf.layered import export_layers
from pedsl.lang.api import load
from pedsl.lang.library import scheme_file
from pedsl.lang.parser import name_problem


@click.command("import-hf")
@click.argument("config", type=click.Path())
@click.option("-o", "--out", type=click.Path(), default=None, callback=output_path, help="Write the scheme here (default: stdout).")
@click.option("--name", default=None, help="Scheme name (default: MODELTYPE_ROPETYPE).")
def import_hf(config: str, out: str | None, name: str | None) -> None:
    """Write the .pe scheme of a model's positional encoding, from its config.json (or a folder holding one).

    The scheme is exact (head_dim, heads, theta, rope type and every parameter; the t, h, w sections of
    Qwen2-VL, Qwen2.5-VL and Qwen3-VL's M-RoPE); a config whose layers differ (Gemma 2 / 3, Llama 4 text,
    Qwen2 with sliding windows, GPT-OSS) is written as a layers scheme with a part per kind of layer. What
    pedsl cannot express exactly (other multimodal rotaries, ...) is an error naming the config field."""
    problem = None if name is None else name_problem(name)
    if name is not None and problem:
        shown = repr(name[:40]) + ("..." if len(name) > 40 else "")
        raise UsageError(f"--name {shown}: {problem}", hint="e.g. --name llama3_8b")
    text = import_config(Path(config), name=name)
    if out is None:
        click.echo(text, nl=False)
        return

    atomic_write_text(out, text)
    click.echo(f"wrote {out}", err=True)


@click.command("export-hf")
@click.argument("file", type=click.Path())
@click.option("--scheme", "scheme_name", default=None, help="Scheme name in the file.")
@click.option("-P", "params", multiple=True, help="Override a parameter: -P name=value.")
@click.option("--config", "as_config", is_flag=True,
              help="Print a config.json fragment (head_dim, num_attention_heads, rope_parameters, ...).")
def export_hf(file: str, scheme_name: str | None, params: tuple[str, ...], as_config: bool) -> None:
    """Print the Hugging Face rope_parameters JSON of a scheme (a .pe file or a library name) in HF's rope
    family; otherwise an error saying which part has no HF equivalent."""
    sch = load(scheme_file(file), params=raw_params(params) or None, scheme=scheme_name)
    if sch.layers is not None:  # the config fields of its layers (layer_types, sliding_window, ...)
        if sch.layers.count is None:
            raise UsageError(f"scheme '{sch.name}' gives its layers different schemes: export-hf needs the model's "
                             "layer count", hint="give -P layers=N")
        click.echo(json.dumps(export_layers(sch, sch.layers.count), indent=2))
        return
    out = export_rope(sch)
    click.echo(json.dumps(out if as_config else out["rope_parameters"], indent=2))


@click.command("export")
@click.argument("run", type=click.Path())
@click.option("--hf", "hf_dir", type=click.Path(), required=True,
              help="Write a LlamaForCausalLM folder here (config.json + model.safetensors).")
def export_cmd(run: str, hf_dir: str) -> None:
    """Export a trained run's latest checkpoint (model arch 'llama', a scheme in HF's RoPE family) as a
    Hugging Face LlamaForCausalLM folder."""
    from pedsl.hf.export import export_run

    path = export_run(run, hf_dir)
    click.echo(f"wrote {path}/config.json and {path}/model.safetensors")

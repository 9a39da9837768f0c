"""``pedsl profile DATA``: the mutual-information profile of data (see :mod:`pedsl.profile`)."""

from __future__ import annotations

import json
import math

import click

from pedsl.cli.executors import executor_options, given_executor, make_executor
from pedsl.cli.option_rules import refuse_given
from pedsl.cli.options import output_path
from pedsl.errors import UsageError
from pedsl.profile.run import run_profile, summary_text
from pedsl.study.common import finite_json, progress
from pedsl.torchenv import setup_torch


@click.command("profile")
@click.argument("data", metavar="DATA")
@click.option("--out", "out", type=click.Path(file_okay=False), callback=output_path, default="profile", show_default=True,
              help="Folder for profile.json and profile.png / .svg.")
@click.option("--suggest", "suggest", type=click.Path(dir_okay=False), default=None, metavar="FILE.pe",
              help="Write a scheme whose frequency grid is fitted to the measured width W.")
@click.option("--train-length", type=int, default=128, show_default=True,
              help="Training length the suggested grid must complete a cycle in.")
@click.option("--law-c", type=float, default=math.pi, show_default="pi",
              help="The constant c of the law theta* = c / W (pedsl compare --study frequency measures it).")
@click.option("--max-bytes", type=int, default=2_000_000, show_default=True, help="Bytes to read (or generate).")
@click.option("--max-distance", type=int, default=2048, show_default=True,
              help="Longest distance r, in symbols (capped at an eighth of the symbols).")
@click.option("--granularities", default=None,
              help="Comma list of symbol sizes in bytes and/or 'words' (default 1,2,4,words; 1,2,4 for synthetic data).")
@click.option("--vocab", type=int, default=256, show_default=True,
              help="Coarse symbols and words are lumped to this many codes (the rarest share one).")
@click.option("--width-fraction", type=float, default=0.1, show_default=True,
              help="W is the longest distance whose excess MI is at least this fraction of the peak.")
@click.option("--block-len", type=int, default=16, show_default=True, help="B of the synthetic 'blocks' data.")
@click.option("--block-offset", type=int, default=0, show_default=True, help="Offset of the 'blocks' data.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the null and of synthetic data.")
@click.option("--compare", "compare", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="Also train RoPE and the --suggest scheme on DATA with one budget (pedsl compare --quick) in DIR.")
@click.option("--steps", type=int, default=None, help="Training steps of --compare (default: 150, compare --quick).")
@click.option("--threads", type=int, default=0, help="torch CPU threads for --compare (0: the idle cores).")
@executor_options
@click.option("--json", "as_json", is_flag=True, help="Print the JSON summary instead of the table.")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
def profile(data, out, suggest, train_length, law_c, max_bytes, max_distance, granularities, vocab, width_fraction,
            block_len, block_offset, seed, compare, steps, threads, as_json, quiet, **executor):
    """Measure how far the dependencies in DATA reach, and whether they are self-similar.

    DATA is stdlib, a file or a folder (its training split, as `pedsl train --data` reads it), or a
    synthetic source: blocks (the frequency-study task, --block-len), iid, tree (self-similar) or
    offset (a fixed offset of 7). Reports the mutual information between bytes at distance r above
    a shuffled-pairing null, the dependency width W, the profile at coarser granularities (2- and
    4-byte symbols, words), a verdict on PI-style interpolation, and with --suggest a .pe scheme
    whose rotary grid is fitted to W.
    """
    if data != "blocks":
        refuse_given(["block_len", "block_offset"],
                     f"not used by DATA '{data}' (they shape the synthetic 'blocks' data)",
                     hint="drop them, or profile DATA blocks")
    if compare is None:
        refuse_given(["steps"], "not used without --compare (it is the training budget of --compare)",
                     hint="add --compare DIR, or drop it")
        if given_executor(executor):
            raise UsageError(f"{given_executor(executor)[0]}: not used without --compare (it says where the runs "
                             "of --compare train)", hint="add --compare DIR, or drop it")
    ex = None
    if compare is not None:
        ex = make_executor(executor, threads)
        if ex.serial:
            setup_torch(threads)
    res = run_profile(data, out=out, max_bytes=max_bytes, max_distance=max_distance, granularities=granularities,
                      vocab=vocab, width_fraction=width_fraction, seed=seed, block_len=block_len,
                      block_offset=block_offset, train_length=train_length, law_c=law_c, suggest=suggest,
                      compare=compare, compare_steps=steps, executor=ex, say=progress(quiet))
    if as_json:
        click.echo(json.dumps(finite_json(res), indent=1))
    else:
        click.echo(summary_text(res))
        click.echo(f"wrote {', '.join(str(click.format_filename(out)) + '/' + f for f in res.get('files', []))}")

"""The `pedsl` command line.

Each subcommand lives in its own module under ``pedsl.cli`` and is imported only
when it runs, so ``pedsl check`` never pays for importing torch.

Exit codes: 0 success, 1 an error in the input (a diagnostic was printed),
2 a usage error, 3 an internal error (a bug in pedsl: reported in one
paragraph, never as a traceback unless ``PEDSL_DEBUG=1``).
"""

from __future__ import annotations

import importlib
import importlib.util
import signal
import sys
import threading
from pathlib import Path

import click

from pedsl.envswitch import check_all, switch_or_default
from pedsl.errors import PedslError, UsageError
from pedsl.fsio import NotRegularFile

# name -> (module, attribute, one-line help). Keep sorted by workflow, not alphabet.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "check": ("pedsl.cli.frontend", "check", "Check .pe files: errors and lint warnings."),
    "fmt": ("pedsl.cli.frontend", "fmt", "Print .pe files in canonical form."),
    "show": ("pedsl.cli.frontend", "show", "Show a resolved scheme (after extends and parameters)."),
    "schema": ("pedsl.cli.frontend", "schema", "Print the JSON Schema of the IR."),
    "list": ("pedsl.cli.frontend", "list_schemes", "List the schemes in a folder."),
    "graph": ("pedsl.cli.compiler", "graph", "Print the lowering plan and the dataflow graph after the passes."),
    "compile": ("pedsl.cli.compiler", "compile_cmd", "Write a standalone PyTorch module and train/eval configs."),
    "train": ("pedsl.cli.train", "train", "Train a small language model with a scheme."),
    "eval": ("pedsl.cli.study", "eval_cmd", "Evaluate a trained run past its training length."),
    "analyze": ("pedsl.cli.study", "analyze", "Measure the papers' instruments on a trained run."),
    "compare": ("pedsl.cli.study", "compare", "Train, evaluate and report several schemes side by side."),
    "profile": ("pedsl.cli.profile", "profile", "Profile data: MI vs distance, dependency width, a fitted grid."),
    "diff": ("pedsl.cli.diff", "diff", "Show what two scheme variants change."),
    "explain": ("pedsl.cli.diff", "explain", "Summarise what one scheme does."),
    "import-hf": ("pedsl.cli.hf", "import_hf", "Write the .pe scheme of a Hugging Face model's rope config."),
    "export-hf": ("pedsl.cli.hf", "export_hf", "Print a scheme's Hugging Face rope_parameters."),
    "export": ("pedsl.cli.hf", "export_cmd", "Export a trained run as a Hugging Face Llama model."),
    "kernels": ("pedsl.cli.kernels", "kernels", "Build the C++ CPU kernels now and say which paths this machine uses."),
    "lsp": ("pedsl.cli.lsp", "lsp", "Run the .pe language server over stdio (for editors; the 'lsp' extra)."),
}


# Commands that never resolve a scheme's imports (so --allow-import-root has nothing to allow there).
READ_NO_IMPORTS = ("fmt", "schema", "list", "import-hf", "profile")


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name, (mod, _, _) in COMMANDS.items() if _module_exists(mod)]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        mod, attr, _ = COMMANDS[name]
        try:
            module = importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name == mod:
                return None
            raise
        return getattr(module, attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _module_exists(mod: str) -> bool:
    return importlib.util.find_spec(mod) is not None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pedsl")
@click.option("--allow-import-root", "import_roots", multiple=True, metavar="DIR",
              type=click.Path(exists=True, file_okay=False),
              help="Also allow `import` of .pe files under DIR (repeatable; see also PEDSL_IMPORT_PATH). "
                   "By default a scheme imports only from its own folder tree and the scheme library.")
def cli(import_roots: tuple[str, ...]) -> None:
    """pedsl: declare a positional-encoding scheme, compile it, train and compare."""
    command = click.get_current_context().invoked_subcommand
    if import_roots and command in READ_NO_IMPORTS:
        raise UsageError(f"--allow-import-root: not used by `pedsl {command}` (it resolves no imports)",
                         hint="drop it, or give it to a command that loads schemes (check, show, train, ...)")
    loaded = sys.modules.get("pedsl.lang.imports")
    if import_roots or (loaded is not None and loaded.EXTRA_IMPORT_ROOTS):  # each command sets its own
        from pedsl.lang import imports

        imports.EXTRA_IMPORT_ROOTS[:] = [Path(d) for d in import_roots]


def report(err: PedslError) -> None:
    click.echo(err.render(), err=True)


def _out_of_memory(err: BaseException) -> bool:
    """A failed allocation: Python's or numpy's MemoryError, or torch's allocator error (CPU or CUDA)."""
    if isinstance(err, MemoryError):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text.lower())


class Terminated(BaseException):
    """SIGTERM (``kill``, a scheduler stopping the job) raised where the program is, so that it unwinds
    as Ctrl-C does: a study stops its worker processes and shuts its Ray down instead of leaving them
    training as orphans; files being written stay as they were (pedsl writes them atomically)."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the CLI and map every failure to a diagnostic and exit code."""
    if threading.current_thread() is not threading.main_thread():  # signals go to the main thread only
        return _main(argv)
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        _main(argv)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main(argv: list[str] | None) -> None:
    for stream in (sys.stdout, sys.stderr):  # a file name that is not UTF-8 is printed escaped, never a crash
        if hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="backslashreplace")
            except (ValueError, OSError):  # pragma: no cover - a stream that cannot be reconfigured
                pass
    try:
        check_all()  # a switch set to neither on nor off is refused before any command reads it
        rv = cli.main(args=argv, prog_name="pedsl", standalone_mode=False)
    except PedslError as err:
        report(err)
        sys.exit(err.exit_code)
    except click.exceptions.Abort:
        click.echo("pedsl: aborted", err=True)
        sys.exit(130)
    except click.ClickException as err:
        err.show()
        sys.exit(err.exit_code if err.exit_code else 2)
    except KeyboardInterrupt:
        click.echo("pedsl: interrupted", err=True)
        sys.exit(130)
    except Terminated:
        click.echo("pedsl: terminated (SIGTERM)", err=True)
        sys.exit(128 + signal.SIGTERM)
    except BrokenPipeError:
        sys.exit(1)
    except NotRegularFile as err:  # a FIFO or device where a file belongs, met by a reader without its own message
        report(PedslError(f"cannot read '{err.filename}': {err.strerror}", code="E960",
                          hint="pedsl reads regular files only; give the path of a file"))
        sys.exit(1)
    except Exception as err:  # a bug in pedsl: one paragraph, no traceback
        if switch_or_default("PEDSL_DEBUG"):
            raise
        if _out_of_memory(err):  # sizes within the caps that this machine still cannot hold
            report(PedslError(f"out of memory: {str(err)[:300]}", code="E970",
                              hint="the sizes asked for (model, batch, context, --samples, --windows, lengths) "
                                   "are within pedsl's caps but too large for this machine's memory: lower them"))
            sys.exit(1)
        click.echo(
            f"pedsl: internal error: {type(err).__name__}: {err}. This is a bug in pedsl, "
            "not in your input; rerun with PEDSL_DEBUG=1 to see the traceback and report it.",
            err=True,
        )
        sys.exit(3)
    sys.exit(rv if isinstance(rv, int) else 0)

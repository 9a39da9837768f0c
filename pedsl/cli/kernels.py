"""``pedsl kernels``: build pedsl's C++ CPU kernels ahead of time, and say which paths this machine uses
(:mod:`pedsl.ops.cpu_kernels`)."""

from __future__ import annotations

import click

from pedsl.cli.option_rules import refuse_given

TIMEOUT_S = 300  # the default of --timeout: cpu_kernels.BUILD_TIMEOUT_S (the CLI module does not import torch)


@click.command("kernels")
@click.option("--check", is_flag=True,
              help="Build nothing: exit 0 when the kernels are built, verified and load; 1 otherwise, with why.")
@click.option("--rebuild", is_flag=True, help="Build from scratch, even over a verified or a failed build.")
@click.option("--timeout", "timeout", type=click.IntRange(1, 24 * 3600), default=TIMEOUT_S, show_default=True,
              metavar="SECONDS", help="Stop a build (or the wait for another process's) after this long.")
def kernels(check: bool, rebuild: bool, timeout: int) -> int:
    """Build pedsl's C++ CPU kernels (sliding windows, FIRE) now, once per machine, instead of on the
    first run that needs them; then report what this machine will use: the switch, the compiler,
    the build folder and flags, whether the kernels are built and load, and which kernel serves
    sliding windows and FIRE. Exit 1 where the kernels are on but cannot be built or loaded (the
    runs then take the torch paths: the same results, slower)."""
    if check:
        refuse_given(["rebuild", "timeout"], "not with --check, which builds nothing",
                     hint="drop --check to build, or drop the other option")
    from pedsl.ops import cpu_kernels

    st = cpu_kernels.prepare(build=not check, rebuild=rebuild, timeout=float(timeout))
    for label, text in report(st):
        click.echo(f"{label + ':':<17}{text}")
    ready = st.loaded or (not st.on and not check)
    if not ready:
        click.echo(f"pedsl kernels: not ready: {st.reason}", err=True)
    return 0 if ready else 1


def report(st) -> list[tuple[str, str]]:
    """The lines of the report: (label, text)."""
    from pedsl.compiler.kernel_support import kernel_decl
    from pedsl.ops import cpu_kernels

    # what each C++ kernel takes is its declaration's, not a list of this command's
    dtypes = " and ".join(kernel_decl("band").dtypes)
    fire_dtypes = " and ".join(kernel_decl("mlp").dtypes)
    lines = [("switch", f"{cpu_kernels.SWITCH} {'on' if st.on else 'off'}")]
    if st.on:
        lines += [("C++ compiler", st.compiler or "none found (CXX, else c++ on PATH)"),
                  ("ninja", st.ninja or "none found (pip install ninja)"),
                  ("build folder", str(st.folder)),
                  ("flags", " ".join(cpu_kernels.CFLAGS))]
        built = f"yes, now, in {st.build_seconds:.0f} s" if st.build_seconds is not None else "yes (verified)"
        lines.append(("built", built if st.built else f"no: {st.reason}"))
        lines.append(("loaded", f"yes: {', '.join(cpu_kernels.OPS)}" if st.loaded else "no"))
    if st.loaded:
        lines += [("sliding windows", f"the C++ band kernel ({dtypes} on CPU; the flash path otherwise)"),
                  ("FIRE", (f"the C++ MLP-bias kernel ({fire_dtypes} on CPU, u monotone and finite; "
                            "pedsl.ops.mlp_bias otherwise)")),
                  ("PaTH", "the C++ scan and row steps (pedsl.ops.path_kernel) on CPU; torch's otherwise")]
    else:
        lines += [("sliding windows", "the flash path (pedsl.ops.window_kernels): same results, slower"),
                  ("FIRE", "the torch kernel (pedsl.ops.mlp_bias): same results, slower"),
                  ("PaTH", "the torch loops (pedsl.ops.path_scan): same results, slower")]
    return lines

"""pedsl benchmarks: positional encodings against the attention floor and the usual hand-written code.

Run ``python -m benchmarks --help`` from the source tree; see benchmarks/README.md for how to
read the tables. Modules: :mod:`measure` (interleaved timing, peak memory), :mod:`baselines`
(hand-written code), :mod:`cases` (variants per scheme), :mod:`runner`, :mod:`report`,
:mod:`compile_time` (subprocess), :mod:`cli` (the command line).
"""

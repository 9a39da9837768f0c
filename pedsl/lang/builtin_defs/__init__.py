"""The builtin registry: one :class:`~pedsl.lang.builtin_defs.record.Builtin` record per builtin,
one module per family. Every consumer (checker, folder, the shared run-time walk with its numpy and
torch backends, codegen) reads a builtin's parts from its record; ``RECORDS`` lists them in the order
of the docs' tables."""

from __future__ import annotations

from pedsl.lang.builtin_defs import bias, channels, elementwise, grids, learned, sources, temperature, transports

RECORDS = {b.name: b for family in (elementwise, grids, bias, temperature, channels, transports, sources, learned)
           for b in family.RECORDS}

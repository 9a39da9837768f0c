"""The builtin registry: one :class:`~pedsl.lang.builtin_defs.record.Builtin` record per builtin,
one module per family. Every consumer (checker, folder, the shared run-time walk with its numpy and
torch backends, codegen) reads a converted builtin's parts from its record; ``RECORDS`` lists them."""

from __future__ import annotations

from pedsl.lang.builtin_defs import bias, channels, elementwise, grids, temperature

RECORDS = {b.name: b for b in (*elementwise.RECORDS, *grids.RECORDS, *bias.RECORDS, *temperature.RECORDS,
                                  *channels.RECORDS)}

"""Support for ``pedsl diff`` and ``pedsl explain`` (the edit script itself is :mod:`pedsl.diffing.edits`, exported as ``pedsl.diff``).

- :mod:`pedsl.diffing.edits`   typed edits (Insert/Remove/Move/Update/Keep) and the edit script;
- :mod:`pedsl.diffing.facts`   what a resolved scheme does, in numbers (shared by diff and explain);
- :mod:`pedsl.diffing.summary` "what this means": the facts of A and B side by side;
- :mod:`pedsl.diffing.numeric` score kernels vs distance on the same random inputs (+ plot);
- :mod:`pedsl.diffing.sample`  data-dependent pieces of a scheme at initialisation, in numpy;
- :mod:`pedsl.diffing.report`  text and JSON rendering, the JSON Schema and its checker.

Nothing here imports torch: ``import torch`` alone would take most of the two
seconds a diff may use, so even the numeric comparison of data-dependent schemes
is numpy (:mod:`pedsl.diffing.sample` follows the compiler's evaluator).
"""

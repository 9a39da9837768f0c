"""Support for ``pedsl diff`` and ``pedsl explain`` (the edit script itself is :mod:`pedsl.diffing.edits`, exported as ``pedsl.diff``).

- :mod:`pedsl.diffing.edits`   typed edits (Insert/Remove/Move/Update/Keep) and the edit script;
- :mod:`pedsl.diffing.facts`   what a resolved scheme does, in numbers (shared by diff and explain);
- :mod:`pedsl.diffing.summary` "what this means": the facts of A and B side by side;
- :mod:`pedsl.diffing.numeric` score kernels vs distance on the same random inputs (+ plot);
- :mod:`pedsl.diffing.report`  text and JSON rendering, the JSON Schema and its checker.

Nothing here imports torch at import time; only the numeric comparison of
data-dependent schemes does, when it runs.
"""
